"""The Python API of a notebook user (`wf_nb.train`, `wait`, `runs`, `metrics`, `cancel`, nbs/11a_jupyter.ipynb) against
the `wf` command: a background run returns at once and completes, `wait` returns its result, the same call again
resumes or refuses exactly as `wf train` does; then the live-plot path in a real kernel under papermill (no display)."""
import contextlib, io, json, os, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import ROOT, bin_path

TINY = ['data.seq_len=32', 'training.batch_size=2', 'logging.interval=1', 'training.lr=3e-3', 'logging.progress=false']

@pytest.fixture(scope='module')
def runs(module_tmp):
    "One runs folder for the module, with the tiny model's Stage 1 made once (every Stage 2 below starts from it)."
    import wf_nb.jupyter as J
    d = module_tmp('jupyter')/'runs'
    with contextlib.redirect_stdout(io.StringIO()): J.train('tiny_llama', 1, overrides=TINY, detach=False, runs_dir=d)
    return d

@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv('WANDB_MODE', 'disabled'); monkeypatch.setenv('OMP_NUM_THREADS', '1')
    import wf_nb.jupyter as J
    return J

def _steps(run_dir):
    p = Path(run_dir)/'metrics.jsonl'
    return [json.loads(l)['step'] for l in p.read_text().splitlines() if '"loss"' in l] if p.exists() else []

def test_detach_wait_and_rerun_as_the_cli(api, runs):
    J = api
    ov = TINY + ['training.max_steps=4']
    rid = J.train('tiny_llama', 2, overrides=ov, runs_dir=runs)           # detach=True is the default
    proc = J._PROCS[rid]
    assert proc.poll() is None and not (runs/rid/'final').exists()        # returned while the run has not even started training
    res = J.wait(rid, runs)
    assert res['status'] == 'COMPLETED' and res['returncode'] == 0 and res['step'] == 4 and res['run_id'] == rid
    assert _steps(runs/rid) == [1, 2, 3, 4] and (runs/rid/'final'/'model.safetensors').exists()
    assert (runs/'.console'/f'{rid}.log').read_text().startswith('$ wf train -m tiny_llama -s 2')
    # the same call again: nothing retrained, nothing started, the CLI's message
    err = io.StringIO()
    with contextlib.redirect_stderr(err): assert J.train('tiny_llama', 2, overrides=ov, runs_dir=runs) == rid
    assert 'already COMPLETED' in err.getvalue() and J._PROCS[rid] is proc
    # `wf train` with the same arguments finds the same run (same fingerprint) and says the same
    r = subprocess.run([bin_path('wf'), 'train', '-m', 'tiny_llama', '-s', '2', '--runs-dir', str(runs), *ov],
                       capture_output=True, text=True, timeout=600, env={**os.environ, 'WANDB_MODE': 'disabled'})
    assert r.returncode == 0 and f'run {rid} already COMPLETED' in r.stderr, r.stderr[-2000:]
    # skip_recovery: a fresh run beside it, its real id returned
    rid2 = J.train('tiny_llama', 2, overrides=ov, runs_dir=runs, skip_recovery=True)
    assert rid2 != rid and rid2.startswith(rid)
    assert J.wait(rid2, runs)['status'] == 'COMPLETED'
    df = J.runs(runs)
    assert set(df.index) == {p.name for p in runs.iterdir() if (p/'metadata.json').exists()}
    assert list(df.created) == sorted(df.created, reverse=True)   # newest first, as `wf runs`
    for r_ in (rid, rid2):
        meta = json.loads((runs/r_/'metadata.json').read_text())
        last = [json.loads(l) for l in (runs/r_/'metrics.jsonl').read_text().splitlines() if '"loss"' in l][-1]
        assert (df.loc[r_, 'status'], df.loc[r_, 'stage']) == (meta['status'], meta['stage'])
        assert meta['output'] == 'final' and df.loc[r_, 'output'] == str(runs/r_/'final')   # stored relative, shown resolved
        assert (df.loc[r_, 'steps'], df.loc[r_, 'last_loss'], df.loc[r_, 'tokens_per_s']) == (last['step'], last['loss'], last['tokens_per_s'])
    m = J.metrics(rid, runs)
    lines = [json.loads(l) for l in (runs/rid/'metrics.jsonl').read_text().splitlines()]
    assert len(m) == len(lines) and m['loss'].dropna().tolist() == [x['loss'] for x in lines if 'loss' in x]

