"""A catalogue of bad inputs and faults, by command (issue 13): each must end with one `wf CMD: error: ...` line and a
documented exit code (never a traceback), name the problem, and leave inputs and outputs as they were.

One tiny corpus, one shard folder and one completed Stage 1 -> Stage 2 lineage (`tiny_llama`, 2 steps) are shared
by every case to keep the file fast."""
import hashlib, json, os, shutil, signal, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest
from conftest import bin_path

TINY = ['-m', 'tiny_llama', 'data.seq_len=32', 'training.batch_size=2', 'logging.interval=1']
ENV = {'OMP_NUM_THREADS': '1', 'WANDB_MODE': 'disabled', 'HF_HUB_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false'}

def tree_hash(*paths) -> str:
    "One digest of every file (path, bytes) under `paths`."
    h = hashlib.sha256()
    for root in map(Path, paths):
        files = sorted(p for p in root.rglob('*') if p.is_file()) if root.is_dir() else [root] if root.exists() else []
        for p in files:
            if p.name in ('.lock', '.wf_verified.json'): continue   # process bookkeeping (the lock holder's pid, verified shards)
            h.update(str(p).encode()); h.update(p.read_bytes())
    return h.hexdigest()

class W:
    def __init__(self, root): self.root = root; self.runs = root/'runs'
    def __call__(self, *args, code=0, has=(), env=None, timeout=600, runs=None):
        e = {**os.environ, **ENV, 'WF_RUNS_DIR': str(runs or self.runs), **(env or {})}
        r = subprocess.run([bin_path('wf'), *map(str, args)], cwd=self.root, capture_output=True, text=True, timeout=timeout, env=e)
        msg = f"wf {' '.join(map(str, args))} -> {r.returncode}\n--- stdout\n{r.stdout[-2000:]}\n--- stderr\n{r.stderr[-3000:]}"
        assert r.returncode == code, msg
        assert 'Traceback' not in r.stderr, msg
        if code not in (0, 130, 143):
            last = r.stderr.strip().splitlines()[-1]
            assert last.startswith('wf ') and 'error' in last, msg
        for h in ([has] if isinstance(has, str) else has): assert h in r.stderr + r.stdout, msg
        return r
    @property
    def inputs(self): return [self.root/n for n in ('corpus', 'shards', 'latin', 'binary', 'mine')] + [self.runs]

@pytest.fixture(scope='module')
def w(module_tmp):
    root = module_tmp('bad'); w = W(root)
    from wf_nb.assets import shakespeare_files
    (root/'corpus').mkdir()
    for f in shakespeare_files()[:3]: (root/'corpus'/f.name).write_text(f.read_text()[:15000])
    (root/'latin').mkdir(); (root/'latin'/'a.txt').write_bytes('Caf\u00e9 na\u00efve '.encode('latin-1') * 200)
    (root/'binary').mkdir(); (root/'binary'/'a.txt').write_bytes(bytes(range(256)) * 40)
    (root/'mine').mkdir(); (root/'mine'/'notes.txt').write_text('precious')
    w('data', 'tokenize', '--source', root/'corpus', '--output-path', root/'shards', '--shard-tokens', '3000', '-m', 'tiny_llama')
    w('train', '-s', '2', *TINY, 'training.max_steps=2', 'training.save_interval=1', f'data.source={root/"corpus"}',
      f'data.shards_dir={root/"cache"}')
    metas = {p.name: json.loads((p/'metadata.json').read_text()) for p in w.runs.iterdir()}
    w.s1 = next(w.runs/k for k, m in metas.items() if m['stage'] == '1')
    w.s2 = next(w.runs/k for k, m in metas.items() if m['stage'] == '2')
    w.s2_args = ['train', '-s', '2', *TINY, 'training.max_steps=2', 'training.save_interval=1', f'data.source={root/"corpus"}',
                 f'data.shards_dir={root/"cache"}']
    return w

@pytest.fixture
def same(w):
    "Assert that the case left every shared input and run untouched."
    before = tree_hash(*w.inputs); yield w
    assert tree_hash(*w.inputs) == before, 'inputs or runs changed'

# ---------------------------------------------------------------- wf train / wf config: refused at config time
CONFIG_CASES = [
    (['training.lrr=1'], "Did you mean 'lr'"), (['training.lr=nan'], 'training.lr=nan'), (['training.lr=-1'], 'training.lr'),
    (['training.lr=inf'], 'out of range'), (['training.warmup_steps=-5'], 'training.warmup_steps'),
    (['training.grad_clip=-1'], 'training.grad_clip'), (['data.val_fraction=1'], 'data.val_fraction'),
    (['data.val_fraction=-0.5'], 'data.val_fraction'), (['model.num_heads=0'], 'model.num_heads'),
    (['model=no_such_model'], 'no_such_model'), (['training.batch_size=0'], 'training.batch_size'),
    (['training.max_steps=abc'], 'not a valid int'), (['foo'], 'must look like group.key=value'), (['--frobnicate'], 'unrecognized'),
    (['-s', '7'], 'unknown stage'), (['quant.placement=sideways'], 'quant.placement'), (['data.fim_rate=2'], 'data.fim_rate'),
    (['training.beta2=1'], 'training.beta2'), (['training.allocator=bogus'], 'training.allocator'),
    (['quant.rotation=spin'], 'quant.rotation'), (['quant.haar=true', 'quant.rotation=values'], 'use one'),
]
@pytest.mark.parametrize('extra,has', CONFIG_CASES, ids=[c[0][-1] for c in CONFIG_CASES])
def test_train_config_errors(same, extra, has):
    same('train', *TINY, *extra, code=2, has=has)

