"""Elastic restart (upstream ``suspend``/``resume``), launched the upstream way: one process per
role, the environment describing the job (what ``bpslaunch`` does in upstream mode).

Three workers train (``tests/workers/elastic_worker.py``); worker 2 is killed with SIGKILL. The
survivors get ``PeerLostError``, ``suspend()``, and wait; the test (playing the job's
supervisor) waits for the old scheduler and server to exit, starts new ones for 2 workers at the
same address, and writes the restart plan; the survivors ``resume(2, 1, new_rank)`` and train 5
more steps from their checkpoint with exact sums over the 2 workers. The scenario runs with each
van of ``jobs.VANS`` (every process of both jobs gets the van's variables).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from jobs import VANS, Group, clean_job_env, env_dict, free_port, van_params

WORKER = str(Path(__file__).resolve().parent / "workers" / "elastic_worker.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("van", van_params())
def test_survivors_resume_from_checkpoint_after_a_worker_dies(tmp_path: Path, van):
    restart = tmp_path / "restart.json"
    base = clean_job_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
                          "DMLC_NUM_SERVER": "1", "BYTEPS_SECRET": os.urandom(16).hex(),
                          "BYTEPS_TIMEOUT": "60", "BYTEPS_HEARTBEAT_TIMEOUT": "5",
                          "PYTHONUNBUFFERED": "1", **env_dict(VANS[van])})
    service = [sys.executable, "-m", "byteps.server"]

    with Group() as group:  # stops (by PID) whatever still runs on the way out

        def services(n):
            env = dict(base, DMLC_NUM_WORKER=str(n))
            return [group.start(service, dict(env, DMLC_ROLE=role), label=role)
                    for role in ("scheduler", "server")]

        old = services(3)
        workers = [group.start([sys.executable, WORKER, str(restart)],
                               dict(base, DMLC_NUM_WORKER="3", DMLC_ROLE="worker",
                                    DMLC_WORKER_ID=str(i)), label=f"worker {i}")
                   for i in range(3)]
        for w in workers:
            w.wait_line("READY", 90)
        t_kill = time.monotonic()
        os.kill(workers[2].pid, signal.SIGKILL)
        for w in workers[:2]:
            w.wait_line("SUSPENDED", 30)
        t_suspended = time.monotonic() - t_kill
        for o in old:  # the failed job's scheduler and server end by themselves
            o.wait(30)
            assert o.returncode != 0, f"{o.label} of the failed job exited 0"
        services(2)
        restart.write_text(json.dumps({"num_workers": 2, "num_servers": 1,
                                       "ranks": {"0": 0, "1": 1}}))
        for w in workers[:2]:
            assert w.wait(90) == 0, "\n".join(w.lines[-40:])
    for i, w in enumerate(workers[:2]):
        assert any(ln == f"RESUMED rank={i} size=2" for ln in w.lines), w.lines[-20:]
        step = int(w.wait_line("SUSPENDED", 1).split()[1])
        assert w.lines[-1] == f"OK {step + 5} steps", w.lines[-20:]
    print(f"elastic ({van}): survivors suspended {t_suspended:.2f} s after the kill")
