"""Quality at equal student tokens: the wf_nb ternary pipeline against naive ternary QAT, PTQ and the FP teacher.

The issue-12 protocol, side by side in one script. SmolLM2-135M-Instruct (Q4_1) is made ternary with 153,600 student
tokens of Shakespeare (300 steps x 4 x 128, bf16 autocast; teacher forwards do not count) and every arm is scored on
held-out text that no arm trains on:

  shakespeare   the documents wf_nb's data split holds out of the Shakespeare corpus (whole plays)
  bible_kjv     three books of the King James Bible (Debian `bible-kjv`; skipped with a note when absent)
  licenses      the GPL-3, Apache-2.0, MPL-2.0 and LGPL-2.1 texts of /usr/share/common-licenses (legal English)

Arms (each in its own process, `--parallel` at a time):
  fp            the FP teacher, untrained
  ptq           naive ternary PTQ: transformers' AutoBitLinear (online), no training
  naive_qat     naive ternary QAT: AutoBitLinear, no SubLN, no distillation, a plain AdamW loop (lr 1e-4, 20 warm-up
                steps, then constant) on the same Shakespeare batches as wf_nb
  wf_pipeline   `wf pipeline -m smollm2_135m --tokens 153600 training.precision=bf16`: wf_nb's defaults, Stage 1 ->
                1.9 -> 2 (add --wf-args to try other settings, e.g. --wf-args "--split 0.25 training.lr=1e-3")

    python tests/benchmarks/bench_quality.py [--tokens 153600] [--arms fp,ptq,naive_qat,wf_pipeline] [--parallel 2]
                                             [--out bench_quality_out] [--eval-tokens 16000]
    python tests/benchmarks/bench_quality.py --grad-scale     # gradient norm of each loss term (a minute)

Prints one row per arm: perplexity per held-out source, the ratio to naive QAT, wall time and student tokens/s. Runs
resume by fingerprint (the wf arm) and each finished arm's JSON is reused, so an interrupted benchmark continues.
This is a benchmark (about an hour on 2 CPU cores), not a test."""
import argparse, json, math, os, shlex, subprocess, sys, time
from pathlib import Path

B, S = 4, 128
ARMS = ['fp', 'ptq', 'naive_qat', 'wf_pipeline']

def heldout() -> dict:
    "Held-out texts per source: {name: [text, ...]}; sources that are not installed are left out."
    from wf_nb.data import bible_kjv_files, DataError
    out = {}
    lic = [Path('/usr/share/common-licenses', n) for n in ('GPL-3', 'Apache-2.0', 'MPL-2.0', 'LGPL-2.1')]
    if all(p.exists() for p in lic): out['licenses'] = [p.read_text() for p in lic]
    try:
        bib = bible_kjv_files(); out['bible_kjv'] = [bib[i].read_text() for i in (19, 42, 44)]   # Psalms, Luke, Acts
    except DataError as e: print(f"bible_kjv skipped: {e}", file=sys.stderr)
    return out

def cfg_for(precision='bf16', seed=42):
    from wf_nb.config import get_config
    return get_config([f'training.batch_size={B}', f'data.seq_len={S}', f'training.seed={seed}', f'training.precision={precision}'],
                      stage='2', model='smollm2_135m')

def evaluate(model, max_tokens: int) -> dict:
    "Perplexity per held-out source (bf16 autocast, as trained), and on the Shakespeare documents the data split holds out."
    import torch
    from wf_nb.assets import load_tokenizer
    from wf_nb.stream import get_data
    from wf_nb.losses import lm_loss
    from wf_nb.evaluate import perplexity
    cfg = cfg_for(); tok = load_tokenizer(cfg.model)
    model.eval(); res = {}
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        for name, texts in heldout().items():
            res[name] = perplexity(model, texts, tok, seq_len=256, max_tokens=max_tokens)['perplexity']
        nll, n = 0.0, 0
        for b in get_data(cfg, tok, 'val', verbose=False):
            r = lm_loss(model(input_ids=b['input_ids'], use_cache=False, **{k: b[k] for k in ('attention_mask',) if k in b}).logits, b['labels'])
            nll += float(r['loss']) * int(r['n_tokens']); n += int(r['n_tokens'])
            if n >= max_tokens: break
        res['shakespeare'] = math.exp(nll / n)
    return res

