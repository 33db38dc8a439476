"""LoRA on a frozen ternary model, end to end on the tiny model (issue 37): `peft.method=lora` Stage 3 (BitDistill from
an FP teacher) trains only the adapter, checkpoints only the adapter (+ the base's digest), saves it in PEFT's format,
resumes from a checkpoint to the same adapter as an uninterrupted run, and refuses to resume on another base."""
import json, shutil
from pathlib import Path
import pytest, torch
from safetensors import safe_open
from safetensors.torch import load_file

TINY = ['data.task=shakespeare_genre', 'peft.method=lora', 'peft.r=4', 'training.max_steps=4', 'training.save_interval=2',
        'data.seq_len=48', 'training.batch_size=2', 'logging.interval=1', 'logging.progress=false', 'training.lr=3e-3',
        'training.precision=fp32', 'logging.wandb_mode=disabled']


@pytest.fixture(scope='module')
def bases(tmp_path_factory):
    "A tiny FP model (the teacher) and its ternary conversion (the base), saved as wf_nb checkpoints."
    from wf_nb.config import get_config
    from wf_nb.models import build_model
    from wf_nb.convert import convert, save_model
    from wf_nb.assets import load_tokenizer
    d = tmp_path_factory.mktemp('lora')
    mc = get_config(model='tiny_llama').model
    fp, tok = build_model(mc, seed=0), load_tokenizer(mc)
    save_model(fp, tok, d/'fp')
    save_model(convert(fp), tok, d/'s1')
    torch.manual_seed(5)
    other = convert(build_model(mc, seed=1)); save_model(other, tok, d/'s1_other')
    return d


def _cfg(d, *extra, base='s1'):
    from wf_nb.config import get_config
    return get_config([*TINY, f'training.checkpoint_path={d/base}', f'distill.teacher={d/"fp"}', *extra], stage='3', model='tiny_llama')


def test_stage3_lora_trains_saves_and_resumes(bases):
    from wf_nb.stages import run_stage
    from wf_nb.registry import Run
    from wf_nb.lora import is_adapter_dir, load_adapter
    runs = bases/'runs'
    res = run_stage(_cfg(bases), runs, log=lambda *a, **k: None)
    assert res['status'] == 'COMPLETED'
    out, run = Path(res['output']), Run(Path(res['run_dir']))
    assert is_adapter_dir(out) and not (out/'model.safetensors').exists()          # the adapter only, never the base
    assert json.loads((out/'adapter_config.json').read_text())['r'] == 4           # PEFT's format
    meta = run.meta()
    assert 0 < meta['peft']['share'] < 0.05 and meta['base_digest']
    rows = [json.loads(l) for l in run.metrics_path.read_text().splitlines() if '"loss"' in l]
    assert len(rows) == 4 and all('attn' in r and 'kd' in r for r in rows)         # BitDistill's terms reach the adapter
    ck = run.dir/'checkpoints'/'step_00000002'
    with safe_open(str(ck/'model.safetensors'), 'pt') as f: keys = set(f.keys())
    assert keys and all('lora_' in k for k in keys)
    assert json.loads((ck/'manifest.json').read_text())['base_digest'] == meta['base_digest']
    final = load_file(str(out/'adapter_model.safetensors'))
    assert any(v.abs().sum() > 0 for k, v in final.items() if 'lora_B' in k)       # it learned something

    # interrupted after step 2: the same command resumes from the step-2 checkpoint and ends with the same adapter
    shutil.rmtree(run.dir/'checkpoints'/'step_00000004'); shutil.rmtree(out)
    run.update(status='INTERRUPTED')
    res2 = run_stage(_cfg(bases), runs, log=lambda *a, **k: None)
    assert res2['status'] == 'COMPLETED' and res2['run_dir'] == res['run_dir']
    assert 'resumed from step_00000002' in (run.dir/'train.log').read_text()
    again = load_file(str(Path(res2['output'])/'adapter_model.safetensors'))
    assert again.keys() == final.keys() and all(torch.allclose(again[k], final[k], atol=1e-6) for k in final)

    # the adapter serves on its base, and refuses another one
    from wf_nb.convert import load
    m = load_adapter(bases/'s1', out)
    assert m(input_ids=torch.tensor([[1, 2, 3]])).logits.isfinite().all()
    with pytest.raises(ValueError, match='another base'): load_adapter(bases/'s1_other', out)


