"""`wf ablate`: a tiny Haar ablation (2 arms x 2 seeds of tiny_llama, 3 + 3 steps) end to end through papermill:
arm notebooks -> fingerprinted Stage 1 -> 1.9 -> 2 chains -> scores (and the packed export) -> the report notebook
with its table, curves and verdict. Then the resume: an arm whose result is lost is re-scored without retraining,
and finished arms are not executed again. The ablation notebooks' parameters survive nbdev_clean."""
import json, shutil, subprocess
from pathlib import Path
import pytest
from conftest import ROOT, bin_path
from test_papermill import papermill, outputs, _env

PM = ROOT/'papermill_runs'
PARAMS = {'ablation_arm': {'ablation', 'arm', 'seed', 'protocol', 'overrides', 'max_steps', 'runs_dir', 'result', 'export'},
          'ablation_report': {'results', 'command', 'figures_dir'}}

@pytest.mark.parametrize('name', list(PARAMS))
def test_parameters_documented_and_clean(name, tmp_path):
    src = PM/f'{name}.ipynb'
    nb = json.loads(src.read_text())
    assert sum('parameters' in c.get('metadata', {}).get('tags', []) for c in nb['cells']) == 1
    r = papermill('--help-notebook', src, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {l.split(':')[0].strip() for l in r.stdout.splitlines() if '(default' in l} == PARAMS[name], r.stdout
    cp = tmp_path/f'{name}.ipynb'; shutil.copy(src, cp)
    subprocess.run([bin_path('nbdev_clean'), '--fname', str(cp)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert json.loads(cp.read_text()) == nb, f'papermill_runs/{name}.ipynb is not clean: run nbdev_clean --fname on it'

def _ablate(d, *extra):
    cmd = [bin_path('wf'), 'ablate', 'haar', '--protocol', 'tiny', '--seeds', '2', '--runs-dir', str(d/'runs'),
           '--work-dir', str(d/'work'), '--report-dir', str(d/'report'), f"data.source={d/'docs'}", 'data.val_fraction=0.25',
           'logging.progress=false', *extra]
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=900, env=_env())
    assert r.returncode == 0, f"wf ablate failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r

def test_tiny_ablation_end_to_end_and_resume(tmp_path):
    d = tmp_path
    from wf_nb.assets import shakespeare_files
    from wf_nb.registry import Run, lineage_parent, run_output
    text = Path(shakespeare_files()[0]).read_text()[:56000]
    (d/'docs').mkdir()
    for i in range(8): (d/'docs'/f'd{i}.txt').write_text(text[i * 7000:(i + 1) * 7000])
    r = _ablate(d)
    # every arm and seed is a chain of three completed runs; seed s of an arm continues its own Stage 1
    metas = {p.name: json.loads((p/'metadata.json').read_text()) for p in (d/'runs').iterdir()}
    assert len(metas) == 2 * 2 * 3 and all(m['status'] == 'COMPLETED' for m in metas.values()), metas
    res = {p.stem: json.loads(p.read_text()) for p in (d/'work').glob('*.json')}
    assert sorted(res) == ['baseline-seed1', 'baseline-seed2', 'haar-seed1', 'haar-seed2']
    for name, x in res.items():
        chain = x['runs']
        for st, parent in (('1.9', '1'), ('2', '1.9')):
            lin = metas[chain[st]]['lineage']    # the parent is the run of the previous stage, recorded relative to the runs folder
            assert lin['parent_run'] == chain[parent] and lineage_parent(lin, d/'runs') == run_output(Run(d/'runs'/chain[parent]))
        cfg = (d/'runs'/chain['2']/'config.yaml').read_text()
        assert f"seed: {x['seed']}" in cfg and ('haar: true' in cfg) == (x['arm'] == 'haar')
        # export: Haar cannot be HF BitNet, so it falls back to wf-packed; the packed model scores as the trained one
        assert x['export_format'] == ('wf-packed' if x['arm'] == 'haar' else 'hf-bitnet'), x
        assert abs(x['packed_ppl'] / x['heldout_ppl'] - 1) < 1e-3, x
        assert x['val_loss'] is not None and [s for s, _ in x['curves']['2']] == [1, 2, 3]
    # the report: executed with outputs kept, the table, the paired difference, a verdict and the curves PNG
    rep = d/'report'
    assert (rep/'command.txt').read_text().startswith('wf ablate haar --protocol tiny --seeds 2')
    text, mimes = outputs(rep/'report.ipynb')
    assert 'image/png' in mimes and (rep/'curves.png').stat().st_size < 100_000
    assert 'held-out perplexity' in text and '95% CI' in text and 'paired over 2 seeds' in text, text[-3000:]
    sm = json.loads((rep/'summary.json').read_text())
    assert sm['table']['haar/heldout_ppl']['n'] == 2 and sm['diffs']['haar/heldout_ppl']['n'] == 2
    assert sm['verdicts']['haar'] in text and any(w in sm['verdicts']['haar'] for w in ('improved', 'No significant', 'worse'))
    # resume: a lost result is re-scored from the finished runs (nothing retrained); finished arms are skipped
    (d/'work'/'haar-seed2.json').unlink()
    r = _ablate(d)
    assert sorted(p.name for p in (d/'runs').iterdir()) == sorted(metas)
    assert r.stdout.count(': done (') == 3, r.stdout
    text, _ = outputs(d/'work'/'haar-seed2.ipynb')
    assert text.count('already completed') == 3, text[-2000:]
    assert json.loads((d/'work'/'haar-seed2.json').read_text())['run_id'] == res['haar-seed2']['run_id']
