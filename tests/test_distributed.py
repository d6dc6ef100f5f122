"""Multi-process tests of the framework-free core (``byteps.basics``) under ``bpslaunch``.

Every test launches a whole job on this host with ``python -m byteps.launch`` and runs
``tests/workers/bps_worker.py MODE`` as the worker command. One launch checks many cases: the
workers compute their inputs and the expected sums themselves (integer-valued data, so float
sums are exact), print ``FAIL ...`` and exit 1 on a wrong result, and end with
``OK <n> cases``, which the tests assert from every rank.

The failure tests (kill -9 of a server or a worker, timeouts, shared-memory cleanup) start the
launcher with ``Popen(start_new_session=True)``, find the job's processes among the launcher's
children (``/proc/<pid>/task/*/children``, role from ``/proc/<pid>/environ``) and only ever
signal those PIDs.
"""


from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
from jobs import (
    CONFIGS,
    LiveJob,
    assert_ok,
    job_pids_alive,
    kill_and_check,
    rss_and_fds,
    run_job,
    shm_segments,
    worker_lines,
    world_size,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux /proc and /dev/shm"
)


# ---------------------------------------------------------------------------- correctness --


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_push_pull_all_dtypes_and_shapes(config):
    """Sum and average, every dtype, shapes (0,) .. (1000, 33), in place and out of place,
    names reused for a second round, plus one 64 MiB float32 tensor."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "correctness", timeout=240)
    assert_ok(rc, out, world_size(cfg), min_cases=178)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config", ["2w1s", "3w2s", "1w_local2"])
def test_many_partitions_versioned_rounds(config):
    """BYTEPS_PARTITION_BYTES=65536: a ~5 MB tensor in ~80 partitions, 4 rounds of changing
    values per dtype; each round must be that round's sum."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "partitions", 4, env=["BYTEPS_PARTITION_BYTES=65536"],
                         timeout=150)
    assert_ok(rc, out, world_size(cfg), min_cases=9)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config,slow", [("2w1s", 0), ("3w2s", 0), ("3w2s", 2),
                                         ("2w1s_local2", 0), ("2w1s_local2", 3)])
def test_fast_and_slow_workers(config, slow):
    """One rank (``slow``) sleeps a random few ms before every push_pull, the others race
    ahead; 200 rounds of a 3-partition tensor with round-dependent values: every result is
    exactly its own round's sum."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "fastslow", 200, slow, env=["BYTEPS_PARTITION_BYTES=4096"],
                         timeout=150)
    assert_ok(rc, out, world_size(cfg), min_cases=200)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config", ["2w1s", "3w2s", "1w_local2"])
def test_many_ops_in_flight_waited_in_reverse(config):
    """50 distinct names (mixed dtypes, shapes, priorities) started before any wait, waited in
    reverse order; then a duplicate in-flight name is rejected with ValueError."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "inflight", env=["BYTEPS_PARTITION_BYTES=65536"], timeout=150)
    assert_ok(rc, out, world_size(cfg), min_cases=53)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config", ["2w1s", "3w2s"])
def test_credit_with_gradients_ready_in_different_orders(config):
    """Credit 1 partition, priorities set, ranks produce the tensors in opposite orders: no
    deadlock (the push credit comes back when the push is written, not after the pull)."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "crossorder", timeout=150,
                         env=["BYTEPS_PARTITION_BYTES=65536", "BYTEPS_SCHEDULING_CREDIT=1",
                              "BYTEPS_TIMEOUT=30"])
    assert_ok(rc, out, world_size(cfg), min_cases=24)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config", ["2w1s", "1w_local2"])
def test_async_overlap_poll(config):
    """poll() is False right after starting a large push_pull, then becomes True; wait()
    returns the right sum."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "overlap", timeout=150)
    assert_ok(rc, out, world_size(cfg), min_cases=3)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config", ["2w1s", "3w2s", "1w_local2"])
def test_declare_order_gives_same_keys(config):
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "declare", timeout=150)
    size = world_size(cfg)
    assert_ok(rc, out, size, min_cases=41)
    keys = {}
    for r in range(size):
        found = [line for line in worker_lines(out, r) if line.startswith("KEYS ")]
        assert found, f"worker {r} printed no KEYS line"
        keys[r] = found[-1]
    assert len(set(keys.values())) == 1, f"workers got different keys: {keys}"