def test_loraplus_trains_b_at_its_ratio_and_resumes(bases):
    "peft.loraplus_ratio=16 (LoRA+): the checkpointed optimizer holds every lora_B at 16x lora_A's lr, and resumes exactly."
    from wf_nb.stages import run_stage
    from wf_nb.registry import Run
    runs, quiet = bases/'runs_loraplus', (lambda *a, **k: None)
    res = run_stage(_cfg(bases, 'peft.loraplus_ratio=16'), runs, log=quiet)
    run, out = Run(Path(res['run_dir'])), Path(res['output'])
    osd = torch.load(run.dir/'checkpoints'/'step_00000002'/'optimizer.pt', weights_only=True)
    lr_of = lambda kind: {g['lr'] for g in osd['param_groups'] for n in g['params'] if kind in n}
    (lr_a,), (lr_b,) = lr_of('lora_A'), lr_of('lora_B')                              # one lr per kind of matrix
    assert lr_b == pytest.approx(16 * lr_a) and lr_a > 0
    final = load_file(str(out/'adapter_model.safetensors'))
    shutil.rmtree(run.dir/'checkpoints'/'step_00000004'); shutil.rmtree(out)
    run.update(status='INTERRUPTED')
    again = load_file(str(Path(run_stage(_cfg(bases, 'peft.loraplus_ratio=16'), runs, log=quiet)['output'])/'adapter_model.safetensors'))
    assert all(torch.allclose(again[k], final[k], atol=1e-6) for k in final)
    from wf_nb.config import get_config, ConfigError
    with pytest.raises(ConfigError, match='loraplus_ratio'): get_config(['peft.loraplus_ratio=0.5'])


def test_lora_needs_a_ternary_base(bases):
    from wf_nb.stages import run_stage
    from wf_nb.config import get_config
    cfg = get_config([*TINY, 'training.max_steps=1'], stage='sft', model='tiny_llama')   # the FP model: nothing ternary to adapt
    with pytest.raises(ValueError, match='no BitLinear'): run_stage(cfg, bases/'runs_fp', log=lambda *a, **k: None)


def test_adapter_run_in_wf_eval_generate_export(bases, wf, tmp_path):
    "An adapter run is a run like any other for `wf eval`, `wf generate` and `wf export` (base + adapter GGUFs, or merged); bad uses get one line."
    from wf_nb.stages import run_stage
    from wf_nb.lora import load_adapter, merge_requantize, task_calibration
    from wf_nb.export import load_packed
    from wf_nb.assets import load_tokenizer
    from wf_nb.config import get_config
    res = run_stage(_cfg(bases), bases/'runs_cli', log=lambda *a, **k: None)
    run = res['run_dir']
    text = tmp_path/'held.txt'; text.write_text("Good morrow, my lord. What news from the court today? " * 20)
    ev = lambda src, name: (wf('eval', src, '--data', text, '--seq-len', 32, '--json', tmp_path/name), json.loads((tmp_path/name).read_text()))[1]
    ppl_adapter, ppl_base = ev(run, 'a.json')['perplexity']['perplexity'], ev(bases/'s1', 'b.json')['perplexity']['perplexity']
    assert ppl_adapter != ppl_base                                                  # the adapter is loaded, on its base
    assert wf('generate', run, '--prompt', 'Good morrow', '--max-new-tokens', 3).returncode == 0

    out = wf('export', run, '--format', 'gguf', '--embed-type', 'f16', '--out', tmp_path/'pair').stdout
    assert (tmp_path/'pair'/'base.gguf').is_file() and (tmp_path/'pair'/'adapter.gguf').is_file() and '--lora' in out
    wf('export', run, '--format', 'gguf', '--base-gguf', tmp_path/'pair'/'base.gguf', '--out', tmp_path/'alone.gguf')
    assert (tmp_path/'alone.gguf').read_bytes() == (tmp_path/'pair'/'adapter.gguf').read_bytes()

    wf('export', run, '--format', 'wf-packed', '--dtype', 'fp32', '--merge', '--merge-calibration', 2, '--out', tmp_path/'merged')
    tok = load_tokenizer(get_config(model='tiny_llama').model)
    want = merge_requantize(load_adapter(bases/'s1', res['output']), calibration=task_calibration('shakespeare_genre', tok, 2, 48))
    ids = torch.tensor([[5, 60, 700, 8000, 3]])
    with torch.no_grad(): assert torch.allclose(load_packed(tmp_path/'merged')(input_ids=ids).logits, want(input_ids=ids).logits, atol=1e-4)

    for args, says in [(('--format', 'hf-bitnet', '--out', tmp_path/'hf'), "PEFT's format"),
                       (('--format', 'gguf', '--out', tmp_path/'pair'), 'already exists'),
                       (('--format', 'gguf', '--base-gguf', tmp_path/'pair'/'base.gguf', '--out', tmp_path/'pair'), 'ending .gguf'),
                       (('--merge', '--base-gguf', tmp_path/'pair'/'base.gguf', '--out', tmp_path/'m.gguf'), 'pick one')]:
        r = wf('export', run, *args, check=False)
        assert r.returncode != 0 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = wf('export', bases/'s1', '--merge', '--out', tmp_path/'m2', check=False)
    assert r.returncode != 0 and 'adapter runs' in r.stderr and 'Traceback' not in r.stderr
