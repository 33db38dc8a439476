"""Checkpoints in object storage against a real S3 endpoint: moto's S3 server on 127.0.0.1, started here, with s3fs
(through fsspec) pointed at it by AWS_ENDPOINT_URL, exactly as for R2 or MinIO. A preempted spot job is played by a
second machine: an empty runs folder with the same command. Skips when the `cloud` extra (s3fs, moto) is absent."""
import json, os
from pathlib import Path
import pytest

pytest.importorskip('s3fs'); pytest.importorskip('moto.server')
from test_cli import TINY, ENV, step_losses, only_run

BUCKET = 'wf-ckpts'

@pytest.fixture(scope='module')
def s3():
    "A local S3 server; yields the environment that points boto/s3fs at it (and an empty bucket)."
    import boto3
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); server.start()
    host, port = server.get_host_and_port()
    env = {'AWS_ENDPOINT_URL': f'http://{host}:{port}', 'AWS_ACCESS_KEY_ID': 'testing', 'AWS_SECRET_ACCESS_KEY': 'testing',
           'AWS_DEFAULT_REGION': 'us-east-1', 'AWS_SHARED_CREDENTIALS_FILE': '/nonexistent', 'AWS_CONFIG_FILE': '/nonexistent'}
    boto3.client('s3', endpoint_url=env['AWS_ENDPOINT_URL'], region_name='us-east-1', aws_access_key_id='testing',
                 aws_secret_access_key='testing').create_bucket(Bucket=BUCKET)
    yield env
    server.stop()

def s3fs_of(env):
    import s3fs
    return s3fs.S3FileSystem(key=env['AWS_ACCESS_KEY_ID'], secret=env['AWS_SECRET_ACCESS_KEY'],
                             client_kwargs={'endpoint_url': env['AWS_ENDPOINT_URL'], 'region_name': 'us-east-1'}, skip_instance_cache=True)

ARGS = ['train', '-s', '2', *TINY, 'training.max_steps=6', 'training.save_interval=2', 'training.keep_last=2']

def test_spot_resume_on_an_empty_machine(wf, tmp_path, s3):
    uri = f's3://{BUCKET}/exp1'
    a = tmp_path/'a'; wf(*ARGS, f'training.checkpoint_uri={uri}', '--gpus', 'T4:1', env={**ENV, **s3, 'WF_RUNS_DIR': str(a)})   # uninterrupted
    run_id = only_run(a, '2').name
    meta = json.loads((only_run(a, '2')/'metadata.json').read_text())
    assert meta['gpus'] == 'T4:1' and meta['gpu_hour_usd'] == 0.45    # priced from the GPU table (wf_nb.gpus)
    assert step_losses(only_run(a, '2')) and 'COST' in wf('runs', env={**ENV, 'WF_RUNS_DIR': str(a)}).stdout
    ref_losses = step_losses(only_run(a, '2'))
    fs = s3fs_of(s3); root = f'{BUCKET}/exp1/{run_id}'
    assert sorted(p.rsplit('/', 1)[-1] for p in fs.ls(root)) == ['step_00000004', 'step_00000006']   # keep_last=2 remotely
    assert sorted(p.rsplit('/', 1)[-1] for p in fs.ls(f'{root}/step_00000006')) == ['manifest.json', 'model.safetensors', 'optimizer.pt', 'state.pt']
    fs.rm(f'{root}/step_00000006/manifest.json')                     # the machine died while uploading step 6
    b = tmp_path/'b'; wf(*ARGS, f'training.checkpoint_uri={uri}', env={**ENV, **s3, 'WF_RUNS_DIR': str(b)})   # a fresh machine
    run_b = only_run(b, '2')
    log = (run_b/'train.log').read_text()
    assert 'downloaded step_00000004' in log and 'resumed from step_00000004 (step 4)' in log, log
    losses = step_losses(run_b)
    assert sorted(losses) == [5, 6] and all(losses[s] == ref_losses[s] for s in (5, 6)), (losses, ref_losses)
    assert json.loads((run_b/'metadata.json').read_text())['status'] == 'COMPLETED'
    fs.invalidate_cache()
    assert fs.exists(f'{root}/step_00000006/manifest.json')          # re-uploaded whole after the resume

def test_missing_bucket_or_bad_credentials_fail_before_training(wf, tmp_path, s3):
    runs = tmp_path/'runs'
    r = wf(*ARGS, 'training.checkpoint_uri=s3://no-such-bucket/x', check=False, env={**ENV, **s3})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith('wf train: error: cannot write checkpoints to s3://no-such-bucket/x') and 'bucket exists' in r.stderr
    assert not runs.exists() or not any(runs.iterdir())               # no run folder, no model loaded
    import moto.settings as ms
    old, ms.INITIAL_NO_AUTH_ACTION_COUNT = ms.INITIAL_NO_AUTH_ACTION_COUNT, 0   # the server now checks access keys
    try: r = wf(*ARGS, f'training.checkpoint_uri=s3://{BUCKET}/x', check=False, env={**ENV, **s3, 'AWS_ACCESS_KEY_ID': 'AKIAWRONG'})
    finally: ms.INITIAL_NO_AUTH_ACTION_COUNT = old
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert 'cannot write checkpoints' in r.stderr and 'AWS_ACCESS_KEY_ID' in r.stderr and 'AKIAWRONG' not in r.stderr
    assert 'testing' not in r.stderr                                  # no secret in the message
