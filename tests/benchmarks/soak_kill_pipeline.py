"""Soak test of `wf pipeline` (issue 34): N random SIGKILLs while the pipeline runs Stage 1 -> 1.9 -> 2 of a tiny
model (save_interval=1), each followed by the same command, which must resume; at the end every stage's metrics and
the final (Stage 2) weights must equal an uninterrupted pipeline's.

    python tests/benchmarks/soak_kill_pipeline.py [--kills 10] [--tokens 12800] [--split 0.5]   # prints a table; exit 1 on any mismatch

Each kill is classed by the stage that was running (the newest run folder) and whether that stage had logged a step
yet (start-up of a stage, between stages) or not (inside a stage)."""
import argparse, json, os, random, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from soak_kill import TINY, ENV, WF, losses, weights_hash, metric_rows

def stage_runs(runs) -> dict:
    "{stage: run folder} of a runs folder (newest run per stage)."
    out = {}
    for p in sorted(Path(runs).iterdir(), key=lambda p: p.stat().st_mtime) if Path(runs).exists() else []:
        try: out[json.loads((p/'metadata.json').read_text())['stage']] = p
        except (OSError, ValueError, KeyError): pass
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--kills', type=int, default=10); ap.add_argument('--tokens', type=int, default=12_800)
    ap.add_argument('--split', type=float, default=0.5, help="Stage 1.9's share of the tokens (0.5: all three stages run)")
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix='wf_soak_pipe_'))
    corpus = root/'corpus'; corpus.mkdir()
    from wf_nb.assets import shakespeare_files
    for f in shakespeare_files()[:2]: (corpus/f.name).write_text(f.read_text()[:20000])
    args = ['pipeline', *TINY, '--tokens', str(a.tokens), '--split', str(a.split), 'training.save_interval=1', f'data.source={corpus}', f'data.shards_dir={root/"cache"}']
    env = lambda runs: {**os.environ, **ENV, 'WF_RUNS_DIR': str(runs)}
    t0 = time.time()
    subprocess.run([WF, *args], cwd=root, env=env(root/'ref'), check=True, capture_output=True)
    one_run = time.time() - t0
    ref = stage_runs(root/'ref')
    ref_loss = {s: losses(d) for s, d in ref.items()}; ref_w = weights_hash(ref['2'])
    kinds, killed, resumed = {}, 0, 0
    runs = root/'soak'
    while killed < a.kills:
        p = subprocess.Popen([WF, *args], cwd=root, env=env(runs), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        delay = rng.uniform(0.2, 1.0) * one_run / (a.kills + 1)   # kills spread over the pipeline's length: each resume gets further
        t = time.time()
        while time.time() - t < delay and p.poll() is None: time.sleep(0.02)
        if p.poll() is not None:
            if p.returncode != 0: print(p.stderr.read()[-2000:]); sys.exit(1)
            print(f"the pipeline completed after {killed} kills; use more --tokens for {a.kills}", file=sys.stderr); break
        sr = stage_runs(runs)
        cur = max(sr, key=lambda s: sr[s].stat().st_mtime) if sr else '1'
        where = f"stage {cur} " + ('start-up / between stages' if not losses(sr[cur]) and cur != '1' else 'inside')
        p.kill(); p.wait(); killed += 1; kinds[where] = kinds.get(where, 0) + 1
    while True:   # the same command until it completes
        r = subprocess.run([WF, *args], cwd=root, env=env(runs), capture_output=True, text=True)
        if r.returncode != 0: print(r.stderr[-3000:]); sys.exit(1)
        resumed += 1
        if 'COMPLETED' in r.stdout: break
    got = stage_runs(runs)
    same_m = {s: losses(got.get(s, root)) == ref_loss[s] for s in ref_loss}
    same_w = weights_hash(got['2']) == ref_w
    print("| kills | where (kills) | identical metrics per stage | identical final weights |")
    print("|---|---|---|---|")
    print(f"| {killed} | {'; '.join(f'{k}: {v}' for k, v in sorted(kinds.items()))} | {same_m} | {same_w} |")
    print(f"(uninterrupted pipeline {one_run:.0f}s, {a.tokens} student tokens, save_interval=1; seed {a.seed}; folder {root})")
    sys.exit(0 if same_w and all(same_m.values()) else 1)

if __name__ == '__main__': main()