from bench_train import hf_bitnet   # transformers' AutoBitLinear (online) in every linear but lm_head: the naive QAT layer

def naive_qat(model, tokens: int, lr=1e-4, warmup=20):
    "A plain AdamW loop on the same Shakespeare batches wf_nb trains on (bf16 autocast)."
    import torch
    from wf_nb.assets import load_tokenizer
    from wf_nb.stream import get_data
    cfg = cfg_for(); data = get_data(cfg, load_tokenizer(cfg.model), 'train', verbose=False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(tokens // (B * S)):
        for g in opt.param_groups: g['lr'] = lr * min(1.0, (step + 1) / warmup)
        b = next(data)
        with torch.autocast('cpu', dtype=torch.bfloat16): loss = model(input_ids=b['input_ids'], labels=b['labels'], use_cache=False).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        if step % 50 == 0: print(f"naive_qat step {step} loss {loss.item():.3f}", file=sys.stderr, flush=True)
    return model

def run_arm(arm: str, a) -> dict:
    import torch
    from wf_nb.assets import load_fp_model
    torch.manual_seed(0)
    t0, cmd, trained = time.time(), None, 0
    if arm == 'wf_pipeline':
        cmd = ['wf', 'pipeline', '-m', 'smollm2_135m', '--tokens', str(a.tokens), '--runs-dir', str(Path(a.out)/'runs'),
               'training.precision=bf16', 'logging.progress=false', *shlex.split(a.wf_args)]
        r = subprocess.run(cmd, text=True, capture_output=True)
        if r.returncode: raise SystemExit(f"wf pipeline failed:\n{r.stderr[-3000:]}")
        out = r.stdout.strip().splitlines()[-1].split('output ')[-1]
        from wf_nb.convert import load
        model, trained = load(out), a.tokens
    else:
        model = load_fp_model(cfg_for().model)
        if arm in ('ptq', 'naive_qat'): model = hf_bitnet(model)
        if arm == 'naive_qat': model, trained = naive_qat(model, a.tokens), a.tokens
        cmd = ['python', 'tests/benchmarks/bench_quality.py', '--one', arm]
    train_s = time.time() - t0
    res = evaluate(model, a.eval_tokens)
    return {'arm': arm, **res, 'train_s': train_s, 'tokens': trained, 'tokens_per_s': trained / train_s if trained else None,
            'eval_s': time.time() - t0 - train_s, 'command': ' '.join(cmd), 'threads': torch.get_num_threads()}

def grad_scale():
    "Gradient norm of each Stage-1.9 / 2 term on the real Stage-1 student, one 4 x 128 Shakespeare batch (issue 12, item 1)."
    import torch, torch.nn.functional as F
    from wf_nb.assets import load_fp_model, load_tokenizer
    from wf_nb.config import QuantConfig
    from wf_nb.convert import convert
    from wf_nb.stream import get_data
    from wf_nb.losses import lm_loss
    from wf_nb.distill import kd_loss, layerwise_loss
    cfg = cfg_for(); tok = load_tokenizer(cfg.model)
    t = load_fp_model(cfg.model).eval(); s = convert(load_fp_model(cfg.model), QuantConfig()).train()
    b = next(get_data(cfg, tok, 'train', verbose=False))
    with torch.no_grad(): to = t(input_ids=b['input_ids'], output_hidden_states=True, use_cache=False)
    def old_layerwise(hs, ht):   # the version issue 12 found inert: a mean over the hidden dim, depth-weighted
        hs, ht = hs[1:], ht[1:]; L = len(hs)
        return sum((i + 1) / (L * (L + 1) / 2) * (F.normalize(x.float(), dim=-1) - F.normalize(y.float(), dim=-1)).pow(2).mean(-1).mean()
                   for i, (x, y) in enumerate(zip(hs, ht)))
    terms = {'CE': lambda o: lm_loss(o.logits, b['labels'])['loss'], 'KD (T=1)': lambda o: kd_loss(o.logits, to.logits, None, 1.0),
             'layer-wise (sum over layers of 2-2cos)': lambda o: layerwise_loss(o.hidden_states, to.hidden_states),
             'layer-wise, old (mean over d, depth-weighted)': lambda o: old_layerwise(o.hidden_states, to.hidden_states)}
    print('| term | value | gradient norm |\n|---|---|---|')
    for name, f in terms.items():
        s.zero_grad(); v = f(s(input_ids=b['input_ids'], output_hidden_states=True, use_cache=False)); v.backward()
        g = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in s.parameters() if p.grad is not None)).item()
        print(f'| {name} | {v.item():.4g} | {g:.4g} |', flush=True)

