"""The canary: proof that the notebook test (tests/test_notebooks.py) really executes cells, in a real Jupyter kernel,
a fresh one per notebook, skipping what `nbdev_test` skips.

Some runners pass without running anything (some execnb releases made `nbdev_test` do so); then every notebook test
would pass vacuously. These tests run throwaway notebooks through the same `execute_one` the notebook test uses: a
cell that writes a file (the file must appear), a cell that raises (the run must fail, and stop there), a `#| slow`
cell (must not run), and two notebooks that report their process (a Jupyter kernel's shell, two different processes)."""
import json
from pathlib import Path
from test_notebooks import build

def _nb(path, src):
    cells = [{'cell_type': 'code', 'execution_count': None, 'id': f'c{i}', 'metadata': {}, 'outputs': [], 'source': s}
             for i, s in enumerate(src)]
    meta = {'kernelspec': {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}}
    path.write_text(json.dumps({'cells': cells, 'metadata': meta, 'nbformat': 4, 'nbformat_minor': 5}))
    return path

def test_cells_run_in_a_fresh_kernel(tmp_path):
    who = "import os, json\nfrom IPython import get_ipython\nopen({f!r}, 'w').write(json.dumps([os.getpid(), type(get_ipython()).__name__, 'x' in globals()]))"
    a, b = tmp_path / 'a.json', tmp_path / 'b.json'
    nb1 = _nb(tmp_path / 'canary.ipynb', ['x = 1', who.format(f=str(a))])
    nb2 = _nb(tmp_path / 'canary2.ipynb', [who.format(f=str(b))])
    for nb in (nb1, nb2):
        r, info = build.execute_one(nb, tmp_path / f'out-{nb.name}')
        assert r.returncode == 0, r.stdout + r.stderr
    (pid1, shell, x1), (pid2, _, x2) = json.loads(a.read_text()), json.loads(b.read_text())
    assert shell == 'ZMQInteractiveShell', f'the cells did not run in a Jupyter kernel but in {shell}'
    assert x1 and not x2 and pid1 != pid2, 'the second notebook did not get a fresh kernel'
    assert info['ran'] == 1

def test_failing_cell_fails(tmp_path):
    marker = tmp_path / 'after.txt'
    nb = _nb(tmp_path / 'canary_fail.ipynb', ["assert 1 == 2, 'canary must fail'", f"open({str(marker)!r}, 'w').write('x')"])
    r, _ = build.execute_one(nb, tmp_path / 'out.ipynb')
    assert r.returncode != 0, 'a notebook whose cell raises passed'
    assert 'canary must fail' in r.stderr and not marker.exists(), 'Run All went on after the failing cell'

def test_slow_flag_skipped(tmp_path):
    "Cells flagged `#| slow` (settings.ini tst_flags) or `#| eval: false` are skipped, as nbdev_test skips them; others run."
    slow, ran = tmp_path / 'slow.txt', tmp_path / 'ran.txt'
    nb = _nb(tmp_path / 'canary_slow.ipynb', [f"#| slow\nopen({str(slow)!r}, 'w').write('x')", "#| eval: false\n1/0",
                                              f"open({str(ran)!r}, 'w').write('x')"])
    r, info = build.execute_one(nb, tmp_path / 'out.ipynb')
    assert r.returncode == 0, r.stdout + r.stderr
    assert not slow.exists() and ran.exists(), 'a #| slow cell ran in the default test set'
    assert info['skipped'] == {'slow': 1, 'eval: false': 1} and info['ran'] == 1
