"""Soak test: N random SIGKILLs during a tiny real run (save_interval=1), each followed by the same command, which
must resume; at the end the weights and the per-step metrics must equal an uninterrupted run's.

    python tests/benchmarks/soak_kill.py [--kills 20] [--steps 200]   # prints a table; exit 1 on any mismatch

Each kill lands at a random moment; it is classed by what the run was doing: start-up (no step logged yet by this
attempt), during save (a temporary checkpoint folder exists), or mid-step."""
import argparse, hashlib, json, os, random, subprocess, sys, tempfile, time
from pathlib import Path

TINY = ['-m', 'tiny_llama', 'data.seq_len=32', 'training.batch_size=2', 'logging.interval=1', 'training.lr=3e-3']
ENV = {'OMP_NUM_THREADS': '1', 'WANDB_MODE': 'disabled', 'HF_HUB_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false'}
WF = str(Path(sys.executable).parent/'wf')

def run_dir(runs): return next(p for p in Path(runs).iterdir() if p.is_dir())
def metric_rows(d):
    p = Path(d)/'metrics.jsonl'
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
def losses(d): return [(r['step'], r['loss']) for r in metric_rows(d) if 'loss' in r]
def weights_hash(d):
    from safetensors.torch import load_file
    sd = load_file(str(Path(d)/'final'/'model.safetensors'))
    h = hashlib.sha256()
    for k in sorted(sd): h.update(k.encode()); h.update(sd[k].float().numpy().tobytes())
    return h.hexdigest()

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--kills', type=int, default=20); ap.add_argument('--steps', type=int, default=200)
    ap.add_argument('--seed', type=int, default=0); ap.add_argument('--max-delay', type=float, default=25.0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix='wf_soak_'))
    corpus = root/'corpus'; corpus.mkdir()
    from wf_nb.assets import shakespeare_files
    for f in shakespeare_files()[:2]: (corpus/f.name).write_text(f.read_text()[:20000])
    args = ['train', '-s', 'pretrain', *TINY, f'training.max_steps={a.steps}', 'training.save_interval=1',
            f'data.source={corpus}', f'data.shards_dir={root/"cache"}']
    env = lambda runs: {**os.environ, **ENV, 'WF_RUNS_DIR': str(runs)}
    t0 = time.time()
    subprocess.run([WF, *args], cwd=root, env=env(root/'ref'), check=True, capture_output=True)
    ref_dir = run_dir(root/'ref'); ref_loss, ref_w = losses(ref_dir), weights_hash(ref_dir)
    one_run = time.time() - t0
    times = [r['time'] for r in metric_rows(ref_dir) if 'loss' in r]
    startup, train_time = times[0] - t0, times[-1] - times[0]   # process start to first step; the steps themselves
    kinds = {'start-up': 0, 'mid-step': 0, 'during save': 0}
    resumed, killed = 0, 0
    runs = root/'soak'
    while killed < a.kills:
        before = len(losses(run_dir(runs))) if runs.exists() and any(runs.iterdir()) else 0
        p = subprocess.Popen([WF, *args], cwd=root, env=env(runs), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        left = 1 - before / a.steps   # the later the run, the less time it has left before it completes
        if rng.random() < 0.2: delay = rng.uniform(0.2, 1.0) * startup            # a kill while it starts up
        else:   # while it trains (or saves): on average 1/(kills left) of the remaining steps, so every kill lands
            delay = startup + rng.uniform(0.0, min(a.max_delay, 2 * train_time * left / max(1, a.kills - killed)))
        t_kill0 = time.time()
        t = time.time()
        while time.time() - t < delay and p.poll() is None: time.sleep(0.02)
        if p.poll() is not None:   # it completed before the kill: nothing left to kill (use more --steps)
            if p.returncode != 0: print(p.stderr.read()[-2000:]); sys.exit(1)
            print(f"the run completed after {killed} kills; use more --steps for {a.kills}", file=sys.stderr)
            break
        d = run_dir(runs) if runs.exists() and any(runs.iterdir()) else None
        saving = bool(d and [q for q in (d/'checkpoints').glob('.step_*') if q.stat().st_mtime >= t_kill0]) if d else False
        now = len(losses(d)) if d else 0
        p.kill(); p.wait(); killed += 1
        kinds['during save' if saving else 'mid-step' if now > before else 'start-up'] += 1
    while True:   # the same command until it completes (each start after a kill must resume)
        r = subprocess.run([WF, *args], cwd=root, env=env(runs), capture_output=True, text=True)
        if r.returncode != 0: print(r.stderr[-3000:]); sys.exit(1)
        if 'already COMPLETED' not in r.stderr: resumed += 1
        d = run_dir(runs)
        if json.loads((d/'metadata.json').read_text())['status'] == 'COMPLETED': break
    log = (d/'train.log').read_text()
    resumes = log.count('resumed from step_')   # starts that loaded a checkpoint (a kill before the first save restarts)
    got = losses(d)
    same_w, same_m = weights_hash(d) == ref_w, got == ref_loss
    print(f"| kills | start-up | mid-step | during save | resumed from a checkpoint | identical final weights | identical metrics |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {killed} | {kinds['start-up']} | {kinds['mid-step']} | {kinds['during save']} | {resumes} | {same_w} | {same_m} |")
    print(f"(uninterrupted run {one_run:.0f}s, {a.steps} steps, save_interval=1; seed {a.seed}; folder {root})")
    sys.exit(0 if same_w and same_m else 1)

if __name__ == '__main__': main()
