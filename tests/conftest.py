import os, sys, shutil, subprocess, tempfile
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


# The suite writes GBs (real-model checkpoints, runs folders): every folder a test makes is removed once it passed,
# and kept when it failed (pyproject.toml: tmp_path_retention_policy = "failed"). Temp files that code under test makes
# with `tempfile` land in the test's own folder (TMPDIR), so they go with it instead of piling up in /tmp.
_FAILED_MODULES = pytest.StashKey[set]()

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.failed: item.session.stash.setdefault(_FAILED_MODULES, set()).add(item.module.__name__)
    return rep

@pytest.fixture(scope='session', autouse=True)
def _compile_cache(tmp_path_factory):
    "One torch.compile cache for the session (its default lives under TMPDIR, which changes per test)."
    os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', str(tmp_path_factory.mktemp('inductor')))
    # inductor fixes its precompiled-header folder when codecache is first imported, under tempfile.gettempdir(): import
    # it now, so that folder is not the first compiling test's TMPDIR, removed when that test passes (every later C++
    # compile then fails and wf_nb's quantizers fall back to eager: the warning tests/test_llamacpp.py used to show)
    import torch._inductor.codecache  # noqa: F401

@pytest.fixture(autouse=True)
def _test_tmpdir(tmp_path, monkeypatch):
    d = tmp_path / 'TMPDIR'; d.mkdir()
    monkeypatch.setenv('TMPDIR', str(d)); monkeypatch.setattr(tempfile, 'tempdir', str(d))
    return d

@pytest.fixture(scope='module')
def module_tmp(request, tmp_path_factory):
    "mk(name) -> a fresh folder for a module's shared fixtures; all removed after the module when none of its tests failed."
    made = []
    def mk(name):
        made.append(tmp_path_factory.mktemp(name)); return made[-1]
    yield mk
    if request.module.__name__ not in request.session.stash.get(_FAILED_MODULES, set()):
        for d in made: shutil.rmtree(d, ignore_errors=True)

def pytest_collection_modifyitems(session, config, items):
    "The docs site test last: it renders the executed notebooks that test_notebooks.py and test_jupyter.py keep in docs/_cache/."
    items.sort(key=lambda it: it.module.__name__ == 'test_docs')   # stable: every other test keeps its order
