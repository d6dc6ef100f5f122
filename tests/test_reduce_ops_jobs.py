"""push_pull with op min, max and product in real jobs (docs/collectives.md "Reduction ops").

Each job runs tests/workers/ops_worker.py under the launcher: every dtype, a tensor of several
partitions (``BYTEPS_PARTITION_BYTES=65536``) and a tiny one, two rounds per name, a NaN that
must win min and max; the servers (plain and HiPS), the local reduce of several processes per
machine, a single machine, and the ring and tree all-reduces each combine with the op. The
error job checks that average with another op, a name reused with another op and a
rank-dependent op fail on every rank, and that the job stays usable.
"""

from __future__ import annotations

import os
import sys

import pytest
from jobs import CONFIGS, assert_ok, run_job, worker_lines, world_size

WORKER = os.path.join(os.path.dirname(__file__), "workers", "ops_worker.py")
PARTS = "BYTEPS_PARTITION_BYTES=65536"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")

JOBS = {
    "2w1s": (CONFIGS["2w1s"], []),
    "3w2s": (CONFIGS["3w2s"], []),
    "2w1s_local2": (CONFIGS["2w1s_local2"], []),
    "1w_local2": (CONFIGS["1w_local2"], []),
    "3w1s_ring": (["--workers", "3", "--servers", "1"], ["BYTEPS_SYNC=ring"]),
    "3w1s_tree": (["--workers", "3", "--servers", "1"], ["BYTEPS_SYNC=tree"]),
    "4w3s_hips": (["--workers", "4", "--servers", "3"],
                  ["BYTEPS_SYNC=hips", "BYTEPS_HIPS_GROUP=2"]),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", list(JOBS), ids=list(JOBS))
def test_min_max_product_every_dtype(job):
    config, env = JOBS[job]
    rc, out, _ = run_job(config, "ops", env=[PARTS, *env], timeout=240, script=WORKER)
    assert_ok(rc, out, world_size(config), min_cases=50)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("job", ["2w1s", "1w_local2", "2w1s_local2", "3w2s"])
def test_barrier_waits_for_the_last_rank(job):
    """byteps.basics.barrier: rank r arrives r * 0.3 s late; no rank leaves barrier i before
    the last rank entered it (five in a row)."""
    config, env = JOBS[job]
    rc, out, _ = run_job(config, "barrier", env=env, timeout=150, script=WORKER)
    size = world_size(config)
    assert_ok(rc, out, size, min_cases=5)
    stamps = {}  # barrier -> [(entered, left)]
    for r in range(size):
        for line in worker_lines(out, r):
            if line.startswith("BARRIER "):
                _, i, entered, left = line.split()
                stamps.setdefault(int(i), []).append((float(entered), float(left)))
    assert sorted(stamps) == list(range(5)) and all(len(v) == size for v in stamps.values())
    for i, pairs in stamps.items():
        last_in = max(e for e, _ in pairs)
        assert all(left >= last_in for _, left in pairs), (i, pairs)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("job", ["2w1s", "1w_local2", "2w1s_local2"])
def test_op_errors_on_every_rank(job):
    config, env = JOBS[job]
    rc, out, _ = run_job(config, "errors", env=["BYTEPS_TIMEOUT=30", *env], timeout=150,
                         script=WORKER)
    for r in range(world_size(config)):
        caught = {line.split(":")[0] for line in worker_lines(out, r) if line.startswith("CAUGHT")}
        assert caught == {"CAUGHT average-with-max", "CAUGHT unknown-op",
                          "CAUGHT reused-with-min", "CAUGHT rank-dependent-op"}, out[-6000:]
    assert_ok(rc, out, world_size(config), min_cases=5)
