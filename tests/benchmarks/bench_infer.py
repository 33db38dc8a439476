"""Running a ternary SmolLM2 student, side by side on this machine: file size, peak RSS, prefill and decode tokens/s,
perplexity on held-out text, at 1 and 2 threads.

Rows: the FP model in transformers (fp32, bf16); the student in wf_nb (`wf_nb.load(packed_dir).generate`), in stock
transformers (the packed hf-bitnet export), and in llama.cpp (npm node-llama-cpp 3.21.1's prebuilt CPU build, via
tests/llamacpp/llamacpp.mjs): our ternary GGUF (default: TQ1_0, hidden width padded 576 -> 768, Q5_0 embedding; the
fast TQ2_0 + Q8_0 one; Q2_0 unpadded; `--grid`: every ternary type x embedding q8_0/q5_1/q5_0/q4_0), and the FP model's
F16 / Q8_0 / Q4_0 GGUFs written by `wf_nb.gguf_export.write_fp_gguf`. `--grid` also adds wf_nb rows whose embedding went
through each GGUF embedding type and back: their perplexity is what llama.cpp should give on the same file.
wf_nb rows: the default (`wf_nb.cpu_kernels`: 2-bit products, one C++ call a layer per token) and torch's int8 path
(`WF_NB_NO_CPU_EXT=1`), and the opt-in int8 lm_head (`wf_nb.load(dir, head='q8')`); their perplexity is the decode path's (FastDecoder fed one token at a time), and with
--rounds > 1 each wf_nb row's decode speed is also given as a ratio to each llama.cpp row, per round (then the median).
Every row runs in its own process (its own peak RSS); greedy decoding of --new tokens after a --prompt-token prompt;
speeds are the median (or `--stat best`) of --repeat runs.

    python tests/benchmarks/bench_infer.py --student CKPT_DIR [--threads 1 2] [--grid] [--out table.md]

CKPT_DIR: a wf_nb student checkpoint (e.g. `wf train ... --out DIR`); without it, the untrained Stage-1 conversion
is used (fine for speed and size, not for perplexity).
"""
import argparse, json, math, os, re, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = ROOT / 'tests' / 'llamacpp' / 'llamacpp.mjs'
REPEAT = int(os.environ.get('WF_BENCH_REPEAT', 3))   # speeds: the median (or best) of this many runs
STAT = os.environ.get('WF_BENCH_STAT', 'median')
GRID = [(t, e) for t in ('tq2_0', 'tq1_0', 'q2_0') for e in ('q8_0', 'q5_1', 'q5_0', 'q4_0')]


def pick(xs):
    import statistics
    return max(xs) if STAT == 'best' else statistics.median(xs)


def held_out_ids(tok, n):
    "Held-out prose: the end of the last Shakespeare file (Stage 2's data loader reads files from the start)."
    from wf_nb.assets import shakespeare_files
    return tok(shakespeare_files()[-1].read_text()[-60000:]).input_ids[:n]


def prepare(student, work: Path, tok, grid: bool = False):
    "Write every file the rows read (once); returns {row name: path}."
    import torch
    from wf_nb.assets import load_fp_model
    from wf_nb.config import get_config
    from wf_nb.export import export_model
    from wf_nb.gguf_export import write_fp_gguf
    work.mkdir(parents=True, exist_ok=True)
    mc = get_config(model='smollm2_135m').model
    fp = load_fp_model(mc)
    if student is None:
        from wf_nb.convert import convert, save_model
        student = work / 'stage1'
        if not student.exists(): save_model(convert(fp, get_config().quant), tok, student)
    paths = dict(fp=work / 'fp')
    if not paths['fp'].exists(): fp.save_pretrained(paths['fp']); tok.save_pretrained(paths['fp'])
    for fmt in ('wf-packed', 'hf-bitnet'):
        paths[fmt] = work / fmt
        if not paths[fmt].exists(): export_model(student, fmt, paths[fmt], dtype=torch.bfloat16)
    for tt, et in [('auto', 'q5_0'), ('tq2_0', 'q8_0'), ('q2_0', 'q5_0')] + (GRID if grid else []):
        p = paths[f'gguf-{tt}-{et}'] = work / f'student-{tt}-{et}.gguf'
        if not p.exists(): export_model(student, 'gguf', p, tokenizer=tok, ternary_type=tt, embed_type=et)
    for wt in ('f16', 'q8_0', 'q4_0'):
        paths[f'fp-{wt}'] = work / f'fp-{wt}.gguf'
        if not paths[f'fp-{wt}'].exists(): write_fp_gguf(fp, paths[f'fp-{wt}'], tok, wt)
    return paths


