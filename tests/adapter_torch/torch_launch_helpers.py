"""Launch helpers for the multi-process byteps.torch tests (uniquely named module, imported
by test_torch_multiprocess.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
REPO = HERE.parent.parent


def launch(script, workers=2, servers=1, local_size=None, args=(), timeout=240, env=None):
    """Run ``script`` (a path under tests/adapter_torch/workers or any path) on ``workers`` worker
    processes and ``servers`` servers through the byteps launcher. Returns the CompletedProcess
    (text output, stderr merged into stdout)."""
    cmd = [sys.executable, "-m", "byteps.launcher", "--workers", str(workers),
           "--servers", str(servers)]
    if local_size is not None:
        cmd += ["--local-size", str(local_size)]
    cmd += ["--", sys.executable, str(script), *map(str, args)]
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=full_env, cwd=str(REPO))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"launch of {script} timed out after {timeout}s; output tail:\n{out[-6000:]}")
    return proc


def assert_ok(proc, marker, count):
    """Exit code 0 and ``marker`` printed ``count`` times (once per worker rank)."""
    out = proc.stdout
    assert proc.returncode == 0, f"exit code {proc.returncode}; output tail:\n{out[-8000:]}"
    found = out.count(marker)
    assert found == count, (f"expected {count} x {marker!r}, found {found}; output tail:\n"
                            f"{out[-8000:]}")
