"""GPU tensors on a real GPU (docs/gpu.md): the device stages on CUDA, torch CUDA tensors, the
DLPack front. Marked ``gpu``; every test skips, with the reason ``byteps.cuda_status()`` gives,
where CUDA support is off (CI never has a GPU).

On a machine with one GPU, "several worker machines" are several processes sharing that GPU
(``--workers 2``: each a worker machine of its own, so the copy stages run end to end through a
server). NCCL refuses two ranks on one GPU: nothing here needs several GPUs (the NCCL stages'
tests are tests/test_gpu_nccl.py).

Run: ``python -m pytest tests/test_gpu.py -m gpu -v`` (``docs/gpu.md`` has the whole GPU
session).
"""

from __future__ import annotations

import importlib.util

import pytest
from jobs import (
    FRAMEWORK_ENV,
    TESTS,
    LiveJob,
    assert_copy_stages_timed,
    assert_no_steady_device_allocations,
    assert_ok,
    kill_and_check,
    launch_config,
    run_job,
)

import byteps

_STATUS = byteps.cuda_status()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _STATUS["available"], reason=f"CUDA off: {_STATUS['reason']}"),
]
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed")

DEVICE_WORKER = str(TESTS / "workers" / "device_worker.py")
TORCH_WORKER = str(TESTS / "workers" / "gpu_torch_worker.py")
ENV = ["BYTEPS_PARTITION_BYTES=65536"] + [f"{k}={v}" for k, v in FRAMEWORK_ENV.items()]
LAYOUTS = {
    "one-process": launch_config(1),
    "forced-distributed": launch_config(1, 1) + ["--env", "BYTEPS_FORCE_DISTRIBUTED=1"],
    "two-machines": launch_config(2, 1),
    "two-machines-local2": launch_config(2, 1, local_size=2),
}


def _size(layout):
    return {"one-process": 1, "forced-distributed": 1, "two-machines": 2,
            "two-machines-local2": 4}[layout]


@needs_torch
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cuda_sums_every_dtype_around_partition_bounds(layout):
    rc, out, _ = run_job(LAYOUTS[layout], "sums", "--cuda", env=ENV, timeout=400,
                         script=DEVICE_WORKER)
    assert_ok(rc, out, _size(layout), min_cases=448)


@needs_torch
@pytest.mark.parametrize("layout", ["one-process", "two-machines"])
def test_cuda_waits_for_a_kernel_still_running(layout):
    rc, out, _ = run_job(LAYOUTS[layout], "producer", "--cuda", env=ENV, timeout=200,
                         script=DEVICE_WORKER)
    assert_ok(rc, out, _size(layout), min_cases=3)


@needs_torch
def test_cuda_times_the_copy_stages():
    """Copy timing on CUDA: every partition's copy of both directions timed between events on
    the copy stream, at a device bandwidth above 1 GB/s (printed: what the copy stages get)."""
    rc, out, _ = run_job(LAYOUTS["two-machines"], "timed", "3", "--cuda", env=ENV, timeout=200,
                         script=DEVICE_WORKER)
    assert_ok(rc, out, 2, min_cases=3)
    for rank, bw in assert_copy_stages_timed(out, (0, 1)).items():
        print(f"rank {rank}: copy stages D2H {bw['d2h']:.1f} GB/s, H2D {bw['h2d']:.1f} GB/s "
              "(64 KiB partitions)")
        assert bw["d2h"] > 1 and bw["h2d"] > 1, bw


@needs_torch
def test_cuda_no_allocation_in_steady_state():
    rc, out, _ = run_job(LAYOUTS["two-machines"], "steady", "6", "--cuda", env=ENV, timeout=200,
                         script=DEVICE_WORKER)
    assert_ok(rc, out, 2, min_cases=18)
    assert_no_steady_device_allocations(out, (0, 1))


@needs_torch
@pytest.mark.parametrize("layout", ["one-process", "two-machines"])
def test_torch_cuda_ops_match_cpu(layout):
    rc, out, _ = run_job(LAYOUTS[layout], "ops", env=ENV, timeout=400, script=TORCH_WORKER)
    assert_ok(rc, out, _size(layout), min_cases=100)


@needs_torch
def test_torch_distributed_optimizer_on_cuda_matches_cpu():
    rc, out, _ = run_job(LAYOUTS["two-machines"], "train", "10", env=ENV, timeout=400,
                         script=TORCH_WORKER)
    assert_ok(rc, out, 2, min_cases=10)


@needs_torch
def test_torch_ddp_on_cuda_matches_cpu():
    rc, out, _ = run_job(LAYOUTS["two-machines"], "ddp", "10", env=ENV, timeout=400,
                         script=TORCH_WORKER)
    assert_ok(rc, out, 2, min_cases=11)


@needs_torch
def test_torch_cross_barrier_on_cuda_matches_cpu():
    rc, out, _ = run_job(LAYOUTS["two-machines"], "crossbarrier", "10", env=ENV, timeout=400,
                         script=TORCH_WORKER)
    assert_ok(rc, out, 2, min_cases=4)


@needs_torch
@pytest.mark.timeout(240)
def test_worker_killed_mid_cuda_push_pull_fails_every_rank():
    with LiveJob(LAYOUTS["two-machines"], "loop", "--cuda", env=ENV + ["BYTEPS_TIMEOUT=100"],
                 grace=40, script=DEVICE_WORKER) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        kill_and_check(job, job.find("worker", 1), survivors=[0])
