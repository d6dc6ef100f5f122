"""The DLPack front (``byteps.push_pull`` of any array with ``__dlpack__``; docs/gpu.md):
NumPy here and in a 2-worker job, torch CPU tensors in the torch session. CUDA arrays: in
tests/test_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from error_checks import single_process_job
from jobs import TESTS, assert_ok, launch_config, run_job
from testing_hooks import skip_without_core_testing

import byteps
from byteps import basics
from byteps.errors import InvalidArgumentError, InvalidTypeError, NotInitializedError

WORKER = str(TESTS / "workers" / "device_worker.py")


@pytest.fixture(scope="module")
def job():
    with single_process_job(basics.shutdown):
        basics.init()
        yield


NUMPY_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5, 7)])
def test_numpy_in_place(job, dtype, shape):
    x = (np.arange(int(np.prod(shape)), dtype=np.int64) % 7).astype(dtype).reshape(shape)
    want = x.copy()
    assert byteps.push_pull(x, average=False, name=f"np.{dtype}.{shape}") is x
    assert np.array_equal(x, want)  # one worker: the sum is the input
    h = byteps.push_pull_async(x, average=True, name=f"np.{dtype}.{shape}")
    assert byteps.synchronize(h) is x and np.array_equal(x, want)


def test_numpy_out_and_read_only(job):
    ro = np.arange(10, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        byteps.push_pull(ro, name="ro")
    out = np.zeros(10, np.float32)
    assert byteps.push_pull(ro, name="ro", out=out) is out
    assert np.array_equal(out, ro)
    with pytest.raises(InvalidArgumentError, match="out must have"):
        byteps.push_pull(np.zeros(4, np.float32), name="ro2", out=np.zeros(5, np.float32))
    with pytest.raises(InvalidArgumentError, match="out must have"):
        byteps.push_pull(np.zeros(4, np.float32), name="ro3", out=np.zeros(4, np.float64))


def test_errors_are_typed(job):
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        byteps.push_pull(np.zeros((3, 4)).T, name="nc")
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        byteps.push_pull(np.zeros(10)[::2], name="nc2")
    assert byteps.push_pull(np.zeros((3, 1))[:, :1], name="c") is not None  # size-1 dims: fine
    with pytest.raises(InvalidTypeError, match="unsupported DLPack dtype"):
        byteps.push_pull(np.zeros(3, bool), name="b")
    with pytest.raises(InvalidTypeError, match="unsupported DLPack dtype"):
        byteps.push_pull(np.zeros(3, np.complex64), name="c64")
    with pytest.raises(InvalidTypeError, match="not a DLPack array"):
        byteps.push_pull([1.0, 2.0], name="l")
    with pytest.raises(InvalidArgumentError, match="first used as"):
        byteps.push_pull(np.zeros(3, np.float32), name="np.float32.(1,)")


def test_not_initialized(job):
    basics.shutdown()
    try:
        with pytest.raises(NotInitializedError):
            byteps.push_pull(np.zeros(3, np.float32), name="x")
    finally:
        basics.init()


@skip_without_core_testing()  # the worker sets the fake device's delays
def test_numpy_sums_in_a_two_worker_job():
    rc, out, _ = run_job(launch_config(2, 1), "dlpack", env=["BYTEPS_PARTITION_BYTES=65536"],
                         timeout=200, script=WORKER)
    assert_ok(rc, out, 2, min_cases=100)


@pytest.mark.torch
def test_torch_cpu_tensors(job):
    torch = pytest.importorskip("torch")
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                  torch.uint8, torch.int32, torch.int64):
        t = (torch.arange(100) % 9).to(dtype)
        want = t.clone()
        assert byteps.push_pull(t, average=False, name=f"t.{dtype}") is t
        assert torch.equal(t, want)
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        byteps.push_pull(torch.zeros(4, 5).t(), name="t.nc")
    with pytest.raises(InvalidTypeError, match="unsupported DLPack dtype"):
        byteps.push_pull(torch.zeros(3, dtype=torch.int16), name="t.i16")
