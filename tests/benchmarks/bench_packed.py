"""Packed ternary SmolLM2 vs the full-precision model on CPU, side by side in one run.

Prints one table: size on disk and in memory, prefill tokens/s (a 128-token prompt, last-position logits as in
`generate`) and greedy generation (decode) tokens/s (KV cache; the N new tokens after the first over their time).
The ternary model is SmolLM2-135M-Instruct (Q4_1) converted to BitLinear (wf_nb.convert when available, else
every linear but lm_head swapped for a BitLinear): untrained, so this measures size and speed, not quality.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_packed.py [--prompt-len 128] [--new-tokens 32] [--reps 5] [--threads 1]

Packed rows: transformers' `generate` on the packed model (the reference, `load_packed(..., fast=False)`; what
`wf generate` ran before issue 32), the same without the cached int8 weights, and wf_nb's fast path
(`wf_nb.export.FastDecoder`, what `wf_nb.load(dir).generate` and `wf generate` run now).
"""
import argparse, copy, statistics, sys, tempfile, time
from pathlib import Path
import torch

from wf_nb.config import get_config
from wf_nb.assets import load_fp_model, load_tokenizer, materialize, shakespeare_files
from wf_nb.export import export_model, load_packed, quantized_linears, size_report
from wf_nb.quant import BitLinear
from bench_infer import TokenClock   # this folder is on sys.path when run as a script


def ternary_student(fp):
    try:
        from wf_nb.convert import convert
        return convert(copy.deepcopy(fp), get_config(model='smollm2_135m').quant), 'wf_nb.convert'
    except Exception as e:  # convert missing or failing: plain BitLinear swap (same linears, no SubLN)
        st = copy.deepcopy(fp)
        for n, lin in quantized_linears(st): st.set_submodule(n, BitLinear.from_linear(lin))
        return st, f'BitLinear swap ({type(e).__name__})'


def runtime_extra_bytes(model):
    "Bytes held outside the state dict: PackedBitLinear's cached unpacked int8 weights."
    from wf_nb.kernels import PackedBitLinear
    return sum(m._w_int8.numel() for m in model.modules() if isinstance(m, PackedBitLinear) and m._w_int8 is not None)


def state_bytes(model):
    seen, total = set(), 0
    for t in model.state_dict().values():
        k = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if k not in seen: seen.add(k); total += t.numel() * t.element_size()
    return total


def decode_tps(m, short, n):
    """Decode tokens/s of one greedy generation of n + 1 tokens: the n after the first over their time (prefill excluded;
    bench_infer.py's definition). wf_nb's fast path times itself (`generate_stats`), transformers' `generate` a streamer."""
    kw = dict(attention_mask=torch.ones_like(short), max_new_tokens=n + 1, min_new_tokens=n + 1, do_sample=False, pad_token_id=0)
    if m.__dict__.get('_fast_ok'):
        m.generate(short, **kw)
        st = m.generate_stats
        assert st['new_tokens'] == n + 1, st
        return (st['new_tokens'] - 1) / st['decode_s']
    clock = TokenClock()
    m.generate(short, streamer=clock, **kw)
    assert len(clock.t) == n + 2, len(clock.t)
    return n / (clock.t[-1] - clock.t[1])


