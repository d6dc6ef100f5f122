"""allgather, broadcast and reducescatter in real jobs (docs/collectives.md), through
byteps.collectives: tests/workers/collectives_worker.py checks every result against NumPy.

The jobs cover one process per machine (2 and 3 machines, so the ring has a middle), several
processes per machine (the local sum builds the machine's block), a single machine, and tensors
of many partitions (``BYTEPS_PARTITION_BYTES=65536``). The error job checks that ranks that
differ beyond the first dimension, or name different roots, fail on every rank and that the
job stays usable.
"""

from __future__ import annotations

import os
import sys

import pytest
from jobs import CONFIGS, assert_ok, run_job, worker_lines, world_size

WORKER = os.path.join(os.path.dirname(__file__), "workers", "collectives_worker.py")
PARTS = "BYTEPS_PARTITION_BYTES=65536"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")

JOBS = {
    "2w1s": CONFIGS["2w1s"],
    "3w2s": CONFIGS["3w2s"],
    "2w1s_local2": CONFIGS["2w1s_local2"],
    "1w_local2": CONFIGS["1w_local2"],
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", list(JOBS), ids=list(JOBS))
def test_allgather_broadcast_reducescatter(job):
    rc, out, _ = run_job(JOBS[job], "collectives", env=[PARTS], timeout=240, script=WORKER)
    assert_ok(rc, out, world_size(JOBS[job]), min_cases=40)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("job", ["2w1s", "2w1s_local2"])
def test_collective_errors_on_every_rank(job):
    rc, out, _ = run_job(JOBS[job], "errors", env=["BYTEPS_TIMEOUT=20"], timeout=150,
                         script=WORKER)
    for r in range(world_size(JOBS[job])):
        caught = {line.split(":")[0] for line in worker_lines(out, r) if line.startswith("CAUGHT")}
        assert caught == {"CAUGHT trailing-dims", "CAUGHT rank-dependent-root"}, out[-6000:]
    assert_ok(rc, out, world_size(JOBS[job]), min_cases=3)
