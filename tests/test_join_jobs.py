"""Horovod's join in real jobs (docs/collectives.md, "Join"): tests/workers/join_worker.py.

Two episodes per job (rank 1, then rank 0 joins first) with push_pull, allgather, broadcast,
reducescatter, a refused alltoall and a barrier among the others, checked against NumPy; the
keys and rounds of the joined rank catch up (the same and new tensors afterwards); a job with
several processes per machine refuses join.
"""

from __future__ import annotations

import os
import sys

import pytest
from jobs import CONFIGS, assert_ok, run_job, worker_lines, world_size

WORKER = os.path.join(os.path.dirname(__file__), "workers", "join_worker.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", ["2w1s", "3w2s"])
def test_join(job):
    rc, out, _ = run_job(CONFIGS[job], "join", env=["BYTEPS_PARTITION_BYTES=65536"],
                         timeout=240, script=WORKER)
    assert_ok(rc, out, world_size(CONFIGS[job]), min_cases=12)


@pytest.mark.timeout(200)
def test_join_refused_with_several_processes_per_machine():
    cfg = CONFIGS["2w1s_local2"]
    rc, out, _ = run_job(cfg, "refused", timeout=150, script=WORKER)
    assert_ok(rc, out, world_size(cfg))
    for r in range(world_size(cfg)):
        assert any(line.startswith("CAUGHT refused") for line in worker_lines(out, r)), out