def size_mib(p: Path) -> float:
    return (p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob('*.safetensors'))) / 2**20


class TokenClock:
    "A `generate` streamer that only timestamps: `put` #0 is the prompt (before the prefill), then one `put` per new token."
    def __init__(self): self.t = []
    def put(self, value): self.t.append(time.perf_counter())
    def end(self): pass


def timed_generate(model, x, new, fast):
    """(prefill tok/s, decode tok/s) of one greedy generation of exactly `new` tokens (`min_new_tokens`: no early EOS).
    Both sides use llama_row's definition: prefill = prompt tokens / time to the first new token; decode = the
    `new - 1` tokens after it / their time (prefill excluded). wf_nb's fast path times itself (`generate_stats`: the
    same two spans); transformers' `generate` is timed by a streamer."""
    import torch
    kw = dict(do_sample=False, attention_mask=torch.ones_like(x), pad_token_id=0, max_new_tokens=new, min_new_tokens=new)
    if fast:
        out = model.generate(x, **kw)
        st = model.generate_stats
        assert st['new_tokens'] == new == out.shape[1] - x.shape[1], st
        return st['prompt_tokens'] / st['prefill_s'], (st['new_tokens'] - 1) / st['decode_s']
    clock = TokenClock()
    out = model.generate(x, streamer=clock, **kw)
    assert out.shape[1] - x.shape[1] == new == len(clock.t) - 1, (out.shape, len(clock.t))
    return x.shape[1] / (clock.t[1] - clock.t[0]), (new - 1) / (clock.t[-1] - clock.t[1])


def torch_row(kind, path, threads, ids, prompt, new):
    "Prefill/decode tokens/s and perplexity of a transformers-style model (runs in this process)."
    if kind == 'wf_nb-noext': os.environ['WF_NB_NO_CPU_EXT'] = '1'   # before wf_nb is imported: torch's int8 path
    import torch
    torch.set_num_threads(threads)
    if kind.startswith('fp'):
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if kind == 'fp-bf16' else torch.float32).eval()
    elif kind.startswith('wf_nb'):
        import wf_nb
        model = wf_nb.load(path, head='q8' if kind == 'wf_nb-q8' else 'exact').eval()   # q8: the opt-in int8 lm_head (not exact)
        if ':' in kind: model = model.float(); round_embedding(model, kind.split(':')[1])   # fp32: no bf16 rounding on top
    else:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(path).eval()
    x = torch.tensor([ids[:prompt]])
    fast = kind.startswith('wf_nb')   # wf_nb.load routes one greedy sequence through FastDecoder
    with torch.inference_mode():
        timed_generate(model, x, min(new, 4), fast)    # warm-up (allocator, caches), untimed; llama_row does the same
        pres, decs = zip(*[timed_generate(model, x, new, fast) for _ in range(REPEAT)])   # the median (or best) of REPEAT
        if fast:   # the decode path itself: FastDecoder one token at a time, as generation runs it
            dec = model._fast_decoder
            dec._alloc(len(ids))
            logits = torch.stack([dec.forward(torch.tensor(ids[j:j + 1]), j) for j in range(len(ids) - 1)])
        else: logits = model(torch.tensor([ids])).logits[0, :-1]
        lp = torch.log_softmax(logits.float(), -1)
        nll = -lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean().item()
    return dict(prefill_tps=pick(pres), decode_tps=pick(decs), ppl=math.exp(nll), rss_mib=vm_hwm_mib())


def round_embedding(model, embed_type):
    "The (tied) embedding through GGUF type `embed_type` and back, as llama.cpp reads it."
    import gguf, torch
    from gguf.quants import quantize, dequantize
    w = model.model.embed_tokens.weight
    qt = getattr(gguf.GGMLQuantizationType, embed_type.upper())
    a = dequantize(quantize(w.detach().float().numpy(), qt), qt)
    with torch.no_grad(): w.copy_(torch.from_numpy(a.reshape(w.shape)))


