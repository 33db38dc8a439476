"""`wf launch` end to end: the files it writes are read by the backends' own libraries (SkyPilot's task parser and
schema, Modal's app builder), offline; nothing is launched. Each check skips when its library (the `cloud` extra) is
absent. Without --dry-run and without the backend's command line, `wf launch` says how to install it."""
import os, runpy, sys
from pathlib import Path
import pytest
from test_cli import ENV

ARGS = ['-m', 'tiny_llama', '-s', '2', 'training.max_steps=50', 'training.checkpoint_uri=s3://my-bucket/wf']

def test_skypilot_task_validates(wf, tmp_path):
    sky = pytest.importorskip('sky')
    for nodes, gpus in (('1', 'A100:4'), ('2', 'H100:8')):
        out = tmp_path/f'sky{nodes}'
        r = wf('launch', '--backend', 'skypilot', '--gpus', gpus, '--nodes', nodes, '--dry-run', '--out', out, *ARGS, env=ENV)
        task = sky.Task.from_yaml(str(out/'sky.yaml'))                # SkyPilot's own parser and schema check
        res = next(iter(task.resources))
        kind, count = gpus.split(':')
        assert task.num_nodes == int(nodes) and res.accelerators == {kind: int(count)} and res.use_spot
        assert res.job_recovery['max_restarts_on_errors'] == 3
        assert '/wf_ckpt' in task.storage_mounts                       # the bucket, mounted MOUNT_CACHED
        assert task.envs['WF_NB_COMMIT'] and 'training.checkpoint_uri=file:///wf_ckpt/wf' in task.run
        assert ('torchrun --nnodes=$SKYPILOT_NUM_NODES' in task.run) == (nodes == '2')
        assert 'sky jobs launch' in r.stdout and '/hour' in r.stdout

def test_modal_app_builds(wf, tmp_path):
    modal = pytest.importorskip('modal')
    out = tmp_path/'modal'
    wf('launch', '--backend', 'modal', '--gpus', 'L4', '--secret', 'wandb', '--dry-run', '--out', out, *ARGS, env=ENV)
    ns = runpy.run_path(str(out/'modal_app.py'))                     # imports modal, builds image, volumes, function
    assert isinstance(ns['app'], modal.App) and isinstance(ns['train'], modal.Function)
    assert ns['ARGV'][:5] == ['train', '-m', 'tiny_llama', '-s', '2'] and 'distributed.gpus=L4:1' in ns['ARGV']

def test_missing_backend_cli_says_how_to_install(wf, tmp_path):
    r = wf('launch', '--backend', 'skypilot', '--out', tmp_path/'s', *ARGS, check=False,
           env={**ENV, 'PATH': str(tmp_path)})                        # no `sky` on PATH
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "pip install 'skypilot[aws]'" in r.stderr and (tmp_path/'s/sky.yaml').exists()
