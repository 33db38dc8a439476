"""Time and memory of one FFT ("resonance") mixer vs one causal attention layer (SDPA) across sequence lengths.

Each (layer, length) point runs in a fresh subprocess: it builds the layer and a [1, n, d] input, then runs
forward+backward once (warm-up) and `--reps` more times. Time is the median forward+backward CPU time of the
process (all threads; on a shared, loaded machine it is far steadier than wall time, which is printed too); memory
is the growth of the process's peak RSS during the warm-up step (what that step needed beyond the weights and
inputs). Attention uses `F.scaled_dot_product_attention(is_causal=True)`; on CPU that is PyTorch's flash kernel
(O(n) memory, O(n^2) time). `--math-attn` adds attention with materialized n x n scores (O(n^2) memory too).

    python tests/benchmarks/bench_fft.py                   # d=256, n = 512 .. 16384 (attention up to 8192), 1 thread
    python tests/benchmarks/bench_fft.py --lengths 1024 2048 4096 --attn-max 4096 --reps 2
"""
import argparse, json, resource, statistics, subprocess, sys, time


def _point(kind, n, d, heads, modes, reps, threads):
    import torch
    import torch.nn.functional as F
    from wf_nb.models import Attention, ResonanceMixer, rope_cos_sin
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randn(1, n, d, requires_grad=True)
    if kind == 'fft':
        layer = ResonanceMixer(d, n_modes=modes, max_len=32768)
        fn = lambda: layer(x)
    else:
        layer = Attention(d, heads, heads)
        cos, sin = rope_cos_sin(torch.arange(n)[None], d // heads, 10000.0)
        if kind == 'attn':
            fn = lambda: layer(x, cos, sin)
        else:   # materialized scores: softmax(QK^T + causal mask) V
            def fn():
                B, S, _ = x.shape
                q = layer.q_proj(x).view(B, S, heads, -1).transpose(1, 2)
                k = layer.k_proj(x).view(B, S, heads, -1).transpose(1, 2)
                v = layer.v_proj(x).view(B, S, heads, -1).transpose(1, 2)
                s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
                s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float('-inf'))
                return layer.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, S, -1))
    def step():
        layer.zero_grad(set_to_none=True); x.grad = None
        fn().square().mean().backward()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter(); step(); first = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base     # KiB on Linux
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time(); step()
        times.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
    return dict(kind=kind, n=n, wall=statistics.median(times), time=statistics.median(cpu), mem_mb=peak / 1024)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--lengths', type=int, nargs='+', default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument('--d', type=int, default=256)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--modes', type=int, default=64)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--threads', type=int, default=1, help='torch threads (1: CPU time is not inflated by spin-waiting on a busy machine)')
    ap.add_argument('--attn-max', type=int, default=8192, help='longest sequence for attention (O(n^2) time)')
    ap.add_argument('--math-attn', action='store_true', help='also time attention with materialized n x n scores')
    ap.add_argument('--math-max', type=int, default=4096, help='longest sequence for --math-attn (O(n^2) memory)')
    ap.add_argument('--point', help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.point:
        kind, n = a.point.split(':')
        print(json.dumps(_point(kind, int(n), a.d, a.heads, a.modes, a.reps, a.threads)))
        return
    kinds = ['fft', 'attn'] + (['math'] if a.math_attn else [])
    res = {}
    for n in a.lengths:
        for kind in kinds:
            if (kind == 'attn' and n > a.attn_max) or (kind == 'math' and n > a.math_max): continue
            cmd = [sys.executable, __file__, '--point', f'{kind}:{n}', '--d', str(a.d), '--heads', str(a.heads),
                   '--modes', str(a.modes), '--reps', str(a.reps), '--threads', str(a.threads)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode: print(f"{kind} n={n} failed:\n{r.stderr[-2000:]}", file=sys.stderr); continue
            res[kind, n] = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"  done {kind:4s} n={n:6d}: {res[kind, n]['time']:.3f}s {res[kind, n]['mem_mb']:.0f}MB", file=sys.stderr, flush=True)
    print(f"\nOne layer, forward+backward, batch 1, d={a.d}, {a.heads} heads, {a.modes} FFT modes, "
          f"{a.threads} threads; median of {a.reps}; time = process CPU seconds (wall in brackets); "
          f"memory = peak RSS growth of the step")
    hdr = "| n | FFT time s | FFT x per 2n | attn time s | attn x per 2n | attn/FFT time | FFT mem MB | attn mem MB |"
    if a.math_attn: hdr += " math-attn time s | math-attn mem MB |"
    print(hdr); print('|' + '---|' * (hdr.count('|') - 1))
    prev = {}
    for n in a.lengths:
        row, cells = {k: res.get((k, n)) for k in kinds}, [str(n)]
        def g(k, f, fmt):
            return format(row[k][f], fmt) if row.get(k) else '-'
        def growth(k):
            p = prev.get(k)
            return f"{row[k]['time'] / p['time']:.2f}" if row.get(k) and p and p['n'] * 2 == n else '-'
        def tw(k): return f"{row[k]['time']:.3f} ({row[k]['wall']:.3f})" if row.get(k) else '-'
        cells += [tw('fft'), growth('fft'), tw('attn'), growth('attn'),
                  f"{row['attn']['time'] / row['fft']['time']:.2f}" if row.get('attn') and row.get('fft') else '-',
                  g('fft', 'mem_mb', '.0f'), g('attn', 'mem_mb', '.0f')]
        if a.math_attn: cells += [tw('math'), g('math', 'mem_mb', '.0f')]
        print('| ' + ' | '.join(cells) + ' |')
        prev.update({k: v for k, v in row.items() if v})
    print("\nPer doubling of n: n log n predicts x2.0-2.2 (plus fixed costs), n^2 predicts x4.")


if __name__ == '__main__':
    main()