def _installed(name):
    from wf_nb.launch import allocator_library
    return allocator_library(name) is not None

@pytest.mark.skipif(_installed('jemalloc'), reason='jemalloc is installed on this machine')
def test_train_allocator_not_installed(same):
    same('train', *TINY, 'training.allocator=jemalloc', code=2, has=('training.allocator=jemalloc', 'apt-get install libjemalloc2'))

def test_config_command_errors(same):
    same('config', '-m', 'tiny_llama', '--runs-dir', same.root/'x', 'model.num_heads=0', code=2, has='model.num_heads')
    same('config', '-m', 'tiny_llama', '--runs-dir', same.root/'x', 'training.lr=1e-4', code=0, has='lr: 0.0001')  # overrides after options

def test_train_out_existing_folder(same):
    same('train', '-s', '1', *TINY, '--out', same.root/'mine', code=2, has='already exists')

def test_train_out_on_completed_run(w):
    out = w.root/'out_done'
    before = tree_hash(w.runs)
    w(*w.s2_args, '--out', out, code=0, has='already COMPLETED')
    assert (out/'config.json').exists() and (out/'model.safetensors').exists()
    assert tree_hash(w.runs) == before
    w(*w.s2_args, '--out', out, code=2, has='already exists')          # never overwritten

def test_train_completed_is_nothing_to_do(same):
    same(*same.s2_args, code=0, has='already COMPLETED')

def test_run_name_cannot_escape(w, tmp_path):
    runs = tmp_path/'r'/'runs'
    w('train', '-s', '1', *TINY, 'model.name=../../ESCAPED', runs=runs, code=0)
    assert not list(tmp_path.rglob('ESCAPED')) and not (tmp_path/'ESCAPED').exists()
    (d,) = list(runs.iterdir()); assert d.name.startswith('_.._ESCAPED-s1-'), d

