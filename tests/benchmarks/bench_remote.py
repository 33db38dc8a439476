"""Remote checkpoint benchmark: what a save costs training with `training.checkpoint_uri` set.

    python tests/benchmarks/bench_remote.py

A 16.8M-parameter linear layer with its AdamW state (a 192 MB checkpoint) is saved as the trainer saves it, then
handed to `RemoteCheckpoints.upload` for a `file://` folder and for S3 (moto's server on 127.0.0.1, through s3fs).
Columns: the atomic local save, the time `upload()` blocks the training loop (hard links + enqueue), and the time
the background upload takes to finish (manifest last). Medians of 3 saves. Needs the `dev` extra (s3fs, moto).
"""
import os, time, tempfile, statistics, torch
from pathlib import Path
from torch import nn
from moto.server import ThreadedMotoServer
s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start(); h, p = s.get_host_and_port()
os.environ.update(AWS_ENDPOINT_URL=f'http://{h}:{p}', AWS_ACCESS_KEY_ID='t', AWS_SECRET_ACCESS_KEY='t', AWS_DEFAULT_REGION='us-east-1')
import boto3; boto3.client('s3').create_bucket(Bucket='bench')
from wf_nb.checkpoint import save_checkpoint
from wf_nb.remote import RemoteCheckpoints, check_remote
torch.manual_seed(0); net = nn.Linear(4096, 4096)   # 16.8M params: 67 MB safetensors
opt = torch.optim.AdamW(net.parameters()); net(torch.randn(2, 4096)).sum().backward(); opt.step()
runs = Path(tempfile.mkdtemp())
print(f"| target | checkpoint MB | save (local, atomic) s | upload() blocks s | upload finished s |")
print("|---|---|---|---|---|")
for uri in (f'file://{tempfile.mkdtemp()}', 's3://bench/wf'):
    check_remote(uri); rc = RemoteCheckpoints(uri, 'run', keep_last=2)
    saves, blocks, totals = [], [], []
    for step in range(1, 4):
        t0 = time.perf_counter(); ck = save_checkpoint(runs/'run/checkpoints'/f'step_{step:08d}', net, opt, state={'step': step}); t1 = time.perf_counter()
        rc.upload(ck); t2 = time.perf_counter(); rc.close(); t3 = time.perf_counter()
        saves.append(t1 - t0); blocks.append(t2 - t1); totals.append(t3 - t1)
    mb = sum(f.stat().st_size for f in ck.iterdir()) / 2**20
    print(f"| {uri.split(':')[0]} | {mb:.0f} | {statistics.median(saves):.3f} | {statistics.median(blocks):.4f} | {statistics.median(totals):.2f} |")
s.stop()
