"""Run a notebook as `nbdev_test` does, with the `#| cuda` (or other) flagged cells included, and print what its cells print.

`nbdev_test --flags cuda` checks the cells but keeps their output to itself; on a lent GPU the kernel tables are the
point, so this prints each cell's printed output and stops at the first failing cell with its traceback (exit 1).
`--keep-going` runs the cells after a failing one too and reports each failure (one lease, as much learned as possible).

    python tests/benchmarks/run_nb.py nbs/02_kernels.ipynb [--flags cuda] [--keep-going] [--save executed.ipynb]
"""
import argparse, os, sys, time
from pathlib import Path
from execnb.nbio import write_nb
from execnb.shell import CaptureShell
from fastcore.xtras import working_directory
from nbdev.frontmatter import FrontmatterProc
from nbdev.process import NBProcessor
from nbdev.config import get_config

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('notebook'); ap.add_argument('--flags', default=''); ap.add_argument('--save')
    ap.add_argument('--keep-going', action='store_true', help='run the cells after a failing one too')
    a = ap.parse_args()
    fn = Path(a.notebook).resolve()
    skip = set(get_config().tst_flags.split()) - set(a.flags.split())
    os.environ['IN_TEST'] = '1'
    nb = NBProcessor(fn, procs=FrontmatterProc, process=True).nb
    def no_eval(cell):   # nbdev_test's rule: skip markdown, `#| eval: false` and cells flagged with a flag not asked for
        if cell.cell_type != 'code': return True
        d = getattr(cell, 'directives_', {}) or {}
        return d.get('eval:', [''])[0].lower() == 'false' or bool(skip & d.keys())
    shell, t0, failed = CaptureShell(fn), time.time(), []
    def report(cell):   # print as each cell ends: a run cut off by `timeout` on a lent GPU still shows what it reached
        for o in (getattr(cell, 'outputs', None) or []):
            if o.get('name') == 'stdout': print(''.join(o['text']), end='')
            if o.get('output_type') == 'error':
                failed.append(cell.get('id'))
                print(f"FAILED cell {cell.get('id')} ({cell.source.splitlines()[0] if cell.source else ''}): {o['ename']}: {o['evalue']}")
                print('\n'.join(o.get('traceback', [])[-6:]))
        print(f"[cell {cell.get('id')} done at {time.time() - t0:.0f} s]", flush=True)
    try:
        with working_directory(fn.parent): shell.run_all(nb, exc_stop=not a.keep_going, preproc=no_eval, postproc=report)
    except Exception:
        sys.stderr.write(shell.prettytb(fname=fn) + '\n'); failed.append('run')
    ok = not failed
    if a.save: write_nb(nb, a.save)
    print(f"{fn.name}: {'passed' if ok else 'FAILED'} in {time.time() - t0:.0f} s (flags: {a.flags or 'none'})")
    sys.exit(0 if ok else 1)

if __name__ == '__main__':
    main()