def test_run_locked_by_another_process(w, tmp_path):
    from wf_nb.config import get_config, fingerprint
    from wf_nb.registry import run_id_for
    cfg = get_config(TINY[2:], stage='1', model='tiny_llama')
    rdir = tmp_path/'runs'/run_id_for(cfg, fingerprint(cfg))              # the commit of wf_nb's checkout, as `wf` computes it
    holder = subprocess.Popen([sys.executable, '-c', 'import sys, time; from wf_nb.registry import lock_run; lock_run(sys.argv[1]); '
                               'print("ok", flush=True); time.sleep(120)', str(rdir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'ok'
        w('train', '-s', '1', *TINY, runs=tmp_path/'runs', code=1, has=f'process {holder.pid}')
        assert not (rdir/'metadata.json').exists()
    finally: holder.kill(); holder.wait()

def test_two_identical_trains_at_once(w, tmp_path):
    e = {**os.environ, **ENV, 'WF_RUNS_DIR': str(tmp_path/'runs')}
    args = [bin_path('wf'), 'train', '-s', 'pretrain', *TINY, 'training.max_steps=6', f'data.source={w.root/"shards"}']
    ps = [subprocess.Popen(args, cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in ps]
    codes = sorted(p.returncode for p in ps)
    (d,) = list((tmp_path/'runs').iterdir())
    steps = [json.loads(l)['step'] for l in (d/'metrics.jsonl').read_text().splitlines() if '"loss"' in l]
    assert steps == [1, 2, 3, 4, 5, 6], (steps, outs)                        # every step once
    assert codes[0] == 0 and (codes[1] == 1 or 'already COMPLETED' in ''.join(o[1] for o in outs)), (codes, outs)
    if codes[1] == 1: assert any('being trained by process' in o[1] for o in outs), outs

def test_all_checkpoints_damaged(w, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    run = runs/w.s2.name; m = json.loads((run/'metadata.json').read_text()); m['status'] = 'INTERRUPTED'
    (run/'metadata.json').write_text(json.dumps(m))
    for ck in (run/'checkpoints').glob('step_*'):
        f = ck/'model.safetensors'; b = bytearray(f.read_bytes()); b[-1] ^= 1; f.write_bytes(bytes(b))
    before = tree_hash(run/'checkpoints', run/'metrics.jsonl')
    w(*w.s2_args, runs=runs, code=2, has=['are damaged', '--skip-recovery'])
    assert tree_hash(run/'checkpoints', run/'metrics.jsonl') == before

def test_kill_before_first_checkpoint_no_duplicate_metrics(w, tmp_path):
    e = {**os.environ, **ENV, 'WF_RUNS_DIR': str(tmp_path/'runs')}
    args = ['train', '-s', 'pretrain', *TINY, 'training.max_steps=5', 'training.save_interval=1000', f'data.source={w.root/"shards"}']
    p = subprocess.Popen([bin_path('wf'), *args], cwd=tmp_path, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 300:
        ms = list((tmp_path/'runs').glob('*/metrics.jsonl'))
        if ms and ms[0].read_text().count('"loss"') >= 2: break
        time.sleep(0.1)
    p.kill(); p.wait()
    r = w(*args, runs=tmp_path/'runs', code=0)
    (d,) = list((tmp_path/'runs').iterdir())
    steps = [json.loads(l)['step'] for l in (d/'metrics.jsonl').read_text().splitlines() if '"loss"' in l]
    assert steps == [1, 2, 3, 4, 5], steps
    assert 'cleared' in (d/'train.log').read_text()

def test_sigterm_exits_143_and_resumes(w, tmp_path):
    e = {**os.environ, **ENV, 'WF_RUNS_DIR': str(tmp_path/'runs')}
    args = ['train', '-s', 'pretrain', *TINY, 'training.max_steps=400', 'training.save_interval=1000', f'data.source={w.root/"shards"}']
    p = subprocess.Popen([bin_path('wf'), *args], cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 300 and not list((tmp_path/'runs').glob('*/metrics.jsonl')): time.sleep(0.1)
    p.send_signal(signal.SIGTERM); out, err = p.communicate(timeout=300)
    assert p.returncode == 143, err
    (d,) = list((tmp_path/'runs').iterdir())
    assert json.loads((d/'metadata.json').read_text())['status'] == 'INTERRUPTED'

def test_pipeline_sigterm_exits_143(w, tmp_path):
    e = {**os.environ, **ENV, 'WF_RUNS_DIR': str(tmp_path/'runs')}
    args = ['pipeline', *TINY, '--tokens', '100000', 'training.save_interval=1000', f'data.source={w.root/"shards"}']
    p = subprocess.Popen([bin_path('wf'), *args], cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 300 and not list((tmp_path/'runs').glob('*-s2-*/metrics.jsonl')): time.sleep(0.1)
    p.send_signal(signal.SIGTERM); out, err = p.communicate(timeout=300)
    assert p.returncode == 143, (out, err)                       # as `wf train`: scripts can tell "stopped" from "done"
    (d,) = list((tmp_path/'runs').glob('*-s2-*'))
    assert json.loads((d/'metadata.json').read_text())['status'] == 'INTERRUPTED'

def test_train_bad_corpus(same, tmp_path):
    common = ['train', '-s', 'pretrain', *TINY, 'training.max_steps=1', f'data.shards_dir={tmp_path/"cache"}']
    same(*common, f'data.source={same.root/"latin"}', runs=tmp_path/'runs', code=2, has=['byte offset', 'data.encoding=latin-1'])
    same(*common, f'data.source={same.root/"binary"}', runs=tmp_path/'runs', code=2, has='looks binary')
    same(*common, f'data.source={tmp_path/"nothing"}', runs=tmp_path/'runs', code=2, has='does not exist')

def test_train_corrupted_shard(w, tmp_path):
    bad = tmp_path/'shards'; shutil.copytree(w.root/'shards', bad)
    for f in bad.glob('tokens_*.npy'): b = bytearray(f.read_bytes()); b[-2] ^= 1; f.write_bytes(bytes(b))
    w('train', '-s', 'pretrain', *TINY, 'training.max_steps=1', f'data.source={bad}', runs=tmp_path/'runs', code=2, has='SHA-256')

def test_truncated_parent_checkpoint(w, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    f = runs/w.s1.name/'final'/'model.safetensors'; f.write_bytes(f.read_bytes()[:1000])
    # the copy's runs resolve their outputs inside the copy (relative lineage): the damaged parent is the copy's, not w.runs'
    r = subprocess.run([bin_path('wf'), 'train', '-s', '2', *TINY, 'training.max_steps=3', f'data.source={w.root/"corpus"}',
                        f'data.shards_dir={w.root/"cache"}'], cwd=w.root, capture_output=True, text=True,
                       env={**os.environ, **ENV, 'WF_RUNS_DIR': str(runs)}, timeout=600)
    assert r.returncode in (1, 2) and 'Traceback' not in r.stderr and r.stderr.strip().splitlines()[-1].startswith('wf train: error:'), r.stderr
    assert f'{f} is damaged or truncated' in r.stderr, r.stderr

# ---------------------------------------------------------------- wf runs / logs / cancel
def test_runs_with_damaged_metadata(w, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    (runs/w.s1.name/'metadata.json').write_text('{"status": "COMPL')
    r = w('runs', runs=runs, code=0, has=[str(runs/w.s1.name/'metadata.json'), 'DAMAGED'])
    assert w.s2.name in r.stdout

def test_logs_with_damaged_metrics_line(w, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    with open(runs/w.s2.name/'metrics.jsonl', 'a') as f: f.write('{"step": 9, "lo\n')
    w('logs', w.s2.name, runs=runs, code=0)
    w('runs', runs=runs, code=0, has=w.s2.name)

def test_logs_into_head_no_broken_pipe(w, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    (runs/w.s2.name/'metrics.jsonl').write_text(''.join(json.dumps({'step': i, 'loss': 1.0, 'pad': 'x' * 200}) + '\n' for i in range(3000)))
    r = subprocess.run(f"'{bin_path('wf')}' logs {w.s2.name} -n 100000 | head -2", shell=True, cwd=w.root, capture_output=True,
                       text=True, env={**os.environ, **ENV, 'WF_RUNS_DIR': str(runs)}, timeout=300)
    assert 'Traceback' not in r.stderr and 'BrokenPipe' not in r.stderr and len(r.stdout.splitlines()) == 2, r.stderr

@pytest.mark.parametrize('cmd', ['logs', 'cancel'])
def test_unknown_run(same, cmd):
    same(cmd, 'no-such-run', code=2, has='wf runs')

# ---------------------------------------------------------------- wf smoke / generate / eval / export
def test_smoke_steps_zero(same): same('smoke', '--steps', '0', code=2, has='--steps')
def test_generate_empty_prompt(same): same('generate', same.s1.name, '--prompt', '', code=2, has='--prompt is empty')
def test_generate_unknown_run(same): same('generate', 'no-such-run', '--prompt', 'x', code=2, has='no run')
def test_generate_head_needs_packed(same): same('generate', same.s1.name, '--prompt', 'x', '--head', 'q8', code=2, has='is not a packed export')

def test_eval_bad_inputs(same, tmp_path):
    (tmp_path/'empty.jsonl').write_text('\n\n')
    same('eval', same.s1.name, '--mc', tmp_path/'empty.jsonl', code=2, has='has no items')
    (tmp_path/'bool.jsonl').write_text(json.dumps({'context': 'a', 'choices': [' b', ' c'], 'label': True}) + '\n')
    same('eval', same.s1.name, '--mc', tmp_path/'bool.jsonl', code=2, has="'label' is True")
    (tmp_path/'range.jsonl').write_text(json.dumps({'context': 'a', 'choices': [' b', ' c'], 'label': 5}) + '\n')
    same('eval', same.s1.name, '--mc', tmp_path/'range.jsonl', code=2, has="'label' is 5")
    (tmp_path/'broken.jsonl').write_text('{"context": \n')
    same('eval', same.s1.name, '--mc', tmp_path/'broken.jsonl', code=2, has='not valid JSON')
    (tmp_path/'jdir').mkdir()
    same('eval', same.s1.name, '--json', tmp_path/'jdir', '--mc', tmp_path/'range.jsonl', code=2, has='is a folder')
    assert not list((tmp_path/'jdir').iterdir()) and not list(tmp_path.glob('.jdir*'))

def test_export_bad_inputs(same, tmp_path):
    same('export', 'no-such-run', '--out', tmp_path/'x', code=2, has='no run')
    same('export', same.s1.name, '--out', same.root/'mine', code=2, has='exists')
    same('export', same.s1.name, '--format', 'onnx', '--out', tmp_path/'y', code=2, has='invalid choice')

# ---------------------------------------------------------------- wf data
def test_tokenize_never_deletes_what_it_did_not_write(same):
    T = ['data', 'tokenize', '-m', 'tiny_llama', '--source', same.root/'corpus', '--overwrite']
    same(*T, '--output-path', same.root/'mine', code=2, has='not a wf_nb token-shard folder')
    same(*T, '--output-path', same.root/'corpus', code=2, has='the source')             # output == source
    same(*T, '--output-path', same.root, code=2, has='contains the source')           # output contains source
    same(*T, '--output-path', same.root/'corpus'/'tok', code=2, has='inside the source')
    same('data', 'tokenize', '-m', 'tiny_llama', '--source', same.root/'corpus', '--output-path', same.root/'shards', code=2, has='already holds')
    assert '--overwrite' in same('data', 'tokenize', '--help').stdout and 'never replaced' in same('data', 'tokenize', '--help').stdout

def test_tokenize_bad_text(same, tmp_path):
    T = ['data', 'tokenize', '-m', 'tiny_llama', '--output-path', tmp_path/'o']
    same(*T, '--source', same.root/'latin', code=2, has=['byte offset', 'a.txt', 'latin-1'])
    same(*T, '--source', same.root/'binary', code=2, has='looks binary')
    same(*T, '--source', tmp_path/'nothing', code=2, has='does not exist')
    same(*T, '--source', same.root/'latin', '--encoding', 'latin-1', code=0)                 # knowingly

def test_split_and_validate(same, tmp_path):
    S = ['data', 'split', '--data-path', same.root/'shards']
    for bad in ('1', '1.5', '-0.1', 'nan'):
        same(*S, '--output-path', tmp_path/f's{bad}', '--val-ratio', bad, code=2, has='must be in [0, 1)')
    same(*S, '--output-path', tmp_path/'s0', '--val-ratio', '0', code=0)
    assert not (tmp_path/'s0'/'val').exists() and len(list((tmp_path/'s0'/'train').glob('tokens_*'))) == len(list((same.root/'shards').glob('tokens_*')))
    same(*S, '--output-path', same.root/'mine', code=2, has='already exists')
    same('data', 'validate', '--data-path', tmp_path/'nothing', code=2, has='does not exist')

def test_validate_corrupted_shard(w, tmp_path):
    bad = tmp_path/'shards'; shutil.copytree(w.root/'shards', bad)
    f = sorted(bad.glob('tokens_*.npy'))[0]; b = bytearray(f.read_bytes()); b[-2] ^= 1; f.write_bytes(bytes(b))
    r = subprocess.run([bin_path('wf'), 'data', 'validate', '--data-path', bad], capture_output=True, text=True, env={**os.environ, **ENV})
    assert r.returncode == 1 and 'checksum mismatch' in r.stdout and 'Traceback' not in r.stderr, r.stdout + r.stderr

# ---------------------------------------------------------------- the machine: read-only folder, disk full (tmpfs)
def _can_mount():
    if not shutil.which('unshare'): return False
    r = subprocess.run(['unshare', '-rm', 'sh', '-c', 'd=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs "$d"'], capture_output=True)
    return r.returncode == 0
needs_mount = pytest.mark.skipif(not _can_mount(), reason='cannot mount a tmpfs here (no unprivileged user+mount namespaces)')

def _in_tmpfs(w, mnt, opts, *args, after=''):
    "Run `wf *args` with the runs folder on a fresh tmpfs (in a private mount namespace); `after`: a shell command run there next."
    wf = ' '.join(f"'{a}'" for a in [bin_path('wf'), *map(str, args)])
    cmd = f"mount -t tmpfs -o {opts} tmpfs '{mnt}' && {'mkdir -p ' + repr(str(mnt/'runs')) + ' &&' if 'ro' not in opts.split(',') else ''} " + \
          (f"{{ {wf}; rc=$?; {after}; exit $rc; }}" if after else f"exec {wf}")
    return subprocess.run(['unshare', '-rm', 'sh', '-c', cmd], cwd=w.root, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **ENV, 'WF_RUNS_DIR': str(mnt/'runs')})

@needs_mount
def test_read_only_runs_folder(w, tmp_path):
    mnt = tmp_path/'ro'; mnt.mkdir()
    r = _in_tmpfs(w, mnt, 'ro,size=1m', 'train', '-s', '1', *TINY)
    assert r.returncode == 4 and 'Traceback' not in r.stderr and 'Read-only' in r.stderr.strip().splitlines()[-1], r.stderr

@needs_mount
def test_disk_full_during_checkpoint(w, tmp_path):
    mnt = tmp_path/'full'; mnt.mkdir()
    r = _in_tmpfs(w, mnt, 'size=60m', 'train', '-s', 'pretrain', *TINY, 'training.max_steps=50', 'training.save_interval=1',
                  'training.keep_last=100', f'data.source={w.root/"shards"}',
                  after=f"'{sys.executable}' -c \"from wf_nb.checkpoint import list_checkpoints, verify_checkpoint; import glob; "
                        f"c = list_checkpoints(glob.glob('{mnt}/runs/*')[0]); verify_checkpoint(c[-1]); print('VERIFIED', len(c), c[-1].name)\"")
    last = [l for l in r.stderr.strip().splitlines() if l.startswith('wf train:')]
    assert r.returncode == 4 and 'Traceback' not in r.stderr and last and 'no space left on device' in last[-1], r.stderr[-3000:]
    # the checkpoints written before the disk filled are still there, and the newest one is complete (checksums verified)
    assert 'VERIFIED' in r.stdout and int(r.stdout.split('VERIFIED')[1].split()[0]) >= 1, (r.stdout[-2000:], r.stderr[-2000:])

@needs_mount
def test_disk_full_during_tokenize(w, tmp_path):
    mnt = tmp_path/'full2'; mnt.mkdir()
    cmd = (f"mount -t tmpfs -o size=12k tmpfs '{mnt}' && exec '{bin_path('wf')}' data tokenize -m tiny_llama --source "
           f"'{w.root/'corpus'}' --output-path '{mnt/'tok'}'")
    r = subprocess.run(['unshare', '-rm', 'sh', '-c', cmd], cwd=w.root, capture_output=True, text=True, timeout=600, env={**os.environ, **ENV})
    assert r.returncode == 4 and 'Traceback' not in r.stderr and 'no space left' in r.stderr, r.stderr[-3000:]

# ---------------------------------------------------------------- issue 34: the commands added since issue 13
@pytest.fixture
def wfi(w, capsys, monkeypatch):
    "Run `wf ARGS` in this process (`wf_nb.cli.main`): a refusal costs no interpreter start (3-5 s); same checks as `W`."
    from wf_nb.cli import main
    monkeypatch.chdir(w.root)
    def run(*args, code=0, has=(), runs=None, env=None):
        monkeypatch.setenv('WF_RUNS_DIR', str(runs or w.runs))
        for k, v in {**ENV, **(env or {})}.items(): monkeypatch.setenv(k, v)
        capsys.readouterr()
        rc = main(list(map(str, args)))
        out, err = capsys.readouterr()
        msg = f"wf {' '.join(map(str, args))} -> {rc}\n--- stdout\n{out[-2000:]}\n--- stderr\n{err[-3000:]}"
        assert rc == code, msg
        if code not in (0, 130, 143): assert err.strip().splitlines()[-1].startswith('wf ') and 'error' in err, msg
        for h in ([has] if isinstance(has, str) else has): assert h in err + out, msg
        return out + err
    return run

def bomb(levels=6):
    "A billion-laughs YAML: `levels` anchors, each nine aliases of the one before (9**levels strings when expanded)."
    lines = ['a0: &a0 "lol"'] + [f"a{i}: &a{i} [{', '.join([f'*a{i-1}'] * 9)}]" for i in range(1, levels + 1)]
    return '\n'.join(lines) + f"\ntraining: {{lr: *a{levels}}}\n"

def test_export_overwrite_never_deletes_what_wf_did_not_write(same, wfi, tmp_path):
    X = ['export', same.s1.name, '--format', 'wf-packed', '--overwrite']
    wfi(*X, '--out', same.root/'mine', code=2, has='not a wf_nb output')
    wfi(*X, '--out', same.s1/'final', code=2, has='is the source checkpoint')
    wfi(*X, '--out', same.s2, code=2, has='is the run')
    for o in (same.runs, same.root): wfi(*X, '--out', o, code=2, has='contains the source checkpoint')
    out = tmp_path/'exp'
    wfi(*X, '--out', out); wfi(*X, '--out', out)                                  # an earlier export is replaced
    (out/'notes.txt').write_text('mine')
    wfi(*X, '--out', out, code=2, has='1 file(s) wf_nb did not write (notes.txt)')
    assert (out/'notes.txt').read_text() == 'mine'

def test_ablate_override_of_the_ablated_key(same, wfi, tmp_path):
    A = ['ablate', 'haar', '--protocol', 'tiny', '--seeds', '1', '--work-dir', tmp_path/'w', '--report-dir', tmp_path/'r']
    wfi(*A, 'quant.haar=true', code=2, has='sets quant.haar, which the haar ablation varies')
    wfi(*A, '--max-steps', '-5', code=2, has='--max-steps -5')
    assert not list(tmp_path.glob('[wr]/*'))

def test_yaml_bombs_refused(w, wfi, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    (runs/w.s1.name/'config.yaml').write_text(bomb())                             # the parent lookup reads it
    wfi(*w.s2_args, 'training.max_steps=3', runs=runs, code=2, has=['aliases (*name) are not allowed', str(runs/w.s1.name/'config.yaml')])
    (tmp_path/'prices.yaml').write_text(bomb().replace('training: {lr:', 'A100: {on_demand:'))
    wfi('launch', '--backend', 'local', '-m', 'tiny_llama', '--dry-run', '--out', tmp_path/'l', env={'WF_GPU_PRICES': str(tmp_path/'prices.yaml')},
        code=2, has=['aliases (*name) are not allowed', 'WF_GPU_PRICES'])
    r = wfi('train', *TINY, 'training.lr=' + 'x' * 100_000, code=2, has='is not a valid float')
    assert len(r) < 2000                                                           # the value is cut in the message

def test_launch_spec_never_overwritten(same, wfi, tmp_path):
    L = ['launch', '--backend', 'skypilot', '-m', 'tiny_llama', '--dry-run', '--out', tmp_path/'l']
    wfi(*L); spec = tmp_path/'l'/'sky.yaml'
    spec.write_text(spec.read_text() + '# my region\n')                           # hand-edited
    wfi(*L, code=2, has='already exists')
    assert spec.read_text().endswith('# my region\n')
    wfi(*L, '--overwrite'); assert not spec.read_text().endswith('# my region\n')
    (tmp_path/'u').mkdir(); (tmp_path/'u'/'sky.yaml').write_text('name: mine\n')   # a user's own spec
    wfi(*L[:-1], tmp_path/'u', '--overwrite', code=2, has='did not write')
    assert (tmp_path/'u'/'sky.yaml').read_text() == 'name: mine\n'

# ---- issue 34, POOR items, by command (in-process: `wfi`)
def test_pipeline_bad_inputs(same, wfi, tmp_path):
    P = ['pipeline', *TINY, f'data.source={same.root/"shards"}']
    wfi(*P, '--tokens', '0', code=2, has='--tokens 0')
    wfi(*P, '--tokens', str(10**17), code=2, has='--tokens')
    wfi('train', '-s', 'pretrain', *TINY, f'data.source={same.root/"shards"}', f'training.checkpoint_uri=file://{same.runs}/backup',
        code=2, has='inside the runs folder')
    assert not (same.runs/'backup').exists()

def test_pipeline_survives_moving_the_runs_folder(w, wfi, tmp_path):
    P = ['pipeline', *TINY, '--tokens', '128', '--split', '0.5', f'data.source={w.root/"shards"}']   # 1.9 hands over to 2
    wfi(*P, runs=tmp_path/'a'/'runs')
    (tmp_path/'a'/'runs').rename(tmp_path/'moved')
    r = wfi(*P, runs=tmp_path/'moved')                        # Stage 2 finds its parent by its place in the runs folder
    assert 'stage 1.9 already completed' in r and 'stage 2 already completed' in r, r

def test_config_bad_values(same, wfi, tmp_path):
    for ov, has in (('training.max_steps=1e308', 'training.max_steps'), ('training.seed=-1', 'training.seed'),
                    ('training.seed=99999999999', 'training.seed')):
        wfi('config', '-m', 'tiny_llama', ov, code=2, has=has)
    (tmp_path/'p.yaml').write_text('A100: {on_demand: abc}\n')
    wfi('launch', '--backend', 'local', '-m', 'tiny_llama', '--dry-run', '--out', tmp_path/'l', env={'WF_GPU_PRICES': str(tmp_path/'p.yaml')},
        code=2, has=[str(tmp_path/'p.yaml'), 'A100.on_demand'])
    (tmp_path/'f').write_text('a file')
    wfi('train', *TINY, '--runs-dir', tmp_path/'f', code=2, has=str(tmp_path/'f'))

@pytest.mark.parametrize('text,has', [('training: 5\n', 'config section training is 5'), ('{training: [', 'not valid wf_nb YAML')])
def test_damaged_parent_config(w, wfi, tmp_path, text, has):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    (runs/w.s1.name/'config.yaml').write_text(text)
    wfi(*w.s2_args, 'training.max_steps=3', runs=runs, code=2, has=[has, w.s1.name])   # never a silent new Stage 1
    assert sorted(p.name for p in runs.iterdir()) == sorted(p.name for p in w.runs.iterdir())

def test_launch_bad_inputs(same, wfi, tmp_path):
    L = ['launch', '--backend', 'modal', '-m', 'tiny_llama', '--dry-run']
    r = wfi(*L, '--out', tmp_path/'m', '--secret', 'wandb=s3cr3t', code=2, has='NAME only')
    assert 's3cr3t' not in r and not (tmp_path/'m').exists()
    wfi(*L, '--out', tmp_path/'m', '--max-restarts', '-1', code=2, has='--max-restarts -1')
    (tmp_path/'file').write_text('x')
    wfi(*L, '--out', tmp_path/'file', code=2, has='is a file')

def test_export_generate_messages(same, wfi, tmp_path):
    (tmp_path/'m.gguf').write_bytes(b'GGUF' + bytes(60))
    wfi('generate', tmp_path/'m.gguf', '--prompt', 'x', code=2, has='is a GGUF file')
    import wf_nb
    with pytest.raises(ValueError, match='is a GGUF file'): wf_nb.load(tmp_path/'m.gguf')
    wfi('export', same.root/'corpus', '--out', tmp_path/'e', code=2, has='neither a checkpoint')
    wfi('export', same.s1.name, '--out', same.s1/'final', code=2, has='is the source checkpoint')

def test_export_float_model_refused(same, wfi, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM                      # a full-precision checkpoint: no BitLinear
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2)).save_pretrained(tmp_path/'fp')
    wfi('export', tmp_path/'fp', '--out', tmp_path/'e', code=2, has='--allow-float')
    assert not (tmp_path/'e').exists()
    wfi('export', tmp_path/'fp', '--out', tmp_path/'e', '--format', 'wf-packed', '--allow-float')   # knowingly

def test_eval_flags(same, wfi, tmp_path):
    E = ['eval', same.s1.name, '--data', same.root/'corpus']
    for flag, v in (('--limit', '0'), ('--limit', '-1'), ('--stride', '0'), ('--num-fewshot', '-2'), ('--max-tokens', '0')):
        wfi(*E, flag, v, code=2, has=f'{flag} {v}')
    (tmp_path/'t.jsonl').write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    wfi('eval', same.s1.name, '--task', tmp_path/'t.jsonl', code=2, has=f'{tmp_path/"t.jsonl"}:2')
    wfi('eval', same.s1.name, '--task', 'nosuchtask', code=2, has='shakespeare_genre')
    (tmp_path/'ids').mkdir(); np.save(tmp_path/'ids'/'a.npy', np.full((2, 16), 10**6, np.int32))
    wfi('eval', same.s1.name, '--data', tmp_path/'ids', code=2, has='outside the model')

def test_cancel_checks_the_pid_is_the_run(w, wfi, tmp_path):
    runs = tmp_path/'runs'; shutil.copytree(w.runs, runs)
    other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])   # has the stored pid now; not the run
    try:
        import socket
        run = runs/w.s2.name; m = json.loads((run/'metadata.json').read_text())
        (run/'metadata.json').write_text(json.dumps({**m, 'status': 'RUNNING', 'pid': other.pid, 'host': socket.gethostname()}))
        (run/'.lock').unlink(missing_ok=True)
        wfi('cancel', w.s2.name, runs=runs, code=0, has='nothing signalled')
        time.sleep(0.2); assert other.poll() is None
    finally: other.kill(); other.wait()

def test_api_bad_inputs(w, tmp_path, monkeypatch):
    import wf_nb
    with pytest.raises(KeyError, match='no run'): wf_nb.wait('nosuchrun', runs_dir=tmp_path/'runs')

def test_data_text_and_validate(same, wfi, tmp_path):
    src = tmp_path/'src'; src.mkdir()
    (src/'unix.txt').write_bytes(b'To be, or not to be\nthat is the question\n' * 20)
    (tmp_path/'crlf').mkdir(); (tmp_path/'crlf'/'unix.txt').write_bytes(b'\xef\xbb\xbf' + (src/'unix.txt').read_bytes().replace(b'\n', b'\r\n'))
    T = ['data', 'tokenize', '-m', 'tiny_llama', '--source']
    wfi(*T, src, '--output-path', tmp_path/'a'); wfi(*T, tmp_path/'crlf', '--output-path', tmp_path/'b')
    ta, tb = (np.concatenate([np.load(f) for f in sorted((tmp_path/x).glob('tokens_*.npy'))]) for x in 'ab')
    assert np.array_equal(ta, tb)                                                         # CRLF and BOM change nothing
    (src/'more').symlink_to(tmp_path/'crlf'); (src/'gone.txt').symlink_to(tmp_path/'nowhere.txt')
    r = wfi(*T, src, '--output-path', tmp_path/'c', has='gone.txt is a broken link')
    assert json.loads((tmp_path/'c'/'manifest.json').read_text())['n_docs'] == 2         # the linked folder is read
    man = tmp_path/'a'/'manifest.json'; mj = json.loads(man.read_text()); mj['n_docs'] += 5; man.write_text(json.dumps(mj))
    wfi('data', 'validate', '--data-path', tmp_path/'a', code=1, has='manifest n_docs')
    wfi('data', 'validate', '--data-path', tmp_path/'nothing', code=2, has='does not exist')
    wfi('data', 'split', '--data-path', same.root/'shards', '--output-path', tmp_path/'s', '--val-ratio', '0')
    f = next((tmp_path/'s'/'train').glob('tokens_*.npy')); (tmp_path/'gone.npy').write_bytes(f.read_bytes())
    f.unlink(); f.symlink_to(tmp_path/'gone.npy'); (tmp_path/'gone.npy').unlink()   # a split across filesystems links; its source deleted
    r = wfi('data', 'validate', '--data-path', tmp_path/'s', code=1)
    assert 'is a link to' in r and 'split again' in r, r

def test_api_second_train_of_a_starting_run_refused(tmp_path, monkeypatch):
    "A second wf_nb.train of a config whose background process this kernel is still starting (no lock on disk yet) is refused, not 'started' again."
    import wf_nb.jupyter as J
    from wf_nb.registry import RunExistsError
    args = dict(model='tiny_llama', stage='1', overrides=['data.seq_len=32'], runs_dir=tmp_path/'runs')
    rid = J._resolve(args['model'], args['stage'], None, args['overrides'])[2].id
    class Starting:                       # a `wf train` process still importing: alive, no lock yet
        pid = 4242
        def poll(self): return None
    spawned = []
    monkeypatch.setitem(J._PROCS, rid, Starting())
    monkeypatch.setattr(J, '_spawn', lambda *a, **k: spawned.append(a))
    with pytest.raises(RunExistsError, match='already running'): J.train(**args)
    assert not spawned

def test_bench_quality_refuses_missing_domains(monkeypatch, capsys):
    "bench_quality stops with one line naming a held-out domain it cannot read (its package), unless told to measure the rest."
    monkeypatch.syspath_prepend(str(Path(__file__).parent/'benchmarks'))
    import bench_quality
    from wf_nb import corpora
    def gone(): raise corpora.ModelSourceError("/usr/share/dictd/jargon.dict.dz is missing: install Debian's dict-jargon")
    for src in ('gcide', 'fortunes', 'changelogs', 'manpages', 'iso_codes'):   # the rest read as present: no Debian needed here
        monkeypatch.setitem(corpora.CORPORA, src, lambda: [])
    monkeypatch.setitem(corpora.CORPORA, 'jargon', gone)
    assert bench_quality.missing_domains() == {'computing_lore': "/usr/share/dictd/jargon.dict.dz is missing: install Debian's dict-jargon"}
    with pytest.raises(SystemExit) as e: bench_quality.require_domains()
    msg = str(e.value)
    assert msg.startswith('bench_quality: error: 1 of the 6 held-out domains') and 'dict-jargon' in msg and '\n' not in msg
    bench_quality.require_domains(allow_missing=True)   # measures the rest, and says so
    assert 'without computing_lore' in capsys.readouterr().err
    monkeypatch.setitem(corpora.CORPORA, 'jargon', lambda: [])
    bench_quality.require_domains()   # all six there: no error
    # a table whose arm lacks domains the teacher has marks its mean as partial; one on fewer than six says which are missing
    from wf_nb.generality import HELDOUT_DOMAINS
    doms = list(HELDOUT_DOMAINS)
    fp, arm = {'arm': 'fp', 'domains': dict.fromkeys(doms, 10.), 'train_s': 0}, {'arm': 'wf', 'domains': dict.fromkeys(doms[:3], 20.), 'train_s': 1}
    assert '2.00x (3 of 6)' in bench_quality.generality_table([fp, arm])
    fp['domains'] = dict.fromkeys(doms[:5], 10.)
    assert f'{doms[5]} not installed' in bench_quality.generality_table([fp, arm])