def table(rows: list[dict]) -> str:
    srcs = [k for k in ('shakespeare', 'bible_kjv', 'licenses') if any(k in r for r in rows)]
    base = next((r for r in rows if r['arm'] == 'naive_qat'), None)
    head = '| arm | ' + ' | '.join(f'ppl {s}' for s in srcs) + ' | vs naive QAT | train wall s | student tok/s |'
    lines = [head, '|' + '---|' * (len(srcs) + 4)]
    for r in rows:
        ratio = ' / '.join(f"{r[s] / base[s]:.2f}" for s in srcs) if base else ''
        tps = f"{r['tokens_per_s']:.0f}" if r.get('tokens_per_s') else ''
        lines.append(f"| {r['arm']} | " + ' | '.join(f"{r[s]:.1f}" for s in srcs) + f" | {ratio} | {r['train_s']:.0f} | {tps} |")
    return '\n'.join(lines)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tokens', type=int, default=153_600); ap.add_argument('--arms', default=','.join(ARMS))
    ap.add_argument('--parallel', type=int, default=2); ap.add_argument('--out', default='bench_quality_out')
    ap.add_argument('--eval-tokens', type=int, default=16_000); ap.add_argument('--wf-args', default='')
    ap.add_argument('--one', metavar='ARM', help=argparse.SUPPRESS)
    ap.add_argument('--grad-scale', action='store_true', help='print the gradient norm of each loss term and exit')
    a = ap.parse_args()
    if a.grad_scale: return grad_scale()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    if a.one:
        res = run_arm(a.one, a)
        tmp = out/f'.{a.one}.json.tmp'; tmp.write_text(json.dumps(res, indent=1)); os.replace(tmp, out/f'{a.one}.json')
        return
    arms = a.arms.split(',')
    threads = max(1, (os.cpu_count() or 2) // a.parallel)
    env = {**os.environ, 'WANDB_MODE': 'disabled', 'OMP_NUM_THREADS': str(threads), 'TOKENIZERS_PARALLELISM': 'false'}
    todo = [arm for arm in arms if not (out/f'{arm}.json').exists()]
    procs, t0 = {}, time.time()
    while todo or procs:
        while todo and len(procs) < a.parallel:
            arm = todo.pop(0)
            log = open(out/f'{arm}.log', 'w')
            procs[arm] = subprocess.Popen([sys.executable, __file__, '--one', arm, '--out', str(out), '--tokens', str(a.tokens),
                                           '--eval-tokens', str(a.eval_tokens), '--wf-args', a.wf_args], stdout=log, stderr=log, env=env)
        for arm, p in list(procs.items()):
            if p.poll() is not None:
                del procs[arm]
                if p.returncode: print(f"{arm} failed (see {out/arm}.log)", file=sys.stderr)
        time.sleep(2)
    rows = [json.loads((out/f'{arm}.json').read_text()) for arm in arms if (out/f'{arm}.json').exists()]
    print(f"# bench_quality: {a.tokens:,} student tokens (batch {B} x {S}), {time.time() - t0:.0f}s this invocation")
    print(table(rows))
    for r in rows: print(f"- {r['arm']}: `{r['command']}`")

if __name__ == '__main__':
    main()
