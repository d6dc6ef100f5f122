"""Device tensors without a GPU: CUDA loaded at run time (and the reasons it is off), and the
device stages of the pipeline (COPY_D2H ... COPY_H2D) on the fake device (docs/gpu.md).

The fake device's "device memory" is host memory and each of its streams is a thread with a
delay before every copy, so a stage that forgets to wait for an event sums or returns data
that is not there yet, and these tests see a wrong value. The same worker script runs on CUDA
in tests/test_gpu.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from error_checks import single_process_job
from jobs import (
    PY,
    REPO,
    TESTS,
    LiveJob,
    assert_copy_stages_timed,
    assert_no_steady_device_allocations,
    assert_ok,
    kill_and_check,
    launch_config,
    run_job,
    worker_lines,
)
from testing_hooks import skip_without_core_testing

import byteps
from byteps import _core, basics, cuda
from byteps.errors import InvalidArgumentError, InvalidTypeError

WORKER = str(TESTS / "workers" / "device_worker.py")
#: the worker sets the fake device's delays through byteps._core_testing
needs_hooks = skip_without_core_testing()
ENV = ["BYTEPS_PARTITION_BYTES=65536"]

# ------------------------------------------------------------------- CUDA at run time --


def test_status_says_why_cuda_is_off():
    s = byteps.cuda_status()
    assert set(s) >= {"available", "reason", "library", "runtime_version", "driver_version",
                      "device_count"}
    assert byteps.cuda_available() == s["available"]
    if s["available"]:
        assert s["device_count"] >= 1 and s["reason"] is None
    else:
        assert re.match(r"(libcudart\.so .* not found|no CUDA device)", s["reason"]), s
    assert cuda.describe(s).startswith("CUDA: on" if s["available"] else "CUDA: off: ")


def test_runtime_not_found_names_what_was_tried(tmp_path):
    if byteps.cuda_available():
        pytest.skip("CUDA is loaded in this process: the loader keeps it")
    junk = tmp_path / "libcudart.so.99"
    junk.write_text("not a library")
    missing = str(tmp_path / "nothing" / "libcudart.so.12")
    s = _core.device.cuda_status([missing, str(junk)], system=False)
    assert not s["available"] and s["library"] is None
    assert "libcudart.so (the CUDA runtime) not found in 2 candidate file(s)" in s["reason"]
    assert missing in s["reason"] and str(junk) in s["reason"]
    assert "No such file" in s["reason"]
    n = _core.device.nccl_status([missing], system=False)
    assert not n["available"] and "libnccl.so (NCCL) not found" in n["reason"]
    assert n["min_version"] == 21800 and n["stages_supported"] is False


def test_candidates_prefer_newer_sonames():
    paths = ["d/libcudart.so", "d/libcudart.so.12.4.127", "d/libcudart.so.13"]
    assert sorted(paths, key=cuda._version_key) == [paths[2], paths[1], paths[0]]
    for path in cuda.library_candidates("libcudart"):
        assert re.search(r"/libcudart\.so(\.\d+)*$", path), path


def test_importing_byteps_loads_no_cuda():
    code = ("import sys, byteps, byteps.basics, byteps.errors\n"
            "maps = open('/proc/self/maps').read()\n"
            "print('cudart' in maps, 'byteps.cuda' in sys.modules, 'byteps.dlpack' in "
            "sys.modules)\n")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]


def test_cuda_tensor_refused_with_the_reason_when_off():
    if byteps.cuda_available():
        pytest.skip("CUDA is on here")
    with single_process_job(basics.shutdown):
        basics.init()
        x = np.zeros(4, np.float32)
        with pytest.raises(InvalidArgumentError, match="CUDA support is off"):
            _core.push_pull_async("c", x.ctypes.data, x.ctypes.data, x.nbytes, "float32", [4],
                                  False, device="cuda")


# --------------------------------------------------------- fake device through the pipeline --

LAYOUTS = {
    "one-process": launch_config(1),
    "distributed": launch_config(2, 1),
    "local-group": launch_config(1, local_size=2),
    "distributed-local": launch_config(2, 1, local_size=2),
}


@needs_hooks
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fake_device_sums_every_dtype_around_partition_bounds(layout):
    cfg = LAYOUTS[layout]
    rc, out, _ = run_job(cfg, "sums", env=ENV, timeout=240, script=WORKER)
    assert_ok(rc, out, 2 if layout != "one-process" else 1, min_cases=448)


@needs_hooks
@pytest.mark.parametrize("layout", ["one-process", "distributed", "distributed-local"])
def test_fake_device_waits_for_the_producer(layout):
    cfg = LAYOUTS[layout]
    rc, out, _ = run_job(cfg, "producer", env=ENV, timeout=120, script=WORKER)
    assert_ok(rc, out, 1 if layout == "one-process" else 2, min_cases=3)


@needs_hooks
def test_fake_device_tensors_of_the_other_plans():
    """A compressed (fp16) and a ring all-reduce device tensor beside a summation-service one,
    in flight at once, 2 machines of 2 processes (COPY_D2H and COPY_H2D around the plans with
    COMPRESS/DECOMPRESS and REDUCE_SCATTER/ALL_GATHER), exact."""
    rc, out, _ = run_job(LAYOUTS["distributed-local"], "schemes", "3", timeout=180,
                         env=ENV + ["BYTEPS_SYNC=ring"], script=WORKER)
    assert_ok(rc, out, 4, min_cases=9)


@needs_hooks
def test_fake_device_no_allocation_in_steady_state():
    cfg = LAYOUTS["distributed"]
    rc, out, _ = run_job(cfg, "steady", "6", env=ENV, timeout=120, script=WORKER)
    assert_ok(rc, out, 2, min_cases=18)
    # One pinned buffer per tensor, two copy streams, one event per partition: all made in the
    # first round and reused.
    for first, last in assert_no_steady_device_allocations(out, (0, 1)).values():
        assert last["copies"] == 6 * first["copies"], (first, last)
        assert last["d2h_timed"] == last["h2d_timed"] == 0, last  # copy timing is off


def _traced_device_job(tmp_path):
    """A 2-machine job of a device tensor (5+ partitions, 2 ms per fake copy), steps 1 and 2
    traced; returns the two comm.json paths."""
    trace = tmp_path / "trace"
    rc, out, _ = run_job(LAYOUTS["distributed"], "timed", "4", timeout=120, script=WORKER,
                         env=ENV + ["FAKE_COPY_DELAY_US=2000", "BYTEPS_TRACE_ON=1",
                                    "BYTEPS_TRACE_START_STEP=1", "BYTEPS_TRACE_END_STEP=3",
                                    f"BYTEPS_TRACE_DIR={trace}"])
    assert_ok(rc, out, 2, min_cases=4)
    files = sorted(trace.glob("worker*/0/comm.json"))
    assert len(files) == 2, list(trace.rglob("*"))
    return files


@needs_hooks
def test_fake_device_timeline_shows_copies_overlapping_the_network(tmp_path):
    """BYTEPS_TRACE_ON with a device tensor: every partition of a traced step has its COPY_D2H
    before its PUSH and its COPY_H2D after its PULL, and a later partition's D2H copy runs while
    an earlier one is pushed or pulled (the copies overlap the network)."""
    overlapped = False
    for f in _traced_device_job(tmp_path):
        spans = {}  # (step, partition, stage) -> (start, end)
        for e in json.loads(f.read_text())["traceEvents"]:
            a = e.get("args", {})
            if e.get("ph") == "X" and e["cat"] != "push_pull":
                spans[a["step"], a["partition"], e["cat"]] = (e["ts"], e["ts"] + e["dur"])
        steps = {k[0] for k in spans}
        parts = {k[1] for k in spans}
        assert steps == {1, 2} and len(parts) >= 5, sorted(spans)
        for step in steps:
            for p in parts:
                d2h, push = spans[step, p, "COPY_D2H"], spans[step, p, "PUSH"]
                pull, h2d = spans[step, p, "PULL"], spans[step, p, "COPY_H2D"]
                assert d2h[1] <= push[0] and pull[1] <= h2d[0], (step, p, d2h, push, pull, h2d)
                later = spans.get((step, p + 1, "COPY_D2H"))
                if later and later[0] < pull[1] and later[1] > push[0]:
                    overlapped = True
    assert overlapped, "no D2H copy ran while an earlier partition was pushed or pulled"


@needs_hooks
def test_gantt_chart_draws_the_copy_stages_as_rows(tmp_path):
    """benchmarks.timeline_plot draws a device tensor's COPY_D2H and COPY_H2D as rows of their
    own, first and last of each rank's stages."""
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(REPO))
    from benchmarks import timeline_plot

    drawn = timeline_plot.render(_traced_device_job(tmp_path), tmp_path / "step.png")
    assert drawn["ranks"] == [0, 1] and (tmp_path / "step.png").read_bytes()[:4] == b"\x89PNG"
    assert drawn["rows"][:6] == ["rank 0 push_pull", "rank 0 COPY_D2H", "rank 0 PUSH",
                                 "rank 0 PULL", "rank 0 COPY_OUT", "rank 0 COPY_H2D"], drawn


