"""Upstream's manual launch shape, end to end: scheduler and server started by ``bpslaunch`` in
upstream (``DMLC_ROLE``) mode from an environment that describes a single-machine job
(``DMLC_NUM_WORKER=1``, no ``BYTEPS_FORCE_DISTRIBUTED``), and one worker that sets
``BYTEPS_FORCE_DISTRIBUTED=1`` in its own environment only (upstream's ``tests/meta_test.py``
and ``tests/run_byteps_test.sh`` do exactly this).

The worker is a plain ``python`` process using ``byteps.basics`` with NumPy buffers; the
launchers are started with ``start_new_session=True`` and only their own process groups are ever
signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from jobs import PY, clean_job_env

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux (the byteps core's transport)"
)
pytest.importorskip("byteps._core", reason="the byteps core is not built")

# One worker of a forced-distributed job: sums go through the server (checked with
# _core.is_distributed), in place and out of place, sum and average, a name used twice.
_WORKER = r"""
import numpy as np
import byteps.basics as bps
from byteps import _core

bps.init()
assert _core.is_distributed(), "the worker did not join the scheduler and the server"
assert (bps.size(), bps.rank(), bps.local_size()) == (1, 0, 1), (bps.size(), bps.rank())
n = 0
for rnd in range(2):
    for dtype in ("float16", "float32", "float64", "int32", "int64"):
        for shape in ((17,), (17, 17), (5, 6, 7)):
            for average, inplace in ((False, True), (True, False)):
                name = f"t.{dtype}.{len(shape)}.{int(average)}{int(inplace)}"
                bps.declare(name)
                x = ((np.arange(np.prod(shape)) * 7 + rnd * 3) % 201 - 100).astype(dtype)
                x = x.reshape(shape)
                want = x.copy()  # the sum over the one worker (its average too)
                out = x if inplace else np.full_like(x, 55)
                h = bps.push_pull_async(name, x.ctypes.data, out.ctypes.data, x.nbytes, dtype,
                                        shape, average)
                bps.wait(h, 60.0)
                if not np.array_equal(out, want):
                    raise SystemExit(f"FAIL {name} round {rnd}: {out.ravel()[:5]} != "
                                     f"{want.ravel()[:5]}")
                n += 1
bps.shutdown()
print(f"OK {n} cases", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_services(base):
    """scheduler and server through ``bpslaunch`` (upstream mode), env exactly ``base`` + role."""
    return [subprocess.Popen([PY, "-m", "byteps.launcher"], env=dict(base, DMLC_ROLE=role),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
            for role in ("scheduler", "server")]


def _finish(services, timeout):
    """(return codes, combined output) of the service launchers; kills (by their own process
    group) those still running after ``timeout`` s and reports them as None."""
    codes, outs = [], []
    for p in services:
        try:
            out = p.communicate(timeout=timeout)[0]
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out = p.communicate(timeout=10)[0]
            codes.append(None)
        outs.append(out)
    return codes, "\n".join(outs)


def _cleanup(services):
    for p in services:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _single_machine_env(**extra):
    env = clean_job_env({
        "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(_free_port()),
        "BYTEPS_SECRET": "upstream-launch-test-secret-0123456789abcdef",
    })
    env.update(extra)
    assert "BYTEPS_FORCE_DISTRIBUTED" not in env
    return env


@pytest.mark.timeout(180)
def test_scheduler_and_server_run_for_a_forced_worker():
    """The trio: both services run although their environment says one worker machine, the
    worker's push_pulls return the exact sums through them, and the services exit 0 by
    themselves once the worker has shut down (upstream's harness joins them)."""
    base = _single_machine_env(BYTEPS_TIMEOUT="60")
    start = time.monotonic()
    services = _start_services(base)
    try:
        worker = subprocess.run(
            [PY, "-c", _WORKER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=120, env=dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID="0",
                                  BYTEPS_FORCE_DISTRIBUTED="1", BYTEPS_LOCAL_RANK="0",
                                  BYTEPS_LOCAL_SIZE="1"))
        codes, out = _finish(services, timeout=30)
    finally:
        _cleanup(services)
    elapsed = time.monotonic() - start
    text = worker.stdout + "\n--- services ---\n" + out
    assert worker.returncode == 0 and "OK 60 cases" in worker.stdout, text[-6000:]
    assert codes == [0, 0], text[-6000:]
    assert "nothing to do" not in out
    assert "bpslaunch: launching scheduler" in out and "bpslaunch: launching server" in out
    assert elapsed < 60, f"the trio took {elapsed:.1f} s; output:\n{text[-6000:]}"


@pytest.mark.timeout(120)
def test_services_without_a_forced_worker_fail_with_a_timeout():
    """A worker that does not set BYTEPS_FORCE_DISTRIBUTED runs alone (no servers); the
    scheduler and server it never joins fail after BYTEPS_TIMEOUT naming what never
    registered, instead of waiting for ever."""
    base = _single_machine_env(BYTEPS_TIMEOUT="3")
    services = _start_services(base)
    try:
        worker = subprocess.run(
            [PY, "-c", _WORKER.replace("assert _core.is_distributed()", "assert not "
                                       "_core.is_distributed()")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
            env=dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID="0"))
        codes, out = _finish(services, timeout=40)
    finally:
        _cleanup(services)
    assert worker.returncode == 0 and "OK 60 cases" in worker.stdout, worker.stdout[-4000:]
    assert codes[0] == 1 and codes[1] not in (0, None), out[-4000:]
    assert "never registered" in out and "BYTEPS_FORCE_DISTRIBUTED=1" in out, out[-4000:]