def test_cancel_refuse_resume(api, runs):
    J = api
    ov = TINY + ['training.max_steps=100']
    rid = J.train('tiny_llama', 2, overrides=ov, runs_dir=runs)
    t0 = time.time()
    while len(_steps(runs/rid)) < 3:
        assert J._PROCS[rid].poll() is None and time.time() - t0 < 600, (runs/'.console'/f'{rid}.log').read_text()[-2000:]
        time.sleep(0.2)
    with pytest.raises(J.RunLockedError, match='is being trained by process'):   # `wf train` exits 1 with this message
        J.train('tiny_llama', 2, overrides=ov, runs_dir=runs)
    out = io.StringIO()
    with contextlib.redirect_stdout(out): J.cancel(rid, runs)
    assert 'sent SIGINT' in out.getvalue()
    res = J.wait(rid, runs)
    assert res['status'] == 'INTERRUPTED' and res['returncode'] == 130, res
    stopped = res['step']
    assert 3 <= stopped < 100
    J.train('tiny_llama', 2, overrides=ov, runs_dir=runs)                   # the same call resumes it
    res = J.wait(rid, runs)
    assert res['status'] == 'COMPLETED' and res['step'] == 100 and res['start_step'] == stopped
    assert 'resumed from step_' in (runs/rid/'train.log').read_text()

NB_CELLS = [
    "import wf_nb\nfrom wf_nb.jupyter import in_notebook\nassert in_notebook()\nruns_dir = {runs!r}\nov = {ov!r}",
    "rid = wf_nb.train('tiny_llama', 2, overrides=ov + ['training.max_steps=6'], detach=False, runs_dir=runs_dir)",
    "rid2 = wf_nb.train('tiny_llama', 2, overrides=ov + ['training.max_steps=5'], runs_dir=runs_dir)\nres = wf_nb.wait(rid2, runs_dir, follow=True)\nassert res['status'] == 'COMPLETED'",
    "wf_nb.plot([rid, rid2], runs_dir)",
]

def test_live_plot_under_papermill(runs, tmp_path):
    "In a real kernel without a display: training in the kernel and following a background run both draw live curves."
    import nbformat
    nb = nbformat.v4.new_notebook(metadata={'kernelspec': {'name': 'python3', 'display_name': 'python3', 'language': 'python'}})
    nb.cells = [nbformat.v4.new_code_cell(c.format(runs=str(runs), ov=TINY)) for c in NB_CELLS]
    src, out = tmp_path/'live.ipynb', tmp_path/'live-out.ipynb'
    nbformat.write(nb, src)
    env = {**os.environ, 'WANDB_MODE': 'disabled', 'MPLBACKEND': 'agg', 'PYTHONPATH': str(ROOT)}
    env.pop('DISPLAY', None)
    r = subprocess.run([bin_path('papermill'), str(src), str(out)], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    cells = json.loads(out.read_text())['cells']
    pngs = lambda c: [o for o in c['outputs'] if 'image/png' in o.get('data', {})]
    assert len(pngs(cells[1])) == 1 and len(pngs(cells[2])) == 1, 'the live plot is one output, redrawn in place'
    assert any('stage 2 of tiny_llama' in ''.join(o.get('text', '')) for o in cells[2]['outputs']), 'follow=True streams the console'
    assert len(pngs(cells[3])) == 1, 'wf_nb.plot showed nothing'

def test_tutorial_notebook(tmp_path):
    """nbs/13_tutorial.ipynb headless under papermill with its small default budget (SmolLM2, a few steps): every stage
    completes, and its docs page (rendered as docs/build.py renders pages) shows the live curves and the plot."""
    import importlib.util, nbformat
    spec = importlib.util.spec_from_file_location('docs_build', ROOT/'docs'/'build.py'); build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    out = tmp_path/'tutorial.ipynb'
    env = {**os.environ, **build.KERNEL_ENV, 'WANDB_MODE': 'disabled', 'PYTHONPATH': str(ROOT)}   # as tests/test_notebooks.py runs notebooks
    env.pop('DISPLAY', None); env.pop('MPLBACKEND', None)
    r = subprocess.run([bin_path('papermill'), str(ROOT/'nbs'/'13_tutorial.ipynb'), str(out), '-p', 'runs_dir', str(tmp_path/'runs')],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    runs = [json.loads((p/'metadata.json').read_text()) for p in (tmp_path/'runs').iterdir() if (p/'metadata.json').exists()]
    assert sorted((m['stage'], m['status']) for m in runs) == [('1', 'COMPLETED'), ('1.9', 'COMPLETED'), ('2', 'COMPLETED')]
    build.store(ROOT/'nbs'/'13_tutorial.ipynb', out)     # its docs page shows this run (tests/test_notebooks.py does not run it again)
    nb, _ = build.process(ROOT/'nbs'/'13_tutorial.ipynb', executed=out)   # the page of the executed tutorial
    body = build.render_nb(nb)
    assert body.count('<img') >= 3, 'the tutorial page shows no curves'   # Stage 1.9 and 2 live curves, wf_nb.plot
    assert 'BitNetForCausalLM' in body and 'Held-out perplexity' in body
