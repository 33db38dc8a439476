"""The canary: proof that `nbdev_test` really executes notebook cells in this environment.

Some execnb releases make nbdev_test pass without running anything; then every notebook test above
would pass vacuously. These tests run nbdev_test on two throwaway notebooks: one whose cell writes a
file (the file must appear) and one whose cell raises (nbdev_test must fail)."""
import json
from pathlib import Path
from conftest import ROOT
from test_notebooks import run_nbdev_test

def _nb(path, src):
    cells = [{'cell_type': 'code', 'execution_count': None, 'id': f'c{i}', 'metadata': {}, 'outputs': [], 'source': s}
             for i, s in enumerate(src)]
    path.write_text(json.dumps({'cells': cells, 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}))
    return path

def test_cells_run(tmp_path):
    marker = tmp_path / 'ran.txt'
    nb = _nb(tmp_path / 'canary.ipynb', [f"open({str(marker)!r}, 'w').write('cell executed')"])
    r = run_nbdev_test(nb, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.read_text() == 'cell executed', 'nbdev_test did not execute the notebook cells'

def test_failing_cell_fails(tmp_path):
    nb = _nb(tmp_path / 'canary_fail.ipynb', ["assert 1 == 2, 'canary must fail'"])
    r = run_nbdev_test(nb, cwd=ROOT)
    assert r.returncode != 0, 'nbdev_test passed a notebook whose cell raises'

def test_slow_flag_skipped(tmp_path):
    "Cells flagged `#| slow` are skipped by default (settings.ini tst_flags), others run."
    marker = tmp_path / 'slow.txt'
    nb = _nb(tmp_path / 'canary_slow.ipynb', [f"#| slow\nopen({str(marker)!r}, 'w').write('x')", "x = 1"])
    r = run_nbdev_test(nb, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not marker.exists(), 'a #| slow cell ran in the default test set'
