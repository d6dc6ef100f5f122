"""Fixtures for the byteps.torch tests (job launches: tests/jobs.py).

* the ``fake_bps`` fixture imports a fresh ``byteps.torch`` over a FAKE ``byteps.basics``
  (single process, size 1 unless ``state["size"]`` is changed, push_pull = copy; declarations
  with compressor kwargs and learning rates handed to the core are recorded) for unit tests of the adapter's own logic that
  need no core; the real modules are restored afterwards.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import types

import pytest


# ------------------------------------------------------------------------------------------
# fake core, for unit tests only
# ------------------------------------------------------------------------------------------
def _make_fake_basics(size=1):
    from byteps.errors import InvalidArgumentError, InvalidTypeError, NotInitializedError

    m = types.ModuleType("byteps.basics")
    m.SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8",
                          "int32", "int64")
    m.state = {"init": False, "keys": {}, "inflight": {}, "calls": [], "polls_false": 0,
               "size": size, "compression": {}, "lr": []}
    counter = itertools.count()
    handles = itertools.count(1)

    def _req():
        if not m.state["init"]:
            raise NotInitializedError("fake: not initialised")

    def _one_rank_set(process_set):
        # one rank: only the global set (None, or id 0) exists
        if process_set is not None and getattr(process_set, "process_set_id", None) != 0:
            raise InvalidArgumentError("fake: a job of one rank has no other process set")

    m.init = lambda lazy=True, process_sets=None: (
        [_one_rank_set(ps) for ps in (process_sets if isinstance(process_sets, list) else [])],
        m.state.update(init=True))[-1]
    m.shutdown = lambda: m.state.update(init=False)
    m.suspend = m.shutdown
    m.barrier = lambda process_set=None: (_one_rank_set(process_set), _req())[-1]
    m.resume = lambda num_workers, num_servers, global_rank, context=None: m.state.update(
        init=True)
    m.is_initialized = lambda: m.state["init"]

    def _size():
        _req()
        return m.state["size"]

    def _zero():
        _req()
        return 0

    m.size = _size
    m.local_size = _size
    m.rank = _zero
    m.local_rank = _zero
    m.cross_rank = _zero  # one machine
    m.cross_size = lambda: (_req(), 1)[1]
    m.is_homogeneous = lambda: (_req(), True)[1]

    def declare(name, compression=None, process_set=None):
        _req()
        _one_rank_set(process_set)
        if compression is not None:
            m.state["compression"][name] = dict(compression)
        return m.state["keys"].setdefault(name, len(m.state["keys"]))

    m.declare = declare
    m.set_learning_rate = lambda lr: m.state["lr"].append((lr, len(m.state["calls"])))
    m.unique_name = lambda prefix="noname": f"{prefix}.{next(counter)}"

    def push_pull_async(name, input_ptr, output_ptr, nbytes, dtype, shape, average,
                        priority=None, version=0, op="sum", process_set=None):
        # one rank: every op's result is the input itself (a copy)
        if dtype not in m.SUPPORTED_DTYPES:
            raise InvalidTypeError(f"unsupported dtype {dtype!r}")
        _req()
        _one_rank_set(process_set)
        if name in m.state["inflight"].values():
            raise InvalidArgumentError(f"duplicate in-flight name {name!r}")
        declare(name)
        if nbytes and input_ptr != output_ptr:
            ctypes.memmove(output_ptr, input_ptr, nbytes)
        h = next(handles)
        m.state["inflight"][h] = name
        m.state["calls"].append(dict(name=name, nbytes=nbytes, dtype=dtype, shape=list(shape),
                                     average=average, priority=priority, op=op,
                                     inplace=input_ptr == output_ptr))
        return h

    m.push_pull_async = push_pull_async

    def poll(h):
        if m.state["polls_false"] > 0:
            m.state["polls_false"] -= 1
            return False
        return True

    m.poll = poll

    def wait(h, timeout=None):
        if h not in m.state["inflight"]:
            raise InvalidArgumentError(f"unknown handle {h}")
        del m.state["inflight"][h]

    m.wait = wait
    return m


@pytest.fixture
def fake_bps(monkeypatch):
    """A freshly imported ``byteps.torch`` bound to a fake single-process core."""
    pytest.importorskip("torch")
    byteps = pytest.importorskip("byteps")
    saved = {k: v for k, v in sys.modules.items()
             if k == "byteps.basics" or k == "byteps.torch" or k.startswith("byteps.torch.")}
    for k in saved:
        del sys.modules[k]
    fake = _make_fake_basics()
    sys.modules["byteps.basics"] = fake
    monkeypatch.setattr(byteps, "basics", fake, raising=False)
    monkeypatch.setattr(byteps, "torch", None, raising=False)
    try:
        import byteps.torch as bps
        bps._fake = fake
        yield bps
    finally:
        for k in [k for k in sys.modules
                  if k == "byteps.basics" or k == "byteps.torch" or k.startswith("byteps.torch.")]:
            del sys.modules[k]
        sys.modules.update(saved)
