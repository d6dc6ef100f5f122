"""The NCCL stages on real GPUs (BYTEPS_NCCL=1; docs/gpu.md). Marked ``gpu``.

On a machine with one GPU NCCL refuses two ranks, so there the collective seam's calls run on a
communicator of one rank (each call then copies): what it checks is that the NCCL library
loaded at run time accepts byteps' communicator configuration (nonblocking, NCCL >= 2.18) and
the calls, for every dtype, on a stream of byteps' own. The stages themselves (REDUCE,
BROADCAST among the local processes) need a machine with at least two GPUs, one per local
process; they skip elsewhere, with the count in the reason.
"""

from __future__ import annotations

import importlib.util

import pytest
from jobs import FRAMEWORK_ENV, TESTS, LiveJob, assert_ok, kill_and_check, launch_config, run_job
from testing_hooks import core_testing

import byteps
from byteps import cuda

_STATUS = byteps.cuda_status()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _STATUS["available"], reason=f"CUDA off: {_STATUS['reason']}"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

DEVICE_WORKER = str(TESTS / "workers" / "device_worker.py")
ENV = (["BYTEPS_PARTITION_BYTES=65536", "BYTEPS_NCCL=1"]
       + [f"{k}={v}" for k, v in FRAMEWORK_ENV.items()])
DTYPES = ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int32", "int64"]


def _nccl_or_skip():
    status = cuda.nccl_status()
    if not status["available"]:
        pytest.skip(f"NCCL off: {status['reason']}")
    if not status["stages_supported"]:
        pytest.skip(f"NCCL {status['version']} is older than 2.18 (the NCCL stages need it)")
    return status


def _gpus():
    import torch

    return torch.cuda.device_count()


@pytest.mark.parametrize("dtype", DTYPES)
def test_nccl_calls_on_one_gpu(dtype):
    """Each call of the seam on a one-rank NCCL communicator: the output is the input (all_reduce
    averaged by 1 too), written on byteps' stream and complete when the call returns."""
    import torch

    _nccl_or_skip()
    torch_dtype = getattr(torch, dtype)
    n = 4099
    src = (torch.arange(n, device="cuda") % 100).to(torch_dtype)
    for call, average in (("reduce_scatter", False), ("all_reduce", False),
                          ("all_reduce", dtype.startswith(("float", "bfloat"))),
                          ("all_gather", False), ("broadcast", False)):
        dst = torch.zeros_like(src)
        torch.cuda.synchronize()
        core_testing().one_rank_collective("cuda", 0, call, src.data_ptr(), dst.data_ptr(),
                                           n, dtype, average)
        assert torch.equal(dst, src), (call, average, dst[:8], src[:8])


def _layouts():
    gpus = _gpus() if _STATUS["available"] else 0
    local = min(gpus, 4)
    return {"one-machine": (launch_config(1, local_size=max(local, 2)), max(local, 2)),
            "two-machines": (launch_config(2, 1, local_size=2), 4)}


def _several_gpus_or_skip(need=2):
    _nccl_or_skip()
    if _gpus() < need:
        pytest.skip(f"{_gpus()} GPU(s): the NCCL stages need one GPU per local process (NCCL "
                    f"refuses two ranks on one GPU), at least {need}")


@pytest.mark.parametrize("layout", ["one-machine", "two-machines"])
def test_nccl_stages_sum_every_dtype(layout):
    _several_gpus_or_skip()
    cfg, size = _layouts()[layout]
    rc, out, _ = run_job(cfg, "sums", "--cuda", env=ENV, timeout=400, script=DEVICE_WORKER)
    assert_ok(rc, out, size, min_cases=400)


@pytest.mark.parametrize("layout", ["one-machine", "two-machines"])
def test_nccl_stages_keep_one_call_order(layout):
    _several_gpus_or_skip()
    cfg, size = _layouts()[layout]
    rc, out, _ = run_job(cfg, "orders", "5", "--cuda", env=ENV, timeout=300,
                         script=DEVICE_WORKER)
    assert_ok(rc, out, size, min_cases=60)


def test_nccl_stages_wait_for_a_kernel_still_running():
    _several_gpus_or_skip()
    cfg, size = _layouts()["two-machines"]
    rc, out, _ = run_job(cfg, "producer", "--cuda", env=ENV, timeout=200, script=DEVICE_WORKER)
    assert_ok(rc, out, size, min_cases=3)


@pytest.mark.timeout(240)
def test_nccl_local_process_killed_fails_every_rank():
    _several_gpus_or_skip()
    with LiveJob(launch_config(1, local_size=2), "loop", "--cuda",
                 env=ENV + ["BYTEPS_TIMEOUT=100"], grace=60, script=DEVICE_WORKER) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2, timeout=120)
        kill_and_check(job, job.find("worker", 1), survivors=[0])
