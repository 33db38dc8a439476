"""The papermill run notebooks: parameters are documented and survive nbdev_clean, and papermill_runs/train.ipynb
runs a tiny Stage 2 headless on CPU (Stage 1 runs first through the stage hand-off), leaving the plot in the
output notebook; papermill_runs/report.ipynb then reports that run. Outputs go to a tmp dir, never under nbs/.
Then the multi-process paths users take: the notebook with num_processes=2 (it launches `accelerate` in a
subprocess) and `wf train --scale small` (which relaunches itself), both 2 CPU processes, same losses."""
import json, shutil, subprocess, sys, os
from pathlib import Path
import pytest
from conftest import ROOT, bin_path

PM = ROOT/'papermill_runs'
TRAIN_PARAMS = {'model', 'stage', 'max_steps', 'overrides', 'runs_dir', 'num_processes', 'scale', 'log_interval', 'skip_recovery', 'out'}
OV = "data.source={docs} data.seq_len=32 data.val_fraction=0.25 training.batch_size=2 logging.progress=false"
REPORT_PARAMS = {'runs', 'runs_dir', 'last_n', 'smooth', 'min_steps'}

def _env():
    return {**os.environ, 'WANDB_MODE': 'disabled', 'TOKENIZERS_PARALLELISM': 'false', 'HF_HUB_OFFLINE': '1'}

