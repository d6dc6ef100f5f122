"""Upstream's manual launch shape, end to end: scheduler and server started by ``bpslaunch`` in
upstream (``DMLC_ROLE``) mode from an environment that describes a single-machine job
(``DMLC_NUM_WORKER=1``, no ``BYTEPS_FORCE_DISTRIBUTED``), and one worker that sets
``BYTEPS_FORCE_DISTRIBUTED=1`` in its own environment only (upstream's ``tests/meta_test.py``
and ``tests/run_byteps_test.sh`` do exactly this).

The worker is a plain ``python`` process using ``byteps.basics`` with NumPy buffers. Every
launcher is started with ``start_new_session=True`` and only its own process group is ever
signalled.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from jobs import PY, Group, clean_job_env, free_port, run_command

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux (the byteps core's transport)"
)
pytest.importorskip("byteps._core", reason="the byteps core is not built")

# One worker of a forced-distributed job, driving upstream's harness itself (as meta_test.py
# does): per cycle it starts a scheduler and a server through bpslaunch from its own environment
# minus BYTEPS_FORCE_DISTRIBUTED and the worker variables, then init, push_pulls, shutdown, and
# the services must exit 0 by themselves. Sums go through the server (_core.is_distributed), in
# place and out of place, sum and average, every name used twice.
_WORKER = r"""
import os, signal, subprocess, sys
import numpy as np
import byteps.basics as bps
from byteps import _core

CYCLES = int(sys.argv[1])
WORKER_ONLY = ("BYTEPS_FORCE_DISTRIBUTED", "DMLC_WORKER_ID", "BYTEPS_LOCAL_RANK",
               "BYTEPS_LOCAL_SIZE", "DMLC_ROLE")
service_env = {k: v for k, v in os.environ.items() if k not in WORKER_ONLY}

def cases():
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
                    h = bps.push_pull_async(name, x.ctypes.data, out.ctypes.data, x.nbytes,
                                            dtype, shape, average)
                    bps.wait(h, 60.0)
                    if not np.array_equal(out, want):
                        raise SystemExit(f"FAIL {name} round {rnd}: {out.ravel()[:5]} != "
                                         f"{want.ravel()[:5]}")
                    n += 1
    return n

n = 0
for cycle in range(CYCLES):
    services = [subprocess.Popen([sys.executable, "-m", "byteps.launch"],
                                 env=dict(service_env, DMLC_ROLE=role), start_new_session=True)
                for role in ("scheduler", "server")]
    try:
        bps.init()
        assert _core.is_distributed(), "the worker did not join the scheduler and the server"
        assert (bps.size(), bps.rank(), bps.local_size()) == (1, 0, 1), (bps.size(), bps.rank())
        n += cases()
        bps.shutdown()
        codes = [p.wait(30) for p in services]
        if codes != [0, 0]:
            raise SystemExit(f"FAIL cycle {cycle}: scheduler, server exited {codes}")
        print(f"CYCLE {cycle} done", flush=True)
    finally:
        for p in services:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
print(f"OK {n} cases", flush=True)
"""


def _single_machine_env(**extra):
    env = clean_job_env({
        "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(free_port()),
        "BYTEPS_SECRET": "upstream-launch-test-secret-0123456789abcdef",
    })
    env.update(extra)
    assert "BYTEPS_FORCE_DISTRIBUTED" not in env
    return env


@pytest.mark.timeout(180)
def test_scheduler_and_server_run_for_a_forced_worker():
    """The trio, three cycles in one worker process on the same port (upstream's harness runs
    init/test/shutdown per test case): both services run although their environment says one
    worker machine, the worker's push_pulls return the exact sums through them, and the
    services exit 0 by themselves once the worker has shut down."""
    env = _single_machine_env(BYTEPS_TIMEOUT="60", DMLC_ROLE="worker", DMLC_WORKER_ID="0",
                              BYTEPS_LOCAL_RANK="0", BYTEPS_LOCAL_SIZE="1")
    env["BYTEPS_FORCE_DISTRIBUTED"] = "1"
    worker = run_command([PY, "-c", _WORKER, "3"], env=env, timeout=150)
    elapsed, out = worker.seconds, worker.output
    assert worker.returncode == 0 and "OK 180 cases" in out, out[-6000:]
    assert [f"CYCLE {c} done" in out for c in range(3)] == [True] * 3, out[-6000:]
    assert out.count("bpslaunch: launching scheduler") == 3, out[-6000:]
    assert out.count("bpslaunch: launching server") == 3, out[-6000:]
    assert "nothing to do" not in out
    assert elapsed < 90, f"three cycles took {elapsed:.1f} s; output:\n{out[-6000:]}"


_LONE_WORKER = r"""
import numpy as np
import byteps.basics as bps
from byteps import _core
bps.init()
assert not _core.is_distributed()
x = np.arange(10, dtype=np.float32)
bps.wait(bps.push_pull_async("x", x.ctypes.data, x.ctypes.data, x.nbytes, "float32", x.shape,
                             False), 30.0)
assert np.array_equal(x, np.arange(10, dtype=np.float32)), x
bps.shutdown()
print("OK lone worker", flush=True)
"""


@pytest.mark.timeout(120)
def test_services_without_a_forced_worker_fail_with_a_timeout():
    """A worker that does not set BYTEPS_FORCE_DISTRIBUTED runs alone (no servers); the
    scheduler and server it never joins fail after BYTEPS_TIMEOUT naming what never
    registered (and the launcher's note names BYTEPS_FORCE_DISTRIBUTED), instead of waiting
    for ever."""
    base = _single_machine_env(BYTEPS_TIMEOUT="3")
    with Group() as group:  # stops (by PID) whatever still runs on the way out
        services = [group.start([PY, "-m", "byteps.launch"], dict(base, DMLC_ROLE=role),
                                label=role) for role in ("scheduler", "server")]
        worker = subprocess.run(
            [PY, "-c", _LONE_WORKER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=60, env=dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID="0"))
        codes = group.wait_all(40, services)
        outs = [p.output for p in services]
    out = "\n".join(outs)
    assert worker.returncode == 0 and "OK lone worker" in worker.stdout, worker.stdout[-4000:]
    assert codes == [1, 1], out[-4000:]
    assert "never registered" in out and "BYTEPS_FORCE_DISTRIBUTED=1" in out, out[-4000:]
    # the scheduler names who is missing, and only that (the server did register)
    assert "workers [0] never registered" in out and "servers never registered" not in out, out


def test_unresolvable_scheduler_name_is_retried_then_named():
    """A scheduler name that does not resolve (yet) is retried like a refused connection (a
    cluster's DNS may publish it late: a Kubernetes Service, a Slurm node), then the worker
    fails with a ConfigError naming the host once BYTEPS_TIMEOUT has passed."""
    env = {**clean_job_env(), "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2",
           "DMLC_NUM_SERVER": "1", "DMLC_WORKER_ID": "0",
           "DMLC_PS_ROOT_URI": "no-such-host.invalid", "DMLC_PS_ROOT_PORT": "1234",
           "BYTEPS_TIMEOUT": "2", "BYTEPS_SECRET": "ab" * 32}
    code = ("import byteps.basics as bps\n"
            "try:\n    bps.init(lazy=False)\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    t0 = time.monotonic()
    res = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ConfigError"), res.stdout + res.stderr
    assert "cannot resolve host 'no-such-host.invalid'" in res.stdout
    assert 2.0 <= elapsed < 30, elapsed