@pytest.mark.timeout(200)
def test_late_worker_does_not_trip_heartbeats():
    """Servers register early and heartbeat only once everyone is there: a worker that starts
    later than BYTEPS_HEARTBEAT_TIMEOUT must not make the scheduler declare a server dead."""
    cfg = CONFIGS["3w2s"]
    rc, out, _ = run_job(cfg, "late", 5, env=["BYTEPS_HEARTBEAT_TIMEOUT=2"], timeout=150)
    assert_ok(rc, out, world_size(cfg), min_cases=41)


# --------------------------------------------------------------------------------- errors --


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config", ["2w1s", "1w_local2", "2w1s_local2"])
def test_mismatch_raises_on_every_rank(config):
    """One name with a rank-dependent shape / size / dtype: every rank catches MismatchError
    (three sub-cases), and the job stays usable afterwards."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "mismatch", env=["BYTEPS_TIMEOUT=30"], timeout=150)
    size = world_size(cfg)
    for r in range(size):
        lines = worker_lines(out, r)
        for case in ("mm.shape", "mm.size", "mm.dtype"):
            assert any(line.startswith(f"MISMATCH-CAUGHT {case}:") for line in lines), (
                f"worker {r} did not catch MismatchError for {case}; output:\n{out[-6000:]}")
    assert_ok(rc, out, size, min_cases=4)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_kill_service_fails_every_worker(role):
    """kill -9 of the server or the scheduler: both workers get PeerLostError naming it."""
    cfg = CONFIGS["2w1s"]
    with LiveJob(cfg, "loop", env=["BYTEPS_TIMEOUT=100"], grace=40) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        caught, rc, _ = kill_and_check(job, job.find(role), survivors=[0, 1])
        for r, (_, msg) in caught.items():
            assert role in msg.lower(), f"worker {r}'s PeerLostError does not name the " \
                                        f"{role}: {msg}"


@pytest.mark.timeout(200)
def test_kill_worker_fails_the_other_worker():
    """kill -9 worker 1 of 2: worker 0 gets PeerLostError naming worker 1 (not the server that
    shuts down because of it), the launcher exits non-zero, nothing is left. The attribution
    is racy in the core, so the scenario runs a few times (fresh job each time)."""
    cfg = CONFIGS["2w1s"]
    for attempt in range(4):
        with LiveJob(cfg, "loop", env=["BYTEPS_TIMEOUT=100"], grace=40) as job:
            job.wait_for(r"^\[worker \d\] READY", count=2)
            victim = job.find("worker", 1)
            caught, rc, _ = kill_and_check(job, victim, survivors=[0])
            msg = caught[0][1]
            assert re.search(r"worker\D{0,20}1", msg.lower()), (
                f"attempt {attempt}: PeerLostError does not name the failed worker 1: {msg}\n"
                f"--- job output ---\n{job.output[-6000:]}")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("config,where", [("2w1s", "declare"), ("2w1s", "declared"),
                                          ("3w2s", "declared"), ("1w_local2", "declared")])
def test_stall_warning_then_timeout_name_tensor_and_missing_rank(config, where):
    """Stall inspector: worker 1 never pushes 'lonely' (never declared, or in a later round:
    the stall is then at the server or the local gate). With BYTEPS_STALL_WARNING_SECONDS=1.5
    and BYTEPS_TIMEOUT=3, worker 0 logs a warning naming the tensor and rank 1, then gets
    BytePSTimeoutError naming both, within ~10 s."""
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "timeout", 6, where,
                         env=["BYTEPS_TIMEOUT=3", "BYTEPS_STALL_WARNING_SECONDS=1.5"], timeout=120)
    lines = worker_lines(out, 0)
    warnings = [line for line in lines if "WARNING" in line and "BYTEPS_STALL_WARNING" in line]
    assert len(warnings) == 1, f"expected one stall warning on worker 0; output:\n{out[-6000:]}"
    assert "'lonely'" in warnings[0] and re.search(r"not yet submitted by ranks? 1\b", warnings[0]), \
        warnings[0]
    hits = [m for line in lines if (m := re.match(r"CAUGHT-TIMEOUT (\d+\.\d+) (.*)$", line))]
    assert hits, f"worker 0 did not catch BytePSTimeoutError; output:\n{out[-6000:]}"
    dt, msg = float(hits[0].group(1)), hits[0].group(2)
    assert 2.0 <= dt <= 10.0, f"timeout after {dt} s with BYTEPS_TIMEOUT=3"
    assert "lonely" in msg and re.search(r"workers \[1(, 2)?\]|ranks? 1\b", msg), msg
    assert_ok(rc, out, world_size(cfg))


@pytest.mark.timeout(200)
def test_no_shm_left_after_normal_exit():
    """--local-size 2 job with several names ends normally: no /dev/shm/byteps_<job>_* left."""
    cfg = CONFIGS["1w_local2"]
    go = Path(f"/tmp/bps_test_go_{os.getpid()}_{time.monotonic_ns()}")
    try:
        with LiveJob(cfg, "shm", str(go)) as job:
            job.wait_for(r"^\[worker \d\] READY", count=2)
            job.snapshot()
            job_id = job.job_id
            assert job_id, "no BYTEPS_JOB_ID in the children's environment"
            go.touch()
            rc = job.wait(60)
            assert_ok(rc, job.output, 2, min_cases=12)
            assert not shm_segments(job_id), f"segments left: {shm_segments(job_id)}"
            assert not job_pids_alive(job.seen_pids, job_id)
    finally:
        go.unlink(missing_ok=True)


@pytest.mark.timeout(200)
def test_no_shm_left_after_worker_killed():
    """Single machine, --local-size 2: local rank 0 starts a push_pull local rank 1 never
    joins (so its segment still has a name), then local rank 1 is killed with SIGKILL. Rank 0
    gets PeerLostError naming local rank 1, the launcher exits non-zero, and no segment of the
    job remains."""
    cfg = CONFIGS["1w_local2"]
    with LiveJob(cfg, "orphan", env=["BYTEPS_TIMEOUT=100"], grace=40) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        job.wait_for(r"^\[worker 0\] ORPHAN-STARTED")
        job.snapshot()
        assert shm_segments(job.job_id), (
            "no /dev/shm/byteps_<job>_* segment while a local push_pull is half done "
            "(the kill below would not test the cleanup)")
        victim = job.find("worker", 1)
        caught, rc, job_id = kill_and_check(job, victim, survivors=[0])
        assert re.search(r"rank\D{0,5}1", caught[0][1]), caught[0][1]
        assert not shm_segments(job_id), f"segments left: {shm_segments(job_id)}"


# ------------------------------------------------------------------------------------ soak --

SOAK_ITERATIONS = 10_000
SOAK_RSS_GROWTH_KIB = 8 << 10  # allocator and interpreter noise; a leak per op would be GBs


def _measure(job, phase):
    job.wait_for(rf"MEASURE {phase}", count=2, timeout=900)
    return {(env["DMLC_ROLE"], env.get("DMLC_WORKER_ID", "")): rss_and_fds(pid)
            for pid, env in job.snapshot().items() if env.get("DMLC_ROLE")}


@pytest.mark.slow
def test_soak_memory_and_descriptors_flat():
    """10 000 push_pull iterations over 50 tensors (1 element .. 1 MiB, five dtypes), 2 worker
    machines + 1 server: resident memory of every process (workers, server, scheduler) grows by
    at most 8 MiB between the end of the warm-up (a tenth of the run) and the end, and the number
    of open file descriptors does not change; the job ends cleanly and leaves nothing behind."""
    job = LiveJob(["--workers", "2", "--servers", "1"], "soak", SOAK_ITERATIONS)
    try:
        start = _measure(job, "start")
        end = _measure(job, "end")
        rc = job.wait(600)
    finally:
        job.kill()
    assert_ok(rc, job.output, 2, min_cases=SOAK_ITERATIONS * 50)
    assert set(start) == set(end) and len(start) == 4, (start, end)  # 2 workers, server, scheduler
    for proc, (rss0, fds0) in start.items():
        rss1, fds1 = end[proc]
        print(f"soak {proc}: RSS {rss0} -> {rss1} KiB, descriptors {fds0} -> {fds1}")
        assert rss1 - rss0 <= SOAK_RSS_GROWTH_KIB, f"{proc}: RSS {rss0} -> {rss1} KiB"
        assert fds1 == fds0, f"{proc}: open descriptors {fds0} -> {fds1}"
    assert job_pids_alive(job.seen_pids, job.job_id) == []
    assert shm_segments(job.job_id) == []
