"""The forward GEMM of a BitLinear on this CPU: bf16 against the int8 kernels torch offers, at SmolLM2-135M's shapes.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_int8_gemm.py [--tokens 512] [--repeats 30]

For each of SmolLM2's linear shapes (`[M, K] @ [K, N]`, M = tokens of one micro-batch) it prints the median ms of
- `bf16`: `torch.mm` of bf16 tensors (what the FP model's forward runs under autocast; oneDNN, AMX where the CPU has it);
- `_int_mm`: `torch._int_mm`, int8 x int8 -> int32 (what wf_nb's integer forward runs on CPU);
- `qlinear`: oneDNN's quantized linear (`torch.ops.onednn.qlinear_pointwise`, signed int8 activations, fp32 output,
  unit scales: the exact int32 sums) with its weight prepacked (x86 builds only);
- `prepack`: `torch.ops.onednn.qlinear_prepack` of one ternary weight, which must be redone whenever the weight changes.

Every kernel is checked exact against `_int_mm` first. The last line says how many micro-batches per optimizer step
the prepacked kernel needs before its per-step prepack pays for itself (for frozen weights it always does).
"""
import argparse, statistics, time
import torch

SHAPES = {'q_proj, o_proj': (576, 576), 'k_proj, v_proj': (576, 192), 'gate_proj, up_proj': (576, 1536), 'down_proj': (1536, 576)}
PER_LAYER = {'q_proj, o_proj': 2, 'k_proj, v_proj': 2, 'gate_proj, up_proj': 2, 'down_proj': 1}
LAYERS = 30

def median_ms(fn, repeats):
    for _ in range(3): fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3

def onednn_ok() -> bool:
    try: return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, 'qlinear_pointwise')
    except Exception: return False

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tokens', type=int, default=512, help='M: tokens in one micro-batch (batch 4 x 128 by default)')
    ap.add_argument('--repeats', type=int, default=30)
    a = ap.parse_args()
    M, g = a.tokens, torch.Generator().manual_seed(0)
    qlinear = onednn_ok()
    print(f"M = {M} tokens, {torch.get_num_threads()} thread(s), torch {torch.__version__}, oneDNN qlinear: {'yes' if qlinear else 'no'}\n")
    print("| layers (K x N) | bf16 ms | _int_mm ms | qlinear ms | qlinear vs bf16 | prepack ms |\n|---|---|---|---|---|---|")
    saved_per_micro = prepack_per_step = 0.0
    for name, (K, N) in SHAPES.items():
        xb, wb = torch.randn(M, K, generator=g).bfloat16(), torch.randn(N, K, generator=g).bfloat16()
        xq = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
        wq = torch.randint(-1, 2, (N, K), generator=g, dtype=torch.int8)
        wq_t = wq.t().contiguous()
        exact = torch._int_mm(xq, wq_t)
        t_bf16 = median_ms(lambda: xb @ wb.t(), a.repeats)
        t_int = median_ms(lambda: torch._int_mm(xq, wq_t), a.repeats)
        cells = ['n/a'] * 3
        if qlinear:
            ones, zeros = torch.ones(N), torch.zeros(N, dtype=torch.long)
            packed = torch.ops.onednn.qlinear_prepack(wq, [M, K])
            run = lambda: torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, packed, ones, zeros, None, 1.0, 0, torch.float32, 'none', [], '')
            assert torch.equal(run(), exact.float()), f"{name}: qlinear is not exact"
            t_q = median_ms(run, a.repeats)
            t_pack = median_ms(lambda: torch.ops.onednn.qlinear_prepack(wq, [M, K]), max(5, a.repeats // 3))
            cells = [f"{t_q:.2f}", f"{t_bf16 / t_q:.2f}x", f"{t_pack:.2f}"]
            saved_per_micro += LAYERS * PER_LAYER[name] * (t_bf16 - t_q)
            prepack_per_step += LAYERS * PER_LAYER[name] * t_pack
        print(f"| {name} ({K} x {N}) | {t_bf16:.2f} | {t_int:.2f} | " + " | ".join(cells) + " |")
    if qlinear:
        print(f"\nWhole model ({LAYERS} layers): the prepacked int8 forward saves {saved_per_micro:.0f} ms per micro-batch over bf16; "
              f"prepacking every weight costs {prepack_per_step:.0f} ms per optimizer step.")
        if saved_per_micro > 0:
            print(f"Training breaks even at {prepack_per_step / saved_per_micro:.1f} micro-batches per optimizer step; "
                  "frozen weights (evaluation, generation) prepack once.")

if __name__ == '__main__':
    main()
