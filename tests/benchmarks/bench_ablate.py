"""Time of one arm of `wf ablate ... --protocol cpu`, measured, and the ablation's projected wall time.

Runs each arm of the chosen ablations for `--steps` steps per stage (Stage 1 -> 1.9 -> 2, the cpu protocol's model,
batch and precision) in a scratch runs dir, scores it (held-out perplexity, export, packed perplexity) and prints,
per arm: Stage 1's wall time, seconds per training step of Stages 1.9 and 2 (steady state: the last logged window),
the fixed cost of each training stage (load, data, checkpoint: stage wall - steps x step time) and the scoring time;
then the projected time of both arms x `--seeds` seeds at the protocol's step counts. Run it on an idle machine: the
step time scales with whatever else holds the cores.

    python tests/benchmarks/bench_ablate.py [--ablations haar,saliency] [--steps 4] [--seeds 3] [--out bench_ablate_out]
"""
import argparse, json, shutil, sys, time
from pathlib import Path

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ablations', default='haar,saliency'); ap.add_argument('--steps', type=int, default=4)
    ap.add_argument('--seeds', type=int, default=3); ap.add_argument('--out', default='bench_ablate_out')
    ap.add_argument('--protocol', default='cpu'); ap.add_argument('--no-export', action='store_true')
    a = ap.parse_args()
    from wf_nb.ablate import ABLATIONS, PROTOCOLS, run_arm, score_arm, metric_rows, _pick
    out = Path(a.out).resolve(); shutil.rmtree(out, ignore_errors=True)
    rows = []
    for abl in a.ablations.split(','):
        for arm in ABLATIONS[abl]:
            runs = out/f'{abl}-{arm}'/'runs'
            t0 = time.time(); times = {}
            log = lambda *x: None
            chain = run_arm(abl, arm, 1, a.protocol, max_steps=a.steps, runs_dir=runs, log=log)
            t_chain = time.time() - t0
            for st, c in chain.items():
                m = json.loads((Path(c['run_dir'])/'metadata.json').read_text())
                from datetime import datetime
                times[st] = (datetime.fromisoformat(m['finished']) - datetime.fromisoformat(m['created'])).total_seconds()
            per_step = {}
            for st in ('1.9', '2'):
                tr = [r for r in metric_rows(chain[st]['run_dir']) if 'loss' in r]
                a_, b_ = (tr[-2] if len(tr) > 1 else {'step': 0, 'tokens': 0}), tr[-1]   # the last logged window
                per_step[st] = (b_['tokens'] - a_['tokens']) / b_['tokens_per_s'] / (b_['step'] - a_['step'])
            t1 = time.time(); score_arm(chain, abl, arm, 1, a.protocol, max_steps=a.steps, export=not a.no_export, log=log)
            t_score = time.time() - t1
            steps = _pick(PROTOCOLS[a.protocol]['steps'], abl)
            fixed = {st: max(0.0, times[st] - a.steps * per_step[st]) for st in ('1.9', '2')}
            proj = times['1'] + sum(fixed[st] + steps[st] * per_step[st] for st in ('1.9', '2')) + t_score + 15   # + kernel start
            rows.append(dict(ablation=abl, arm=arm, stage1_s=times['1'], step19_s=per_step['1.9'], step2_s=per_step['2'],
                             fixed19_s=fixed['1.9'], fixed2_s=fixed['2'], score_s=t_score, arm_projected_s=proj))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n# bench_ablate: protocol {a.protocol}, {a.steps} steps per stage measured; projection at the protocol's steps, {a.seeds} seeds")
    print(f"{'ablation':9} {'arm':9} {'stage 1 s':>9} {'s/step 1.9':>10} {'s/step 2':>9} {'fixed 1.9':>9} {'fixed 2':>8} {'score s':>8} {'arm min':>8}")
    for r in rows:
        print(f"{r['ablation']:9} {r['arm']:9} {r['stage1_s']:9.0f} {r['step19_s']:10.2f} {r['step2_s']:9.2f} {r['fixed19_s']:9.0f} "
              f"{r['fixed2_s']:8.0f} {r['score_s']:8.0f} {r['arm_projected_s'] / 60:8.1f}")
    for abl in a.ablations.split(','):
        tot = sum(r['arm_projected_s'] for r in rows if r['ablation'] == abl) * a.seeds
        print(f"projected `wf ablate {abl} --seeds {a.seeds} --protocol {a.protocol}`: {tot / 3600:.2f} h")

if __name__ == '__main__':
    sys.exit(main())