def papermill(*args, cwd, timeout=900):
    r = subprocess.run([bin_path('papermill'), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env())
    return r

def outputs(nb_path):
    nb = json.loads(Path(nb_path).read_text())
    text, mimes = [], []
    for c in nb['cells']:
        for o in c.get('outputs', []):
            if o.get('output_type') == 'stream': text.append(''.join(o['text']))
            for k, v in o.get('data', {}).items():
                mimes.append(k)
                if k == 'text/plain': text.append(''.join(v))
    return '\n'.join(text), mimes

@pytest.mark.parametrize('name,params', [('train', TRAIN_PARAMS), ('report', REPORT_PARAMS)])
def test_parameters_documented_and_clean(name, params, tmp_path):
    src = PM/f'{name}.ipynb'
    nb = json.loads(src.read_text())
    tagged = [c for c in nb['cells'] if 'parameters' in c.get('metadata', {}).get('tags', [])]
    assert len(tagged) == 1, 'exactly one cell tagged `parameters`'
    assert nb['metadata']['kernelspec']['name'] == 'python3'
    r = papermill('--help-notebook', src, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    shown = {l.split(':')[0].strip() for l in r.stdout.splitlines() if '(default' in l}
    assert shown == params, (shown, r.stdout)
    # nbdev_clean keeps the tag and leaves the committed notebook unchanged (it is already clean)
    cp = tmp_path/f'{name}.ipynb'; shutil.copy(src, cp)
    subprocess.run([bin_path('nbdev_clean'), '--fname', str(cp)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert json.loads(cp.read_text()) == nb, f'papermill_runs/{name}.ipynb is not clean: run nbdev_clean --fname on it'

@pytest.fixture(scope='module')
def trained(module_tmp):
    d = module_tmp('pm')
    from wf_nb.assets import shakespeare_files
    text = Path(shakespeare_files()[0]).read_text()[:56000]
    (d/'docs').mkdir()
    for i in range(8): (d/'docs'/f'd{i}.txt').write_text(text[i * 7000:(i + 1) * 7000])
    out = d/'out'/'train-tiny.ipynb'; out.parent.mkdir()
    ov = OV.format(docs=d/'docs')
    r = papermill(PM/'train.ipynb', out, '-p', 'model', 'tiny_llama', '-p', 'stage', '2', '-p', 'max_steps', '6',
                  '-p', 'runs_dir', d/'runs', '-p', 'overrides', ov, cwd=d)
    assert r.returncode == 0, f"papermill train.ipynb failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return d, out

def test_train_notebook(trained):
    d, out = trained
    assert ROOT/'nbs' not in out.parents
    text, mimes = outputs(out)
    assert 'image/png' in mimes, 'the output notebook has no plot'
    runs = {p.name: json.loads((p/'metadata.json').read_text()) for p in (d/'runs').iterdir()}
    s2 = [m for m in runs.values() if m['stage'] == '2']
    assert len(s2) == 1 and s2[0]['status'] == 'COMPLETED', runs
    assert any(m['stage'] == '1' for m in runs.values())                       # the hand-off ran stage 1 first
    assert f"status             COMPLETED" in text and s2[0]['run_id'] in text
    assert (d/'runs'/s2[0]['run_id']/'curves.png').exists()
    steps = [json.loads(l)['step'] for l in (d/'runs'/s2[0]['run_id']/'metrics.jsonl').read_text().splitlines() if '"loss"' in l]
    assert steps == list(range(1, 7)), steps

def test_report_notebook(trained):
    d, _ = trained
    rid = next(p.name for p in (d/'runs').iterdir() if '-s2-' in p.name)
    out = d/'out'/'report.ipynb'
    r = papermill(PM/'report.ipynb', out, '-p', 'runs_dir', d/'runs', '-p', 'runs', rid[:16], cwd=d, timeout=300)
    assert r.returncode == 0, f"papermill report.ipynb failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    text, mimes = outputs(out)
    assert 'image/png' in mimes and rid in text and 'last_loss' in text, text[-2000:]
    # no explicit runs: the newest runs with training steps (stage 1 has none and is skipped)
    r = papermill(PM/'report.ipynb', d/'out'/'report2.ipynb', '-p', 'runs_dir', d/'runs', cwd=d, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    text, _ = outputs(d/'out'/'report2.ipynb')
    assert rid in text and '-s1-' not in text.split('last_loss')[-1], text[-2000:]

def _metrics(run_dir):
    return [json.loads(l) for l in (Path(run_dir)/'metrics.jsonl').read_text().splitlines() if '"loss"' in l]

def test_two_processes_notebook_and_cli(trained):
    "Stage 1 exists already in this runs dir, so both runs go straight to Stage 2 under 2 processes."
    d, _ = trained
    out = d/'out'/'train-2proc.ipynb'
    r = papermill(PM/'train.ipynb', out, '-p', 'model', 'tiny_llama', '-p', 'stage', '2', '-p', 'max_steps', '4',
                  '-p', 'num_processes', '2', '-p', 'runs_dir', d/'runs', '-p', 'overrides', OV.format(docs=d/'docs'), cwd=d)
    assert r.returncode == 0, f"papermill train.ipynb (2 processes) failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    text, mimes = outputs(out)
    assert 'accelerate.commands.launch --num_processes 2' in text and 'image/png' in mimes, text[-3000:]
    runs = {p.name: json.loads((p/'metadata.json').read_text()) for p in (d/'runs').iterdir()}
    two = [rid for rid in runs if 'num_processes: 2' in (d/'runs'/rid/'config.yaml').read_text()]
    assert len(two) == 1 and runs[two[0]]['status'] == 'COMPLETED', runs
    m_nb = _metrics(d/'runs'/two[0])
    assert [m['step'] for m in m_nb] == [1, 2, 3, 4] and m_nb[-1]['tokens'] == 4 * 2 * 2 * 31   # 2 ranks x batch 2 x 31 targets
    # the command users type: wf relaunches itself under accelerate
    r = subprocess.run([bin_path('wf'), 'train', '-m', 'tiny_llama', '-s', '2', '--scale', 'small', '--runs-dir', str(d/'runs'),
                        *OV.format(docs=d/'docs').split(), 'training.max_steps=4', 'logging.interval=1'],
                       cwd=d, capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, f"wf train --scale small failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert 'launching 2 processes' in r.stdout, r.stdout[-2000:]
    small = [p for p in (d/'runs').iterdir() if 'scale: small' in (p/'config.yaml').read_text()]
    assert len(small) == 1 and json.loads((small[0]/'metadata.json').read_text())['status'] == 'COMPLETED'
    m_cli = _metrics(small[0])
    assert m_cli[-1]['tokens'] == m_nb[-1]['tokens']
    assert all(abs(a['loss'] - b['loss']) < 1e-5 for a, b in zip(m_cli, m_nb)), ([a['loss'] for a in m_cli], [b['loss'] for b in m_nb])
    # FSDP2 (sharded by the Trainer on CPU): same losses, and its gathered final model equals the DDP one
    r = subprocess.run([bin_path('wf'), 'train', '-m', 'tiny_llama', '-s', '2', '--scale', 'small', '--runs-dir', str(d/'runs'),
                        *OV.format(docs=d/'docs').split(), 'training.max_steps=4', 'logging.interval=1', 'distributed.strategy=fsdp'],
                       cwd=d, capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, f"wf train --scale small distributed.strategy=fsdp failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    fsdp = [p for p in (d/'runs').iterdir() if 'strategy: fsdp' in (p/'config.yaml').read_text()]
    assert len(fsdp) == 1 and json.loads((fsdp[0]/'metadata.json').read_text())['status'] == 'COMPLETED'
    m_fsdp = _metrics(fsdp[0])
    assert all(abs(a['loss'] - b['loss']) < 1e-5 for a, b in zip(m_fsdp, m_cli)), ([a['loss'] for a in m_fsdp], [b['loss'] for b in m_cli])
    from safetensors.torch import load_file
    a, b = load_file(str(fsdp[0]/'final'/'model.safetensors')), load_file(str(small[0]/'final'/'model.safetensors'))
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-4 for k in a), [k for k in a if (a[k] - b[k]).abs().max() >= 1e-4]
