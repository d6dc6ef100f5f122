"""The NCCL stages without GPUs (BYTEPS_NCCL=1; docs/gpu.md): REDUCE and BROADCAST among the
local processes of a machine, on the fake device's collective.

The fake collective runs each call on the caller's fake stream (a thread) and meets the other
local processes in a shared-memory segment; it checks that every process made the same call
(kind, count, dtype) as its n-th, so a pipeline that lets the local processes make their calls
in different orders fails here with an error naming both calls, where NCCL would hang or mix
the tensors. The same worker script runs on CUDA in tests/test_gpu_nccl.py (several GPUs).
"""

from __future__ import annotations

import json
import time

import pytest
from jobs import (
    LiveJob,
    assert_ok,
    kill_and_check,
    launch_config,
    run_job,
    worker_lines,
)
from test_device import ENV, WORKER
from testing_hooks import core_testing

NCCL = ENV + ["BYTEPS_NCCL=1"]

LAYOUTS = {
    "local-group-3": (launch_config(1, local_size=3), 3),
    "distributed-local": (launch_config(2, 1, local_size=2), 4),
    "distributed-local-3": (launch_config(2, 1, local_size=3), 6),
}


@pytest.mark.parametrize("layout", ["local-group-3", "distributed-local"])
def test_nccl_sums_every_dtype_around_partition_bounds(layout):
    """Every dtype, sizes around the partition bound, sum and average, in place and out of
    place, 2 rounds each, exact (float averages within an ulp). 3 processes leave a remainder
    of 1 or 2 elements in most partitions (all-reduced, then broadcast from the last process).
    On one machine an integer average is refused (NCCL averages on the GPU), with the way out
    in the message."""
    cfg, size = LAYOUTS[layout]
    rc, out, _ = run_job(cfg, "sums", env=NCCL + ["BYTEPS_LOG_LEVEL=INFO"], timeout=300,
                         script=WORKER)
    assert_ok(rc, out, size, min_cases=400)
    for r in range(size):
        assert any("BYTEPS_NCCL: REDUCE" in line for line in worker_lines(out, r)), r
        assert any("summed among the machine's" in line for line in worker_lines(out, r)), r


@pytest.mark.parametrize("layout", ["local-group-3", "distributed-local-3"])
def test_nccl_calls_keep_one_order_across_the_local_processes(layout):
    """12 tensors in flight at once, started in another order and with other priorities on
    every process and round: the local root orders the collective calls, so every process makes
    them in one order (checked call by call by the fake collective) and every sum is exact.
    Letting each process call as its partitions arrive fails this test ("call 1 differs")."""
    cfg, size = LAYOUTS[layout]
    rc, out, _ = run_job(cfg, "orders", "5", env=NCCL + ["FAKE_COPY_DELAY_US=200"],
                         timeout=240, script=WORKER)
    assert_ok(rc, out, size, min_cases=60)


def test_nccl_waits_for_the_producer():
    cfg, size = LAYOUTS["distributed-local"]
    rc, out, _ = run_job(cfg, "producer", env=NCCL, timeout=120, script=WORKER)
    assert_ok(rc, out, size, min_cases=3)


def test_nccl_no_allocation_in_steady_state():
    """One stream per process for the calls, one event per partition, no pinned buffer (the
    shards go through the aggregates, page-locked in place once per tensor): all made in the
    first round; every round makes as many calls and copies as the first."""
    cfg, size = LAYOUTS["distributed-local"]
    rc, out, _ = run_job(cfg, "steady", "6", env=NCCL, timeout=120, script=WORKER)
    assert_ok(rc, out, size, min_cases=18)
    for r in range(size):
        line = [x for x in worker_lines(out, r) if x.startswith("ALLOCS ")][-1]
        counts = json.loads(line[len("ALLOCS "):])
        first, last = counts["first"], counts["last"]
        for k in ("host_allocs", "streams", "events", "host_registers"):
            assert first[k] == last[k], (r, k, first, last)
        assert first["host_allocs"] == 0 and first["host_registers"] == 3, first
        assert first["collectives"] > 0 and last["collectives"] == 6 * first["collectives"]
        assert last["copies"] == 6 * first["copies"], (first, last)


def test_nccl_timeline_has_the_collective_stages(tmp_path):
    """A traced step of an NCCL tensor: every partition's REDUCE ends before its COPY_D2H
    starts, and its COPY_H2D before its BROADCAST."""
    trace = tmp_path / "trace"
    cfg, size = LAYOUTS["distributed-local"]
    rc, out, _ = run_job(cfg, "timed", "3", timeout=120, script=WORKER,
                         env=NCCL + ["BYTEPS_TRACE_ON=1", "BYTEPS_TRACE_START_STEP=1",
                                     "BYTEPS_TRACE_END_STEP=2", f"BYTEPS_TRACE_DIR={trace}"])
    assert_ok(rc, out, size, min_cases=3)
    files = sorted(trace.glob("worker*/*/comm.json"))
    assert len(files) == size, list(trace.rglob("*"))
    for f in files:
        spans = {}
        for e in json.loads(f.read_text())["traceEvents"]:
            a = e.get("args", {})
            if e.get("ph") == "X" and e["cat"] != "push_pull":
                spans[a["partition"], e["cat"]] = (e["ts"], e["ts"] + e["dur"])
        parts = {p for p, _ in spans}
        assert len(parts) >= 5, sorted(spans)
        for p in parts:
            assert spans[p, "REDUCE"][1] <= spans[p, "COPY_D2H"][0], (f, p)
            assert spans[p, "COPY_H2D"][1] <= spans[p, "BROADCAST"][0], (f, p)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("victim", [0, 1])
