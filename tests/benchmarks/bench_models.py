"""From-scratch architectures on this CPU: parameter count, training tokens/s and loss after a short real run.

Each arm is one `wf train -s pretrain` run (its own process, a fresh runs dir) on an offline corpus: Shakespeare
for the prose models, the Python standard library with FIM 0.5 for the code model, and a progressive-context
code run (128 -> 256 tokens) on the `code_multilang` mixture (Python / C / Perl) with per-language losses. Each arm
uses its recipe preset (lr, betas, schedule, optimizer, precision) with warm-up and total_tokens shortened for a
few steps. Tokens/s is the median `input_tokens_per_s` over the logged steps after the first (which includes
compilation and warm-up). Loss is the training loss of the last logged step, and val is the validation loss on
held-out documents at the end.

    python tests/benchmarks/bench_models.py                  # all arms, 20 steps of 2 x 256 tokens
    python tests/benchmarks/bench_models.py --arms moe fft --steps 10
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

COMMON = ['training.warmup_steps=4', 'training.total_tokens=0', 'training.grad_accum=1', 'training.save_interval=1000',
          'logging.interval=1', 'logging.progress=false', 'logging.wandb_mode=disabled', 'data.val_fraction=0.02',
          'training.eval_batches=4']
ARMS = {   # name: (model preset, overrides)
    'mobilellm_140m': ('mobilellm_140m', ['training=pretrain_phase1', 'data.source=shakespeare', 'model.vocab_size=49152']),
    'mobilellm_140m_ternary': ('mobilellm_140m', ['training=pretrain_phase1', 'data.source=shakespeare', 'model.vocab_size=49152',
                                                  'model.ternary=true', 'training.lr=1.5e-3']),
    'code_140m_fim': ('mobilellm_140m', ['training=code_pretrain', 'data=code_fim', 'model.vocab_size=49152']),
    'code_140m_progressive': ('mobilellm_140m', ['training=code_pretrain', 'data=code_progressive', 'model.vocab_size=49152',
                                                 'data.context_schedule=128:0.5,256:0.5']),
    'moe_500m_adamw': ('moe_500m', ['training=moe_muon', 'training.optimizer=adamw', 'training.lr=1e-3', 'data.source=shakespeare']),
    'moe_500m_adamw_ternary': ('moe_500m', ['training=moe_muon', 'training.optimizer=adamw', 'training.lr=1e-3',
                                            'data.source=shakespeare', 'model.ternary=true']),
    'moe_500m_muon': ('moe_500m', ['training=moe_muon', 'data.source=shakespeare']),   # Newton-Schulz per expert matrix: slow on CPU
    'fft_medium': ('fft_medium', ['training=fft_32k', 'data.source=shakespeare']),
}


def run_arm(name, steps, batch, seq, threads, root):
    model, ov = ARMS[name]
    progressive = any(o.startswith('data.context_schedule') for o in ov)
    seq_ov = ['data.seq_len=128'] if progressive else [f'data.seq_len={seq}']   # progressive: the first phase's length
    cmd = [str(Path(sys.executable).parent/'wf'), 'train', '-s', 'pretrain', '-m', model, '--runs-dir', str(root/name),
           *ov, *COMMON, *seq_ov, f'training.max_steps={steps}', f'training.batch_size={batch}']
    env = {**os.environ, 'OMP_NUM_THREADS': str(threads), 'WANDB_MODE': 'disabled', 'TOKENIZERS_PARALLELISM': 'false'}
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode: raise SystemExit(f"{name} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    run_dir = next(p for p in (root/name).iterdir() if (p/'metrics.jsonl').exists())
    recs = [json.loads(l) for l in (run_dir/'metrics.jsonl').read_text().splitlines()]
    steps_ = [r for r in recs if 'loss' in r]
    val = [r['val_loss'] for r in recs if 'val_loss' in r]
    from safetensors import safe_open
    with safe_open(str(run_dir/'final'/'model.safetensors'), 'pt') as f:   # tied embeddings are stored once
        params = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    langs_any = {}
    for r in steps_:
        for k, v in r.items():
            if k.startswith('loss/') and v is not None: langs_any[k[5:]] = round(v, 2)
    return dict(arm=name, params=params, tok_s=statistics.median(r['input_tokens_per_s'] for r in steps_[1:]),
                first=steps_[0]['loss'], last=steps_[-1]['loss'], val=val[-1] if val else None,
                seq=sorted({r.get('seq_len') for r in steps_}), langs=langs_any, wall=time.time() - t0)


def _prod(shape):
    n = 1
    for s in shape: n *= s
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--arms', nargs='+', default=list(ARMS), help=f'any of {", ".join(ARMS)} (prefixes work)')
    ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--batch', type=int, default=2)
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--threads', type=int, default=2)
    a = ap.parse_args(argv)
    arms = [n for n in ARMS if any(n.startswith(p) for p in a.arms)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in arms:
            rows.append(run_arm(n, a.steps, a.batch, a.seq, a.threads, Path(d)))
            r = rows[-1]
            print(f"{n}: {r['params']/1e6:.1f}M params, {r['tok_s']:.0f} tok/s, loss {r['first']:.2f} -> {r['last']:.2f}, "
                  f"val {r['val']}, seq {r['seq']}, {r['wall']:.0f}s {r['langs'] or ''}", flush=True)
    print(f"\n{a.steps} steps x {a.batch} rows, {a.threads} threads\n")
    print('| arm | params | seq_len | tok/s (CPU) | loss step 1 | loss last | val loss | per-source loss (last logged) |')
    print('|---|---|---|---|---|---|---|---|')
    for r in rows:
        print(f"| {r['arm']} | {r['params']/1e6:.1f}M | {'->'.join(map(str, r['seq']))} | {r['tok_s']:.0f} | {r['first']:.2f} | "
              f"{r['last']:.2f} | {r['val']:.2f} | {', '.join(f'{k} {v}' for k, v in r['langs'].items())} |")


if __name__ == '__main__':
    main()
