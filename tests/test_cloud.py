"""`wf launch` end to end: the files it writes are read by the backends' own libraries (SkyPilot's task parser and
schema, Modal's app builder), offline; nothing is launched. Each check skips when its library (the `cloud` extra) is
absent. Without --dry-run and without the backend's command line, `wf launch` says how to install it."""
import os, runpy, sys
from pathlib import Path
import pytest
from wf_nb.cli import main

@pytest.fixture
def wf(tmp_path, monkeypatch, capsys):
    "`wf` in this process (nothing trains here): returns (exit code, stdout, stderr)."
    monkeypatch.chdir(tmp_path)
    def run(*args):
        rc = main([str(a) for a in args]); out = capsys.readouterr(); return rc, out.out, out.err
    return run

ARGS = ['-m', 'tiny_llama', '-s', '2', 'training.max_steps=50', 'training.checkpoint_uri=s3://my-bucket/wf']

def test_skypilot_task_validates(wf, tmp_path):
    sky = pytest.importorskip('sky')
    for nodes, gpus in (('1', 'A100:4'), ('2', 'H100:8')):
        out = tmp_path/f'sky{nodes}'
        rc, stdout, _ = wf('launch', '--backend', 'skypilot', '--gpus', gpus, '--nodes', nodes, '--dry-run', '--out', out, *ARGS)
        task = sky.Task.from_yaml(str(out/'sky.yaml'))                # SkyPilot's own parser and schema check
        res = next(iter(task.resources))
        kind, count = gpus.split(':')
        assert task.num_nodes == int(nodes) and res.accelerators == {kind: int(count)} and res.use_spot
        assert res.job_recovery['max_restarts_on_errors'] == 3
        assert '/wf_ckpt' in task.storage_mounts                       # the bucket, mounted MOUNT_CACHED
        assert task.envs['WF_NB_COMMIT'] and 'training.checkpoint_uri=file:///wf_ckpt/wf' in task.run
        assert ('torchrun --nnodes=$SKYPILOT_NUM_NODES' in task.run) == (nodes == '2')
        assert rc == 0 and 'sky jobs launch' in stdout and '/hour' in stdout

def test_modal_app_builds(wf, tmp_path):
    modal = pytest.importorskip('modal')
    out = tmp_path/'modal'
    assert wf('launch', '--backend', 'modal', '--gpus', 'L4', '--secret', 'wandb', '--dry-run', '--out', out, *ARGS)[0] == 0
    ns = runpy.run_path(str(out/'modal_app.py'))                     # imports modal, builds image, volumes, function
    assert isinstance(ns['app'], modal.App) and isinstance(ns['train'], modal.Function)
    assert ns['ARGV'][:5] == ['train', '-m', 'tiny_llama', '-s', '2'] and 'distributed.gpus=L4:1' in ns['ARGV']

def test_missing_backend_cli_says_how_to_install(wf, tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))                         # no `sky` on PATH
    rc, _, err = wf('launch', '--backend', 'skypilot', '--out', tmp_path/'s', *ARGS)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith('wf launch: error:') and "pip install 'skypilot[aws]'" in err and (tmp_path/'s/sky.yaml').exists()
