"""Process sets in real jobs (docs/collectives.md, "Process sets"):
tests/workers/process_sets_worker.py runs every collective in each set a rank is in and checks
it against NumPy, then the errors (a rank outside the set, ranks that add different sets, a
removed set, a set holding part of a machine).

Jobs: three machines of one process (overlapping sets, a set of one rank, sets given to
``init``), and two machines of two processes (a set per machine; a set across half of each is
refused).
"""

from __future__ import annotations

import os
import sys

import pytest
from jobs import CONFIGS, assert_ok, run_job, worker_lines, world_size

WORKER = os.path.join(os.path.dirname(__file__), "workers", "process_sets_worker.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")

JOBS = {"3w2s": CONFIGS["3w2s"], "2w1s_local2": CONFIGS["2w1s_local2"]}
CAUGHT = {
    "3w2s": {"not in the set", "different sets", "removed set"},
    "2w1s_local2": {"part of a machine", "not in the set", "different sets", "removed set"},
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("job", list(JOBS), ids=list(JOBS))
def test_process_sets(job):
    rc, out, _ = run_job(JOBS[job], "sets", env=["BYTEPS_PARTITION_BYTES=65536"], timeout=240,
                         script=WORKER)
    assert_ok(rc, out, world_size(JOBS[job]), min_cases=12)
    for r in range(world_size(JOBS[job])):
        caught = {line.split(":")[0][len("CAUGHT "):] for line in worker_lines(out, r)
                  if line.startswith("CAUGHT")}
        # "removed set": only the ranks of the removed (last) set try it
        assert caught - {"removed set"} == CAUGHT[job] - {"removed set"}, out[-6000:]


@pytest.mark.timeout(300)
def test_process_sets_under_sync_auto():
    """BYTEPS_SYNC=auto declares every tensor through the cost model before its first
    push_pull: the sets' own agreement (add_process_set's digests) goes that way too, and every
    collective of every set still matches NumPy."""
    rc, out, _ = run_job(JOBS["3w2s"], "sets",
                         env=["BYTEPS_PARTITION_BYTES=65536", "BYTEPS_SYNC=auto"], timeout=240,
                         script=WORKER)
    assert_ok(rc, out, world_size(JOBS["3w2s"]), min_cases=12)