def vm_hwm_mib() -> float:
    "This process's peak RSS (VmHWM: reset at exec, unlike getrusage's ru_maxrss, which a child inherits from its parent)."
    return int(re.search(r'VmHWM:\s+(\d+) kB', Path('/proc/self/status').read_text()).group(1)) / 1024


def llama_row(path, threads, ids, prompt, new):
    "The same numbers from llama.cpp (a node process)."
    req = dict(model=str(path), threads=threads, ctx=max(1024, len(ids)),   # the whole text in one context, as torch_row
               ops=[dict(op='bench', tokens=ids[:prompt], n=min(new, 4))]                 # warm-up, untimed (as torch_row)
               + [dict(op='bench', tokens=ids[:prompt], n=new)] * REPEAT + [dict(op='logprobs', tokens=ids)])
    r = subprocess.run(['node', str(NODE_SCRIPT)], input=json.dumps(req), capture_output=True, text=True, timeout=1800)
    if r.returncode: raise SystemExit(f"llama.cpp failed on {path}: {r.stderr[-2000:]}")
    out = json.loads(r.stdout)
    bs, lp = out['results'][1:-1], out['results'][-1]['logprobs']
    assert all(b['generated'] == new for b in bs), bs   # exactly `new` tokens: the bench op does not stop at EOS
    return dict(prefill_tps=pick([b['prefill_tps'] for b in bs]), decode_tps=pick([b['decode_tps'] for b in bs]),
                ppl=math.exp(-sum(lp) / len(lp)), rss_mib=out['max_rss_mb'])


ROWS = [  # (row label, runtime, key of the file it reads, how)
    ('FP SmolLM2, fp32', 'transformers', 'fp', 'fp-fp32'), ('FP SmolLM2, bf16', 'transformers', 'fp', 'fp-bf16'),
    ('ternary student, wf-packed (bf16)', 'wf_nb', 'wf-packed', 'wf_nb'),
    ('ternary student, wf-packed (bf16), torch int8 path (WF_NB_NO_CPU_EXT=1)', 'wf_nb', 'wf-packed', 'wf_nb-noext'),
    ('ternary student, wf-packed (bf16), int8 lm_head (head=q8)', 'wf_nb', 'wf-packed', 'wf_nb-q8'),
    ('ternary student, hf-bitnet (bf16)', 'transformers', 'hf-bitnet', 'hf'),
    ('ternary student GGUF, default: TQ1_0 (padded 768) + Q5_0 emb.', 'llama.cpp', 'gguf-auto-q5_0', 'llama'),
    ('ternary student GGUF, TQ2_0 (padded 768) + Q8_0 emb.', 'llama.cpp', 'gguf-tq2_0-q8_0', 'llama'),
    ('ternary student GGUF, Q2_0 + Q5_0 emb.', 'llama.cpp', 'gguf-q2_0-q5_0', 'llama'),
    ('FP SmolLM2 GGUF, F16', 'llama.cpp', 'fp-f16', 'llama'), ('FP SmolLM2 GGUF, Q8_0', 'llama.cpp', 'fp-q8_0', 'llama'),
    ('FP SmolLM2 GGUF, Q4_0 (Q8_0 emb.)', 'llama.cpp', 'fp-q4_0', 'llama')]
