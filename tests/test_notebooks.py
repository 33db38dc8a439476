"""Every notebook runs as a JupyterLab user's "Run All" runs it: in a fresh Jupyter kernel (the `python3` kernelspec
that .ci/run installs; nbclient, as papermill), one process and one kernel per notebook, cells in order, stopping at
the first error. The cells `nbdev_test` skips are skipped here too (`#| slow`, `#| cuda`: settings.ini `tst_flags`;
`#| eval: false`). This replaces `nbdev_test` (execnb's in-process shell, which is not a kernel: `in_notebook()`,
display handles and the inline backend differ there), so each notebook runs once in CI, not twice.

Each executed notebook is kept in the docs cache (docs/_cache/, by content hash: `docs/build.py`), so the docs site
built after this test (tests/test_docs.py, ordered last by conftest.py) shows the outputs without running anything
again. The notebooks other tests already run in a kernel, with the parameters those tests need, are listed in
ELSEWHERE and not run again here; the test output lists every notebook and where it ran."""
import contextlib, importlib.util, json, re, time
from pathlib import Path
import pytest
from conftest import ROOT

def _load_build():
    spec = importlib.util.spec_from_file_location('docs_build', ROOT / 'docs' / 'build.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

build = _load_build()

# notebook -> the test that runs it in a real kernel already (papermill), with the parameters it needs
ELSEWHERE = {
    'nbs/13_tutorial.ipynb': 'tests/test_jupyter.py::test_tutorial_notebook',
    'papermill_runs/train.ipynb': 'tests/test_papermill.py::test_train_notebook',
    'papermill_runs/report.ipynb': 'tests/test_papermill.py::test_report_notebook',
    'papermill_runs/ablation_arm.ipynb': 'tests/test_ablate.py::test_tiny_ablation_end_to_end_and_resume',
    'papermill_runs/ablation_report.ipynb': 'tests/test_ablate.py::test_tiny_ablation_end_to_end_and_resume',
}
ALL = sorted(str(p.relative_to(ROOT)) for d in ('nbs', 'papermill_runs') for p in (ROOT / d).glob('*.ipynb'))
NOTEBOOKS = [p for p in ALL if p not in ELSEWHERE]
# Debris that must not reach a notebook's outputs (and so the docs): warnings that are wf_nb's to fix or to filter, and
# progress redraws (`\r`; a bar's final line, from libraries that ignore TQDM_DISABLE, is dropped by docs/build.py).
DEBRIS = [r'recompile_limit', r'DeprecationWarning', r'IProgress not found', r'\r(?!\n)']

_ROWS = []

def stream_text(nb: dict, name: str = 'stderr') -> str:
    return '\n'.join(''.join(o.get('text', '')) for c in nb['cells'] for o in c.get('outputs', [])
                     if o.get('output_type') == 'stream' and o.get('name') == name)

@pytest.fixture(scope='module', autouse=True)
def _listing(request):
    "Print every notebook and where it ran in a kernel (this test, with cells run and seconds, or another test)."
    yield
    tr, cap = (request.config.pluginmanager.get_plugin(n) for n in ('terminalreporter', 'capturemanager'))
    if tr is None: return
    with cap.global_and_fixture_disabled() if cap else contextlib.nullcontext():   # shown whatever the capture mode
        tr.write_sep('-', f'notebooks in a Jupyter kernel ({len(ALL)})')
        for p in ALL:
            row = next((r for r in _ROWS if r[0] == p), None)
            if p in ELSEWHERE: tr.write_line(f'  {p:40s} in {ELSEWHERE[p]}')
            elif row: tr.write_line(f'  {p:40s} {row[1]:6s} {row[2]:3d} cells run, skipped {row[3] or "none"}, {row[4]:.0f} s')
            else: tr.write_line(f'  {p:40s} not run')

def _module_notebooks() -> set[str]:
    "The notebook of every wf_nb module, from the header nbdev writes into it (`File to edit: ../nbs/X.ipynb`)."
    return {f"nbs/{m.group(1)}.ipynb" for py in (ROOT / 'wf_nb').glob('*.py')
            for m in [re.search(r'File to edit: \.\./nbs/([\w.-]+)\.ipynb', py.read_text())] if m}

def test_every_notebook_is_covered():
    "Each notebook under nbs/ and papermill_runs/ runs here or in the test ELSEWHERE names (which really runs it): none is skipped."
    on_disk = {str(p.relative_to(ROOT)) for d in ('nbs', 'papermill_runs') for p in (ROOT / d).iterdir() if p.suffix == '.ipynb'}
    assert set(NOTEBOOKS) | set(ELSEWHERE) == on_disk and not set(NOTEBOOKS) & set(ELSEWHERE), sorted(on_disk ^ set(NOTEBOOKS))
    modules = _module_notebooks()
    assert len(modules) >= 30 and modules <= set(NOTEBOOKS) | set(ELSEWHERE), sorted(modules - set(NOTEBOOKS))   # every module's notebook runs
    for nb, where in ELSEWHERE.items():
        assert (ROOT / nb).exists(), f'{nb} is gone: drop it from ELSEWHERE'
        f, test = where.split('::')
        src = (ROOT / f).read_text()
        assert f'def {test}(' in src and Path(nb).stem in src, f'{where} does not run {nb}'

@pytest.mark.parametrize('nb', NOTEBOOKS)
def test_notebook(nb, tmp_path):
    src, out = ROOT / nb, tmp_path / Path(nb).name
    t0 = time.time()
    r, info = build.execute_one(src, out, timeout=1800)
    _ROWS.append((nb, 'passed' if r.returncode == 0 else 'FAILED', info.get('ran', 0),
                  ', '.join(f'{n} {k}' for k, n in info.get('skipped', {}).items()), time.time() - t0))
    assert r.returncode == 0, f"{nb} failed under Run All in a Jupyter kernel\n{r.stderr[-8000:]}"
    executed = json.loads(out.read_text())
    assert info['ran'] == sum(c['cell_type'] == 'code' for c in executed['cells']) - sum(info['skipped'].values())   # every other cell ran
    err = stream_text(executed)
    found = [(p, m.group(0)) for p in DEBRIS for m in [re.search(r'.{0,120}' + p + r'.{0,80}', err)] if m]
    assert not found, f"{nb}: warning or progress-bar debris in its outputs: {found}"
    if nb.startswith('nbs/'): build.store(src, out)     # the docs page shows these outputs (nothing runs twice)