def test_nccl_local_process_killed_mid_push_pull_fails_every_rank(victim):
    """kill -9 one of the 2 processes of a machine while their NCCL tensor is reduced: the other
    gets PeerLostError naming the operation, the launcher exits non-zero, nothing is left."""
    with LiveJob(launch_config(1, local_size=2), "loop", env=NCCL + ["BYTEPS_TIMEOUT=100"],
                 grace=40, script=WORKER) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        kill_and_check(job, job.find("worker", victim), survivors=[1 - victim])


@pytest.mark.timeout(200)
def test_nccl_call_in_flight_is_aborted_when_a_local_process_dies():
    """Local rank 1's collective calls stall from its 20th on (a GPU stuck in a kernel), so
    local rank 0 sits inside its own call waiting for it; then rank 1 is killed. Rank 0's call
    is aborted (NCCL: ncclCommAbort) and it gets PeerLostError within seconds, not after
    BYTEPS_TIMEOUT (100 s) when the call would give up by itself."""
    env = NCCL + ["BYTEPS_TIMEOUT=100", "FAKE_COLLECTIVE_STALL_LOCAL_RANK=1",
                  "FAKE_COLLECTIVE_STALL_AFTER=20"]
    with LiveJob(launch_config(1, local_size=2), "loop", env=env, grace=40,
                 script=WORKER) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        time.sleep(1.5)  # both at the stalled call by now (a round takes ~10 ms)
        caught, _, _ = kill_and_check(job, job.find("worker", 1), survivors=[0], bound=20)
        assert "local rank 1" in caught[0][1], caught


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "uint8", "int8",
                                   "int32", "int64"])
def test_one_rank_collective_calls_copy(dtype):
    """The seam's calls on a communicator of one rank (what tests/test_gpu_nccl.py runs with
    NCCL on a machine with one GPU): each call's output is its input."""
    import numpy as np

    T = core_testing()
    src = (np.arange(1031) % 100).astype(np.uint16 if dtype == "bfloat16" else dtype)
    for call in ("reduce_scatter", "all_reduce", "all_gather", "broadcast"):
        dst = np.zeros_like(src)
        T.one_rank_collective("fake", 0, call, src.ctypes.data, dst.ctypes.data,
                              src.size, dtype, call == "all_reduce")
        assert np.array_equal(dst, src), (call, dst[:8])


@pytest.mark.parametrize("layout", ["local-group-3", "distributed-local"])
def test_nccl_min_max_product_take_the_host_path(layout):
    """BYTEPS_NCCL=1 and device tensors reduced with min, max, product: NCCL's stages sum, so
    these tensors take the host path (the local reduce combines with the op), exact."""
    cfg, size = LAYOUTS[layout]
    rc, out, _ = run_job(cfg, "ops", env=NCCL, timeout=180, script=WORKER)
    assert_ok(rc, out, size, min_cases=24)


def test_nccl_tensors_of_the_other_plans():
    """A compressed (fp16) and a ring all-reduce device tensor beside a summation-service one,
    in flight at once, 2 machines of 3 processes: the NCCL plans with COMPRESS/DECOMPRESS and
    with REDUCE_SCATTER/ALL_GATHER around the shards in the aggregate, exact."""
    cfg, size = LAYOUTS["distributed-local-3"]
    rc, out, _ = run_job(cfg, "schemes", "3", env=NCCL + ["BYTEPS_SYNC=ring"], timeout=180,
                         script=WORKER)
    assert_ok(rc, out, size, min_cases=9)


def test_nccl_set_up_that_cannot_complete_fails_every_rank():
    """Local rank 0 sums a device tensor with NCCL; local rank 1 waits, then push_pulls the same
    name in host memory: the communicator never gets its second rank. Rank 0 gets the error
    after BYTEPS_TIMEOUT, naming the NCCL stages and how many local ranks joined, and the job
    has failed on rank 1 too: its push_pull is refused with the same cause."""
    rc, out, secs = run_job(launch_config(1, local_size=2), "alone",
                            env=NCCL + ["BYTEPS_TIMEOUT=4"], timeout=90, script=WORKER)
    assert secs < 60, secs
    for r in (0, 1):
        caught = [x for x in worker_lines(out, r) if x.startswith("CAUGHT ")]
        assert caught, (r, out[-3000:])
        assert "NCCL stages (BYTEPS_NCCL=1) on local rank 0" in caught[0], caught
        assert "1 of 2 local ranks joined the communicator within 4 s" in caught[0], caught


@pytest.mark.timeout(200)
def test_nccl_call_stuck_on_a_live_process_fails_every_rank_at_the_timeout():
    """Local rank 1's collective calls stall from its 20th on, and it stays alive: local rank
    0 waits inside its own call. At BYTEPS_TIMEOUT (4 s) the operation fails, the communicator
    is aborted (NCCL would wait forever; the fake gives up only after 60 s), and both ranks get
    an error within seconds (the script reports it and ends)."""
    env = NCCL + ["BYTEPS_TIMEOUT=4", "FAKE_COLLECTIVE_STALL_LOCAL_RANK=1",
                  "FAKE_COLLECTIVE_STALL_AFTER=20"]
    started = time.time()
    rc, out, secs = run_job(launch_config(1, local_size=2), "stuck", env=env, timeout=150,
                            script=WORKER)
    assert secs < 45, (secs, out[-3000:])
    for r in (0, 1):
        caught = [x for x in worker_lines(out, r) if x.startswith("CAUGHT ")]
        assert caught, (r, out[-3000:])
        t, kind = caught[0].split()[1:3]
        assert float(t) - started < 30, caught
        assert kind in ("BytePSTimeoutError", "InternalError", "PeerLostError"), caught
        assert "did not finish within 4 s (BYTEPS_TIMEOUT)" in caught[0], caught
