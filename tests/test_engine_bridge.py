"""The core's engine bridge (core/cpp/pipeline/engine_bridge.h) without MXNet: the C entry
points are driven through ctypes exactly as MXNet's engine calls them (EngineAsyncFunc with a
CallbackOnComplete of three words), in a one-worker job in this process. Also: importing
byteps.mxnet without MXNet raises ImportError that says how to install it.
"""

from __future__ import annotations

import ctypes
import os
import queue
import subprocess
import sys

import numpy as np
import pytest

_core = pytest.importorskip("byteps._core", reason="the byteps core is not built")
from byteps import basics  # noqa: E402

ASYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
DELETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class FakeEngine:
    """Stands in for MXNet's engine: builds CallbackOnComplete {callback_, engine_, param_} and
    records (param, error pointer is null) per completion."""

    def __init__(self):
        self.done: queue.Queue = queue.Queue()
        self._callback = CALLBACK(lambda engine, param, error: self.done.put((param, error)))
        push, delete = _core.engine_entry_points()
        self.push, self.delete = ASYNC_FN(push), DELETE_FN(delete)
        self._keep = []

    def run(self, op: int, tag: int) -> None:
        words = (ctypes.c_void_p * 3)(ctypes.cast(self._callback, ctypes.c_void_p).value, 1, tag)
        self._keep.append(words)
        self.push(None, ctypes.addressof(words), op)

    def next(self, timeout=10.0):
        return self.done.get(timeout=timeout)


@pytest.fixture
def one_worker():
    saved = {k: v for k, v in os.environ.items() if k.startswith(("BYTEPS_", "DMLC_"))}
    for k in saved:
        del os.environ[k]
    try:
        basics.init()
        yield basics
    finally:
        basics.shutdown()
        os.environ.update(saved)


def _op(name, arr, average=False):
    ptr = arr.ctypes.data
    return _core.engine_op(name, ptr, ptr, arr.nbytes, str(arr.dtype), list(arr.shape), average)


def test_engine_push_pull_completes_through_the_callback(one_worker):
    eng = FakeEngine()
    arrays = [np.arange(n, dtype=np.float32) * 3 for n in (1, 1000, 2_000_000)]
    ops = [_op(f"eb.{i}", a) for i, a in enumerate(arrays)]
    for tag, op in enumerate(ops, start=100):
        eng.run(op, tag)
    got = sorted(eng.next() for _ in ops)
    assert got == [(100, None), (101, None), (102, None)]  # every one done, no error
    for a in arrays:  # one worker: the sum is the input, in place
        np.testing.assert_array_equal(a, np.arange(a.size, dtype=np.float32) * 3)
    for op in ops:
        eng.delete(op)
    assert eng.done.empty()  # one completion per operation


def test_engine_push_pull_failure_passes_an_error(one_worker):
    eng = FakeEngine()
    a = np.ones(4, np.float32)
    op = _op("eb.shape", a)
    eng.run(op, 1)
    assert eng.next() == (1, None)
    b = np.ones(5, np.float32)  # same name, another shape: refused at enqueue
    bad = _op("eb.shape", b)
    eng.run(bad, 2)
    tag, error = eng.next()
    assert tag == 2 and error is not None  # a (dmlc::Error-compatible) error object
    eng.delete(op)
    eng.delete(bad)


def test_engine_op_after_shutdown_fails_instead_of_hanging(one_worker):
    eng = FakeEngine()
    a = np.ones(4, np.float32)
    op = _op("eb.late", a)
    basics.shutdown()
    eng.run(op, 9)
    tag, error = eng.next(timeout=5)
    assert tag == 9 and error is not None
    eng.delete(op)


def test_engine_op_rejects_an_unsupported_dtype(one_worker):
    with pytest.raises(TypeError, match="unsupported dtype 'bool'"):
        _core.engine_op("eb.bool", 0, 0, 0, "bool", [0], False)


def test_import_without_mxnet_says_how_to_install():
    try:
        import mxnet  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("mxnet is importable in this environment")
    proc = subprocess.run([sys.executable, "-c", "import byteps.mxnet"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode != 0
    assert "ImportError" in proc.stdout and 'pip install "byteps[mxnet]"' in proc.stdout, \
        proc.stdout[-3000:]
