"""End-to-end runs of the `wf` command on the tiny random model (and one smoke run on the real one).

These are what a notebook cannot hold: separate processes, SIGKILL and SIGINT, the run registry across
invocations. Every run uses its own runs dir (WF_RUNS_DIR) under pytest's tmp_path."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import bin_path

TINY = ['-m', 'tiny_llama', 'data.seq_len=32', 'training.batch_size=2', 'logging.interval=1', 'training.lr=3e-3']
ENV = {'OMP_NUM_THREADS': '2', 'WANDB_MODE': 'disabled'}   # exact resume is defined at a fixed thread count

def metrics(run_dir):
    return [json.loads(l) for l in (Path(run_dir) / 'metrics.jsonl').read_text().splitlines() if l.strip()]

def step_losses(run_dir):
    return {r['step']: r['loss'] for r in metrics(run_dir) if 'loss' in r}

def only_run(runs_dir, stage):
    runs = [p for p in Path(runs_dir).iterdir() if json.loads((p / 'metadata.json').read_text())['stage'] == stage]
    assert len(runs) == 1, runs
    return runs[0]

def test_stage1_writes_stock_loadable_bitnet_checkpoint(wf, tmp_path):
    out = tmp_path / 'stage1'
    wf('train', '-s', '1', '--out', out, *TINY, env=ENV)
    cfg = json.loads((out / 'config.json').read_text())
    assert cfg['model_type'] == 'bitnet' and cfg['quantization_config']['linear_class'] == 'autobitlinear'
    assert (out / 'model.safetensors').exists() and (out / 'tokenizer.json').exists() and (out / 'report.json').exists()
    # stock transformers loads it and agrees with wf_nb.load (identical on most inputs; a seeded input, because on an unlucky one an
    # activation sits on an int8 rounding tie that the two compute in a different order, and one flipped code moves the logits ~1e-3)
    code = ("import torch, sys, wf_nb; from transformers import AutoModelForCausalLM; p=sys.argv[1]; "
            "a=AutoModelForCausalLM.from_pretrained(p).eval(); b=wf_nb.load(p).eval(); torch.manual_seed(0); x=torch.randint(0,1000,(2,16)); "
            "la, lb = a(x).logits, b(x).logits; print(type(a).__name__, float((la-lb).norm()/lb.norm()))")
    r = subprocess.run([sys.executable, '-c', code, str(out)], capture_output=True, text=True, timeout=300)
    name, rel = r.stdout.split()[-2:]
    assert name == 'BitNetForCausalLM' and float(rel) < 1e-3, r.stdout + r.stderr

def test_allocator_preloaded_and_recorded(wf, tmp_path):
    "`wf train` re-runs itself with tcmalloc preloaded where it is installed (training.allocator=auto) and records what ran it."
    from wf_nb.launch import allocator_library
    wf('train', '-s', '1', *TINY, env=ENV)
    run = only_run(tmp_path / 'runs', '1')
    assert json.loads((run / 'metadata.json').read_text())['allocator'] == ('tcmalloc' if allocator_library('tcmalloc') else 'system')
    wf('train', '-s', '1', *TINY, 'training.allocator=system', env=ENV)   # not in the fingerprint: the same run, already done
    assert only_run(tmp_path / 'runs', '1') == run
    wf('train', '-s', '1', *TINY, 'training.allocator=system', 'training.seed=1', env=ENV)
    new = [p for p in (tmp_path / 'runs').iterdir() if p != run]
    assert [json.loads((p / 'metadata.json').read_text())['allocator'] for p in new] == ['system']

def test_rerun_resumes_or_refuses(wf, tmp_path):
    args = ['train', '-s', '2', *TINY, 'training.max_steps=4', 'training.save_interval=2']
    wf(*args, env=ENV)
    runs = tmp_path / 'runs'
    s1, s2 = only_run(runs, '1'), only_run(runs, '2')           # stage 2 created its missing stage-1 parent
    meta = json.loads((s2 / 'metadata.json').read_text())
    assert meta['status'] == 'COMPLETED' and meta['lineage']['parent_run'] == s1.name
    before = (s2 / 'metrics.jsonl').read_text()
    r = wf(*args, env=ENV)                                        # same command again: nothing retrained
    assert 'already COMPLETED' in r.stderr
    assert (s2 / 'metrics.jsonl').read_text() == before
    wf(*args, '--skip-recovery', env=ENV)                         # a fresh run beside the finished one
    assert len([p for p in runs.iterdir() if p.name.startswith(s2.name)]) == 2
    table = wf('runs', env=ENV).stdout
    assert s2.name in table and 'COMPLETED' in table
    # prune: the finished runs' checkpoints go (after --yes), their outputs stay, and the finished command still finds them
    assert 'would free' in wf('runs', 'prune', env=ENV).stdout and list((s2 / 'checkpoints').glob('step_*'))
    assert 'freed' in wf('runs', 'prune', '--yes', env=ENV).stdout
    best = [json.loads((s2 / 'best.json').read_text())['checkpoint']] if (s2 / 'best.json').exists() else []
    assert [p.name for p in (s2 / 'checkpoints').glob('step_*')] == best and (s2 / 'final' / 'model.safetensors').exists()
    wf('runs', 'prune', '--yes', '--no-keep-best', env=ENV)
    assert not list((s2 / 'checkpoints').glob('step_*'))
    assert 'already COMPLETED' in wf(*args, env=ENV).stderr

def _start(tmp_path, *args):
    e = {**os.environ, 'WF_RUNS_DIR': str(tmp_path / 'runs'), **ENV}
    return subprocess.Popen([bin_path('wf'), *args], cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def _wait_for_step(runs_dir, stage, step, proc, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        try:
            d = only_run(runs_dir, stage)
            if max(step_losses(d), default=0) >= step: return d
        except (AssertionError, FileNotFoundError, json.JSONDecodeError, ValueError): pass
        time.sleep(0.2)
    raise TimeoutError(f'stage {stage} did not reach step {step}')

def _uninterrupted_losses(wf, root, args):
    "Per-step losses of the same run done in one go, in its own runs dir."
    root.mkdir(); wf(*args, env={**ENV, 'WF_RUNS_DIR': str(root / 'runs')})
    return step_losses(only_run(root / 'runs', '2'))

def test_sigkill_resume_is_exact(wf, tmp_path):
    args = ['train', '-s', '2', *TINY, 'training.max_steps=16', 'training.save_interval=3']
    expected = _uninterrupted_losses(wf, tmp_path / 'ref', args)
    p = _start(tmp_path, *args)
    d = _wait_for_step(tmp_path / 'runs', '2', 8, p)
    p.send_signal(signal.SIGKILL); p.wait()
    assert json.loads((d / 'metadata.json').read_text())['status'] == 'RUNNING'   # it never got to say anything
    assert max(step_losses(d)) < 16
    wf(*args, env=ENV)                                            # the same command resumes
    assert 'resumed from step_' in (d / 'train.log').read_text()
    got = step_losses(d)
    if got != expected:
        # Once in CI the reference process itself came out different from step 1 on, a forward before any
        # update, while the killed-and-resumed run matched an uninterrupted run on another machine at all 16 steps.
        # A process that disagrees with its peers before any kill is not a resume bug: a second reference decides.
        # A broken resume still fails, since it cannot match a correct reference.
        again = _uninterrupted_losses(wf, tmp_path / 'ref2', args)
        assert got == again, (got, expected, again)               # bit-identical per-step losses
    assert json.loads((d / 'metadata.json').read_text())['status'] == 'COMPLETED'

def test_sigint_saves_and_stops(wf, tmp_path):
    p = _start(tmp_path, 'train', '-s', '2', *TINY, 'training.max_steps=500', 'training.save_interval=1000')
    d = _wait_for_step(tmp_path / 'runs', '2', 3, p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, err                               # interrupted: a distinct exit code
    meta = json.loads((d / 'metadata.json').read_text())
    assert meta['status'] == 'INTERRUPTED', meta
    ck = sorted((d / 'checkpoints').glob('step_*'))
    last = max(step_losses(d))
    assert ck and int(ck[-1].name[5:]) == last and last < 500
    logs = wf('logs', d.name, env=ENV).stdout
    assert 'INTERRUPTED' in logs and '"loss"' in logs

def test_run_outlives_its_reader(tmp_path):
    "`wf train ... | head -1`: the reader leaves after one line; the stages still complete, and `wf` says so by its exit code."
    e = {**os.environ, 'WF_RUNS_DIR': str(tmp_path / 'runs'), **ENV}
    p = subprocess.Popen([bin_path('wf'), 'train', '-s', '2', *TINY, 'training.max_steps=6'], cwd=tmp_path, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.stdout.readline()        # the first line of output (Stage 1 is made first), then the reader is gone
    p.stdout.close()
    assert p.wait(timeout=600) == 0
    for stage in ('1', '2'):
        meta = json.loads((only_run(tmp_path / 'runs', stage) / 'metadata.json').read_text())
        assert meta['status'] == 'COMPLETED', meta    # before: FAILED, BrokenPipeError, while `wf` exited 0

def test_cancel_running_run(wf, tmp_path):
    p = _start(tmp_path, 'train', '-s', '2', *TINY, 'training.max_steps=500', 'training.save_interval=1000')
    d = _wait_for_step(tmp_path / 'runs', '2', 2, p)
    r = wf('cancel', d.name, env=ENV)
    assert 'sent SIGINT' in r.stdout
    p.communicate(timeout=300)
    assert json.loads((d / 'metadata.json').read_text())['status'] == 'INTERRUPTED'
    assert 'nothing to cancel' in wf('cancel', d.name, env=ENV).stdout

def test_bad_input_is_a_clear_error(wf):
    r = wf('train', '-m', 'tiny_llama', 'training.lrr=1', check=False)
    assert r.returncode == 2 and "Did you mean 'lr'" in r.stderr
    r = wf('train', '-s', '2', *TINY, 'data.source=/no/such/corpus', 'training.max_steps=1', check=False, env=ENV)
    assert r.returncode != 0 and '/no/such/corpus' in r.stderr
    r = wf('logs', 'no-such-run', check=False)
    assert r.returncode == 2 and 'wf runs' in r.stderr

def test_smoke_real_model(wf, tmp_path):
    "The README's main job: real SmolLM2 + Shakespeare, stage 1 -> 1.9, offline, loss going down."
    r = wf('smoke', timeout=1200, env=ENV)
    assert 'wf smoke: OK' in r.stdout, r.stdout + r.stderr

def test_export_generate_eval(wf, tmp_path):
    "A finished run -> packed hf-bitnet export (stock transformers loads it) -> generation -> perplexity + MC eval."
    wf('train', '-s', '1', *TINY, env=ENV)
    run = only_run(tmp_path / 'runs', '1').name
    r = wf('export', run, '--format', 'hf-bitnet', '--out', tmp_path / 'packed', env=ENV)
    assert 'bits' in r.stdout, r.stdout
    cfg = json.loads((tmp_path / 'packed' / 'config.json').read_text())
    assert cfg['quantization_config']['linear_class'] == 'bitlinear' and cfg['quantization_config']['quantization_mode'] == 'offline'
    r = wf('export', run, '--format', 'hf-bitnet', '--out', tmp_path / 'packed', check=False, env=ENV)
    assert r.returncode != 0 and 'exists' in (r.stderr + r.stdout)                 # never overwritten silently
    r = wf('generate', tmp_path / 'packed', '--prompt', 'To be, or not', '--max-new-tokens', '5', env=ENV)
    assert r.stdout.strip(), r.stdout
    assert 'decode' in r.stderr and 'tokens/s (wf_nb fast path)' in r.stderr, r.stderr     # issue 32: speed, from the fast path
    r8 = wf('generate', tmp_path / 'packed', '--prompt', 'To be, or not', '--max-new-tokens', '5', '--head', 'q8', env=ENV)
    assert r8.stdout.strip() and 'tokens/s (wf_nb fast path)' in r8.stderr, r8.stderr   # the opt-in int8 head (not exact)
    r = wf('generate', tmp_path / 'packed', '--prompt', 'x', '--max-new-tokens', '100000', check=False, env=ENV)
    assert r.returncode == 2 and "past the model's context" in r.stderr and 'Traceback' not in r.stderr, r.stderr
    (tmp_path / 'heldout.txt').write_text('Now is the winter of our discontent made glorious summer. ' * 20)
    items = _mc_with_known_answers(tmp_path / 'runs' / run)
    (tmp_path / 'mc.jsonl').write_text(''.join(json.dumps(it) + '\n' for it in items))
    r = wf('eval', run, '--data', tmp_path / 'heldout.txt', '--mc', tmp_path / 'mc.jsonl', '--json', tmp_path / 'eval.json', env=ENV)
    res = json.loads((tmp_path / 'eval.json').read_text())
    ppl = res['perplexity']['perplexity']
    assert ppl > 1 and ppl == ppl and ppl != float('inf') and res['perplexity']['n_tokens'] > 100, res
    # every label is the choice the model prefers (scored another way: one unpadded forward per choice), at index 0 and 1
    # in turn: a correct `wf eval` scores 1.0, one that always picks the same index 0.5, an inverted one 0.0
    assert res['mc']['n'] == len(items) >= 4 and res['mc']['acc'] == 1.0, (res['mc'], items)

MC_CANDIDATES = [('The cat sat on the', [' mat', ' moon']), ('To be, or not to', [' be', ' sing']), ('Good night, sweet', [' prince', ' table']),
                 ('Now is the winter of our', [' discontent', ' breakfast']), ('All the world', ["'s a stage", ' is blue']),
                 ('Friends, Romans,', [' countrymen', ' bicycles']), ('The lady doth protest too', [' much', ' green']),
                 ('A horse! A horse! My kingdom for a', [' horse', ' spoon']), ('What light through yonder window', [' breaks', ' sleeps']),
                 ('Once more unto the', [' breach', ' kitchen'])]

def _mc_with_known_answers(run_dir, margin=1e-3):
    """Two-choice items whose answer is known: the run's model scored with stock code (wf_nb.load, one forward per choice,
    no padding or batching), kept where it prefers one choice by more than `margin` nats; the label is always the
    preferred choice, put first and second in turn, so a correct `wf eval` reports accuracy exactly 1.0."""
    code = ("import json, sys, torch, wf_nb; from transformers import AutoTokenizer; from wf_nb.registry import Run, run_output\n"
            "p = run_output(Run(__import__('pathlib').Path(sys.argv[1]))); m = wf_nb.load(p).eval(); tok = AutoTokenizer.from_pretrained(p)\n"
            "out = []\n"
            "for ctx, choices in json.loads(sys.argv[2]):\n"
            "    n, lps = len(tok(ctx, add_special_tokens=False).input_ids), []\n"
            "    for ch in choices:\n"
            "        ids = tok(ctx + ch, add_special_tokens=False).input_ids\n"
            "        with torch.no_grad(): lp = m(torch.tensor([ids])).logits[0].double().log_softmax(-1)\n"
            "        lps.append(sum(lp[i - 1, ids[i]].item() for i in range(n, len(ids))))\n"
            "    out.append(lps)\n"
            "print(json.dumps(out))")
    r = subprocess.run([sys.executable, '-c', code, str(run_dir), json.dumps(MC_CANDIDATES)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, **ENV})
    assert r.returncode == 0, r.stderr[-3000:]
    items = []
    for (ctx, choices), lps in zip(MC_CANDIDATES, json.loads(r.stdout.strip().splitlines()[-1])):
        if abs(lps[0] - lps[1]) <= margin: continue
        best, want = int(lps[1] > lps[0]), len(items) % 2          # the preferred choice goes to index 0, 1, 0, 1, ...
        items.append({'context': ctx, 'choices': list(choices) if best == want else list(choices)[::-1], 'label': want})
    return items[:len(items) // 2 * 2]   # as many answers at index 0 as at 1

def test_pipeline_runs_stages_on_one_budget(wf, tmp_path):
    args = ['pipeline', *TINY, '--tokens', '256', '--split', '0.5']   # 64 tokens a step: 2 steps of 1.9, 2 of 2
    r = wf(*args, env=ENV)
    assert 'wf pipeline: COMPLETED' in r.stdout
    runs = tmp_path / 'runs'
    s19, s2 = only_run(runs, '1.9'), only_run(runs, '2')
    assert len([m for m in metrics(s19) if 'loss' in m]) == 2 and len([m for m in metrics(s2) if 'loss' in m]) == 2
    lin = json.loads((s2 / 'metadata.json').read_text())['lineage']
    assert lin['parent_output'] == f'{s19.name}/final' and lin['parent_run'] == s19.name and len(lin['parent_sha256']) == 64
    import yaml   # the conversion data of a model trained from scratch (no teacher to sample): `general` (wf_nb.stages.PIPELINE_DATA_NO_TEACHER), or Shakespeare where a part is missing, said
    mixture = yaml.safe_load((s2 / 'config.yaml').read_text())['data']['mixture']
    assert mixture == 'general' or (mixture == '' and 'training on Shakespeare only' in r.stdout + r.stderr), (mixture, r.stdout[-2000:])
    again = wf(*args, env=ENV)                                    # nothing retrained
    assert again.stderr.count('already completed') + again.stdout.count('already completed') == 2

def test_soak_kill_short():
    "The soak benchmark's short version (issue 13): random SIGKILLs, each resumed; final weights and metrics as uninterrupted."
    root = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, str(root / 'benchmarks' / 'soak_kill.py'), '--kills', '3', '--steps', '60'],
                       capture_output=True, text=True, timeout=900, env={**os.environ, **ENV})
    assert r.returncode == 0 and '| True | True |' in r.stdout, r.stdout + r.stderr[-3000:]