@torch.no_grad()
def interleaved_speeds(models, ids, new_tokens, reps):
    """Prefill and decode tokens/s per model, measured round-robin (rep r of every model before rep r+1), so
    that load changes on a shared machine hit all models alike; medians over reps."""
    short = ids[:, :16]
    for m in models: m(ids[:, :8]); decode_tps(m, short, 2)            # warm up (int8 caches, allocator)
    pre, dec = {i: [] for i in range(len(models))}, {i: [] for i in range(len(models))}
    for r in range(reps):
        for i, m in enumerate(models):
            t0 = time.perf_counter(); m(ids, logits_to_keep=1); pre[i].append(ids.shape[1] / (time.perf_counter() - t0))  # as generate's prefill
            dec[i].append(decode_tps(m, short, new_tokens))
        print(f"[bench] rep {r + 1}/{reps} done", file=sys.stderr, flush=True)
    return [(statistics.median(pre[i]), statistics.median(dec[i])) for i in range(len(models))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--prompt-len', type=int, default=128)
    ap.add_argument('--new-tokens', type=int, default=32)
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--threads', type=int, default=0)
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    mc = get_config(model='smollm2_135m').model
    tok = load_tokenizer(mc)
    text = shakespeare_files()[0].read_text()[5000:20000]
    ids = tok(text, return_tensors='pt').input_ids[:, :a.prompt_len]
    fp = load_fp_model(mc)
    fp_bf16 = copy.deepcopy(fp).to(torch.bfloat16)
    st, how = ternary_student(fp)
    tmp = Path(tempfile.mkdtemp())
    rep = export_model(st, 'hf-bitnet', tmp / 'packed', tokenizer=tok, dtype=torch.bfloat16)
    packed = load_packed(tmp / 'packed', dtype=torch.float32)  # fp32 activations / embeddings at run time; FastDecoder generate
    reference = load_packed(tmp / 'packed', dtype=torch.float32, fast=False)   # transformers' generate (before issue 32)
    nocache = load_packed(tmp / 'packed', dtype=torch.float32, fast=False)
    from wf_nb.kernels import PackedBitLinear
    for m in nocache.modules():
        if isinstance(m, PackedBitLinear): m.cache = False
    fp_dir = Path(materialize(mc))
    fp_file = sum(f.stat().st_size for f in fp_dir.glob('*.safetensors'))
    n_params = sum(p.numel() for p in fp.parameters())
    cands = [('FP fp32', fp, fp_file), ('FP bf16', fp_bf16, 2 * n_params),
             (f"packed ({rep['format']}), transformers", reference, rep['file_bytes']),
             ("packed, no int8 cache", nocache, rep['file_bytes']),
             (f"packed, wf_nb fast path", packed, rep['file_bytes'])]
    with torch.no_grad():   # the fast path must generate what the reference generates
        g = lambda m: m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0)
        same = torch.equal(g(packed), g(reference))
    speeds = interleaved_speeds([m for _, m, _ in cands], ids, a.new_tokens, a.reps)
    rows = [(name, disk, state_bytes(m), state_bytes(m) + runtime_extra_bytes(m), pre, dec)
            for (name, m, disk), (pre, dec) in zip(cands, speeds)]
    print(f"\nSmolLM2-135M-Instruct (Q4_1), ternary via {how}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; prompt {ids.shape[1]} tokens, {a.new_tokens} new tokens, "
          f"median of {a.reps}, models interleaved")
    print(f"packed: {rep['bits_per_linear_weight']:.3f} bits per linear weight, "
          f"{rep['linear_weights']:,} linear weights, {rep['other_params']:,} other params "
          f"(embeddings bf16 on disk; FP bf16 disk size = 2 bytes/param, computed); fast path greedy tokens = reference: {same}")
    hdr = (f"| {'model':<28} | {'disk MiB':>9} | {'weights MiB':>11} | {'runtime MiB':>11} | {'prefill tok/s':>13} "
           f"| {'decode tok/s':>12} |")
    print(hdr); print('|' + '|'.join('-' * (len(c)) for c in hdr.split('|')[1:-1]) + '|')
    base = rows[0]
    for name, disk, mem, rt, pre, dec in rows:
        print(f"| {name:<28} | {disk/2**20:9.1f} | {mem/2**20:11.1f} | {rt/2**20:11.1f} | {pre:8.0f} {pre/base[4]:3.1f}x | "
              f"{dec:7.1f} {dec/base[5]:3.1f}x |")
    ref_row, fast_row = rows[2], rows[4]
    print(f"before -> after (transformers generate -> wf_nb fast path): prefill {ref_row[4]:.0f} -> {fast_row[4]:.0f} tok/s "
          f"({fast_row[4] / ref_row[4]:.2f}x), decode {ref_row[5]:.1f} -> {fast_row[5]:.1f} tok/s ({fast_row[5] / ref_row[5]:.2f}x)")
    print("weights MiB = the state dict in memory (fp32 embeddings for the packed rows); runtime MiB adds the cached "
          "unpacked int8 weights (1 byte/weight) that the CPU int8 matmul uses")


if __name__ == '__main__':
    main()
