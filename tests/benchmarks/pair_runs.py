"""Two training runs side by side, from their metrics: a logged key (default `kl`, the KD term) per window of student tokens.

  python tests/benchmarks/pair_runs.py RUN_A RUN_B [--key kl] [--window 10240]

RUN_A / RUN_B: a run folder (its `metrics.jsonl`), or a `bench_quality.py --out` folder (its Stage-2 run). Paired arms (the
same data, batches and seed; `bench_quality.py` keeps them so) differ only by what the arms change, so B/A per window says
where in training one arm pulls ahead: while lambda ramps, or on the ternary steps after it."""
import argparse, sys
from pathlib import Path

def metrics(path: str) -> list[dict]:
    "The rows of a run's metrics.jsonl (`wf_nb.registry.read_metrics`: a run still writing is read too); a bench_quality --out folder stands for its Stage-2 run."
    from wf_nb.registry import read_metrics
    p = Path(path)
    files = [p] if p.suffix == '.jsonl' else [p/'metrics.jsonl'] if (p/'metrics.jsonl').exists() else sorted(p.glob('runs/*-s2-*/metrics.jsonl'))
    if not files: sys.exit(f"pair_runs: error: no metrics.jsonl in {p}: pass a run folder or a bench_quality --out folder")
    return read_metrics(files[0])

def windowed(rows: list[dict], key: str, window: int) -> dict[int, float]:
    "Mean of `key` per window of `window` student tokens: {window index: mean}."
    out: dict[int, list] = {}
    for r in rows:
        if key in r and 'tokens' in r: out.setdefault(int(r['tokens']) // window, []).append(float(r[key]))
    return {k: sum(v) / len(v) for k, v in out.items()}

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('a'); ap.add_argument('b')
    ap.add_argument('--key', default='kl', help='the logged metric (kl, loss, layerwise, ...)')
    ap.add_argument('--window', type=int, default=10240, help='student tokens per row')
    args = ap.parse_args()
    A, B = (windowed(metrics(x), args.key, args.window) for x in (args.a, args.b))
    if not A or not B: sys.exit(f"pair_runs: error: {args.key!r} is not logged in {args.a if not A else args.b}: pick --key from its metrics.jsonl")
    print(f"| student tokens | A {args.key} | B {args.key} | B / A |\n|---|---|---|---|")
    for k in sorted(set(A) | set(B)):
        a, b = A.get(k), B.get(k)
        fmt = lambda v: '' if v is None else f'{v:.3f}'
        print(f"| {k * args.window:,} | {fmt(a)} | {fmt(b)} | {'' if a is None or b is None or a == 0 else f'{b / a:.3f}'} |")

if __name__ == '__main__': main()