GRID_ROWS = ([(f'ternary student, wf-packed, embedding through {e.upper()}', 'wf_nb', 'wf-packed', f'wf_nb:{e}') for e in ('q8_0', 'q5_1', 'q5_0', 'q4_0')]
             + [(f'ternary student GGUF, {t.upper()} + {e.upper()} emb. (grid)', 'llama.cpp', f'gguf-{t}-{e}', 'llama') for t, e in GRID])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--student', type=Path, help='wf_nb student checkpoint dir (default: untrained Stage-1 conversion)')
    ap.add_argument('--work', type=Path, default=Path('/tmp/wf_bench_infer'), help='exports are written here (reused)')
    ap.add_argument('--threads', type=int, nargs='+', default=[1, 2]); ap.add_argument('--prompt', type=int, default=128)
    ap.add_argument('--new', type=int, default=64, help='generated tokens (hf-bitnet rows: 8, it is ~100x slower)')
    ap.add_argument('--ppl-tokens', type=int, default=256); ap.add_argument('--out', type=Path)
    ap.add_argument('--repeat', type=int, default=3, help='speeds are the median (or best) of this many runs')
    ap.add_argument('--stat', choices=['median', 'best'], default='median')
    ap.add_argument('--grid', action='store_true', help='also every ternary type x embedding type, and wf_nb with each rounded embedding')
    ap.add_argument('--only', nargs='+', help='run only the rows whose label contains one of these substrings')
    ap.add_argument('--rounds', type=int, default=1, help='run every row this many times, interleaved (round r of every row '
                    'before round r+1: load changes on a shared machine hit all rows alike); the table gives the medians')
    ap.add_argument('--row', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.row:   # one row in this process (its own peak RSS: no tokenizer or FP model loaded here): print its JSON
        label, rt, key, how = next(r for r in ROWS + GRID_ROWS if r[0] == a.row)
        path, t, ids = json.loads(os.environ['WF_BENCH_PATHS'])[key], a.threads[0], json.loads(os.environ['WF_BENCH_IDS'])
        new = 8 if how == 'hf' else a.new
        res = llama_row(path, t, ids, a.prompt, new) if how == 'llama' else torch_row(how, path, t, ids, a.prompt, new)
        print(json.dumps(res)); return
    from wf_nb.assets import load_tokenizer
    from wf_nb.config import get_config
    tok = load_tokenizer(get_config(model='smollm2_135m').model)
    ids = held_out_ids(tok, a.ppl_tokens)
    paths = {k: str(v) for k, v in prepare(a.student, a.work, tok, a.grid).items()}
    rows = [(t, *r) for t in a.threads for r in ROWS + (GRID_ROWS if a.grid else [])
            if not a.only or any(o in r[0] for o in a.only)]
    res = {}
    for rnd in range(a.rounds):
        for t, label, rt, key, how in rows:
            r = subprocess.run([sys.executable, __file__, '--row', label, '--threads', str(t), '--prompt', str(a.prompt), '--new', str(a.new),
                                '--ppl-tokens', str(a.ppl_tokens)], capture_output=True, text=True,
                               env={**os.environ, 'WF_BENCH_PATHS': json.dumps(paths), 'WF_BENCH_IDS': json.dumps(ids), 'OMP_NUM_THREADS': str(t),
                                    'WF_BENCH_REPEAT': str(a.repeat), 'WF_BENCH_STAT': a.stat})
            if r.returncode: print(f"{label}: failed\n{r.stderr[-2000:]}", file=sys.stderr); continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            res.setdefault((t, label), []).append(d)
            print(f"round {rnd + 1}/{a.rounds}: {label}, {t} thread(s): prefill {d['prefill_tps']:.1f}, decode {d['decode_tps']:.1f} tok/s, "
                  f"perplexity {d['ppl']:.2f}", flush=True)
    lines = [f"| runtime | model | threads | file MiB | peak RSS MiB | prefill tok/s | decode tok/s | perplexity |",
             "|---|---|---|---|---|---|---|---|"]
    for t, label, rt, key, how in rows:
        if (t, label) not in res: continue
        med = lambda k: statistics.median(d[k] for d in res[(t, label)])
        lines.append(f"| {rt} | {label} | {t} | {size_mib(Path(paths[key])):.1f} | {med('rss_mib'):.0f} | {med('prefill_tps'):.1f} | "
                     f"{med('decode_tps'):.1f} | {med('ppl'):.2f} |")
    table = '\n'.join(lines)
    print(f"\nprompt {a.prompt} tokens, {a.new} generated (hf-bitnet: 8), {a.stat} of {a.repeat} runs in each row's process, median over {a.rounds} interleaved round(s); perplexity on {len(ids)} held-out tokens\n{table}")
    ratios = [f"| {w} | {l} | {t} | {statistics.median(x['decode_tps'] / y['decode_tps'] for x, y in zip(res[(t, w)], res[(t, l)])):.2f} |"
              for t, w, rw, *_ in rows if rw == 'wf_nb' and (t, w) in res for t2, l, rl, *_ in rows
              if rl == 'llama.cpp' and t2 == t and (t, l) in res]
    if ratios and a.rounds > 1:
        table += '\n\n| wf_nb row | llama.cpp row | threads | decode speed ratio (median of per-round ratios) |\n|---|---|---|---|\n' + '\n'.join(ratios)
        print('\n'.join(table.split('\n\n')[1:]))
    if a.out: a.out.write_text(table + '\n')


if __name__ == '__main__':
    main()
