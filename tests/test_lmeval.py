"""`wf eval --lm-eval` (and `--task ... --calibrate`) end to end: a tiny checkpoint scored by lm-evaluation-harness on wf_nb's offline tasks, in a
separate process, offline; bad task arguments give one line and exit 2 before any model is loaded."""
import json, os
import pytest
pytest.importorskip('lm_eval')

OFFLINE = {'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '2', 'WANDB_MODE': 'disabled'}

@pytest.fixture(scope='module')
def ckpt(module_tmp):
    from wf_nb.config import get_config
    from wf_nb.assets import load_fp_model, load_tokenizer
    import torch
    torch.manual_seed(0)
    mc = get_config(model='tiny_llama').model
    d = module_tmp('ckpt') / 'tiny'
    load_fp_model(mc).save_pretrained(d); load_tokenizer(mc).save_pretrained(d)
    return d

def test_wf_eval_lm_eval(wf, tmp_path, ckpt):
    mc = tmp_path / 'mc.jsonl'
    mc.write_text(''.join(json.dumps({'context': c, 'choices': [' mat', ' moon'], 'label': 0}) + '\n'
                          for c in ['The cat sat on the', 'The cow jumped over the']))
    r = wf('eval', ckpt, '--lm-eval', f'wf_shakespeare_cloze,{mc}', '--mc', mc, '--limit', '4', '--json', tmp_path / 'e.json',
           '--task', 'shakespeare_genre', '--calibrate', env=OFFLINE)
    res = json.loads((tmp_path / 'e.json').read_text())
    assert set(res['lm_eval']) == {'wf_shakespeare_cloze', 'wf_mc_mc'}, res['lm_eval']
    assert res['lm_eval']['wf_shakespeare_cloze']['n'] == 4 and res['lm_eval']['wf_mc_mc']['n'] == 2
    assert res['lm_eval']['wf_mc_mc']['acc'] == res['mc']['acc']                          # same items, same scores
    assert res['task']['n'] == 3 and res['task']['calibrated']['n'] == 3                      # --calibrate: content-free calibration
    assert 'wf_shakespeare_cloze acc' in r.stdout and 'lm-evaluation-harness:' in r.stdout and 'Metric' in r.stdout, r.stdout
    assert not list(tmp_path.glob('.e.json*'))

@pytest.mark.parametrize('spec, says', [('nope.yaml', 'does not exist'), (' , ', 'no tasks given')])
def test_wf_eval_lm_eval_bad_tasks(wf, ckpt, spec, says):
    r = wf('eval', ckpt, '--lm-eval', spec, check=False, env=OFFLINE)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith('wf eval: error:'), r.stderr
