"""Every notebook under nbs/ is a test file: run each with `nbdev_test` (cells flagged slow/cuda are skipped)."""
import subprocess, sys, json, os
from pathlib import Path
import pytest
from conftest import ROOT, bin_path

PAPERMILL_ONLY = {'13_tutorial.ipynb'}   # runs headless under papermill in tests/test_jupyter.py (its live plots need a kernel)
NOTEBOOKS = sorted(p.name for p in (ROOT / 'nbs').glob('*.ipynb') if p.name not in PAPERMILL_ONLY)

def run_nbdev_test(path, cwd=ROOT, timeout=1800):
    return subprocess.run([bin_path('nbdev_test'), '--path', str(path), '--do_print'], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)

def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS

@pytest.mark.parametrize('nb', NOTEBOOKS)
def test_notebook(nb):
    r = run_nbdev_test(ROOT / 'nbs' / nb)
    assert r.returncode == 0, f"{nb} failed under nbdev_test\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