@needs_hooks
@pytest.mark.parametrize("layout", ["one-process", "distributed-local"])
def test_fake_device_times_the_copy_stages(layout):
    """With copy timing on, every partition's D2H and H2D copy is timed between events around
    it on the copy stream: 3 rounds of every partition per direction, their bytes, and at least
    the fake device's delay before each copy (2 ms) of device time, never more than the
    rounds' wall time. One process on one machine copies within the device instead, and
    allocates no pinned buffer."""
    rc, out, _ = run_job(LAYOUTS[layout], "timed", "3", env=ENV + ["FAKE_COPY_DELAY_US=2000"],
                         timeout=120, script=WORKER)
    size = 1 if layout == "one-process" else 4
    assert_ok(rc, out, size, min_cases=3)
    one = layout == "one-process"
    assert_copy_stages_timed(out, range(size), min_copy_s=0.002,
                             directions=("d2d",) if one else ("d2h", "h2d"))
    if one:
        line = [x for x in worker_lines(out, 0) if x.startswith("TIMED ")][-1]
        assert json.loads(line[len("TIMED "):])["stats"]["host_allocs"] == 0, line


def test_device_arguments_are_checked():
    with single_process_job(basics.shutdown):
        basics.init()
        x = np.arange(8, dtype=np.float32)
        with pytest.raises(InvalidTypeError, match="unsupported device 'tpu'"):
            _core.push_pull_async("d", x.ctypes.data, x.ctypes.data, x.nbytes, "float32", [8],
                                  False, device="tpu")
        with pytest.raises(InvalidArgumentError, match="fake device 1 does not exist"):
            _core.push_pull_async("d", x.ctypes.data, x.ctypes.data, x.nbytes, "float32", [8],
                                  False, device="fake", device_id=1)
        basics.wait(_core.push_pull_async("d", x.ctypes.data, x.ctypes.data, x.nbytes,
                                          "float32", [8], False, device="fake"))
        assert np.array_equal(x, np.arange(8, dtype=np.float32))
        with pytest.raises(InvalidArgumentError, match="first used on fake:0 and is now on cpu"):
            basics.push_pull_async("d", x.ctypes.data, x.ctypes.data, x.nbytes, "float32", [8],
                                   False)


@needs_hooks
@pytest.mark.timeout(200)
def test_fake_device_worker_killed_mid_push_pull_fails_every_rank():
    """kill -9 one of two worker machines while device push_pulls run: the other gets
    PeerLostError naming the operation, the launcher exits non-zero, nothing is left."""
    with LiveJob(LAYOUTS["distributed"], "loop", env=ENV + ["BYTEPS_TIMEOUT=100"], grace=40,
                 script=WORKER) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        kill_and_check(job, job.find("worker", 1), survivors=[0])
