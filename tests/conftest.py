import os, sys, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault('WANDB_MODE', 'disabled')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')

def bin_path(name):
    "A console script of this environment (wf, nbdev_test, ...)."
    return str(Path(sys.executable).parent / name)

@pytest.fixture
def wf(tmp_path):
    "Run the `wf` command in a fresh runs dir; returns a function(*args, timeout=..) -> CompletedProcess."
    def run(*args, timeout=900, check=True, env=None):
        e = {**os.environ, 'WF_RUNS_DIR': str(tmp_path / 'runs'), **(env or {})}
        r = subprocess.run([bin_path('wf'), *map(str, args)], cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=e)
        if check and r.returncode != 0:
            raise AssertionError(f"wf {' '.join(map(str, args))} exited {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}")
        return r
    return run
