"""PyTorch tensor operations over the byteps core (upstream ``byteps/torch/ops.py``).

Every function here turns a torch CPU tensor into what :mod:`byteps.basics` takes (a raw
pointer to a C-contiguous buffer, a byte count, a dtype name, a shape) and keeps everything
the core writes into or reads from alive until the handle is synchronised.

Handle bookkeeping: ``handle -> _Op`` holds the tensor returned by :func:`synchronize`, every
buffer the core may touch (including contiguous copies of non-contiguous inputs) and, for
in-place operations on non-contiguous tensors, the original tensor the result is copied back
into. Records are removed when :func:`synchronize` returns or raises a byteps error.

Differences from upstream (fixes):

* ``name=None`` gets a process-unique name (upstream sent every unnamed tensor to the same
  ``"byteps.noname.0"`` context, which broke as soon as two unnamed tensors differed in size).
* non-contiguous tensors are accepted (a contiguous copy is reduced; in-place operations copy
  the result back) instead of raising ``ValueError``;
* int8 and bfloat16 are supported; unsupported dtypes raise ``InvalidTypeError`` (a
  ``TypeError``) naming the supported ones.
* CUDA tensors go through the core's device stages (docs/gpu.md): an event recorded on the
  tensor's current stream after its producer's work is what the core's first copy waits for,
  and :func:`synchronize` returns once the result is in device memory (no device-wide
  synchronize). Without CUDA support in this process (``byteps.cuda_status()``) a CUDA tensor
  raises ``InvalidTypeError`` with the reason.
* averaging is done by the core (floor division for integer dtypes, as upstream on
  torch >= 1.5), not in a Python callback.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from byteps import basics as _b
from byteps.basics import (  # re-exported as-is
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import name_for, resolve_priority

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "declare",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_inplace",
    "byteps_push_pull",
    "poll",
    "synchronize",
    "SUPPORTED_DTYPES",
]

#: torch dtypes the core can sum, with the core's name for each.
_DTYPE_NAMES: Dict[torch.dtype, str] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}

#: Supported torch dtypes, in the order error messages list them.
SUPPORTED_DTYPES: Tuple[torch.dtype, ...] = tuple(_DTYPE_NAMES)

_SUPPORTED_TEXT = ", ".join(str(d) for d in SUPPORTED_DTYPES)


# --------------------------------------------------------------------------------------------
# basics (re-exported by byteps.torch)
# --------------------------------------------------------------------------------------------
def init(lazy: bool = True, process_sets=None) -> None:
    """Start byteps in this process. Idempotent: a second call does nothing.

    Args:
        lazy: accepted for upstream compatibility. The core always connects at ``init`` so that
            configuration and network errors surface here.
        process_sets: Horovod's: a list of ``ProcessSet`` to register now, in order (every
            rank passes the same); ``"dynamic"`` or None: none (``add_process_set`` any time).

    Raises:
        byteps.errors.ConfigError: a ``BYTEPS_*`` / ``DMLC_*`` variable is missing or bad.
        byteps.errors.BytePSTimeoutError: the scheduler did not answer in time.
        byteps.errors.PeerLostError: a peer failed during rendezvous.
    """
    _b.init(lazy=lazy, process_sets=process_sets)


def declare(name: str, process_set=None) -> int:
    """Declare a tensor name ahead of use and return its key.

    Keys follow declaration order, which must be the same on every worker; declaring names
    up front (as :class:`~byteps.torch.DistributedOptimizer` does for its gradients) keeps
    keys in agreement even when the first push_pulls start in a different order on different
    ranks. Declaring an existing name returns the same key. Upstream declared
    ``"byteps." + name``; names are used unchanged here. ``process_set``: among a
    ``ProcessSet``'s ranks (keys count per set).

    Raises:
        InvalidTypeError (a TypeError): ``name`` is not a string.
        byteps.errors.NotInitializedError: before :func:`init`.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(f"declare(name): name must be a str, got {type(name).__name__}")
    return _b.declare(name, process_set=process_set)


# --------------------------------------------------------------------------------------------
# handle bookkeeping
# --------------------------------------------------------------------------------------------
class _Op:
    """What one in-flight operation needs: the result to hand back, buffers to keep alive,
    an optional (destination, source) pair to copy back when it completes, the factor the
    result is multiplied by then (Horovod's ``postscale_factor``; 1.0: none), and, for the
    collectives of ``byteps.collectives``, ``finish``: makes the result once the core is done
    (an in-place operation's result is then copied into ``output``)."""

    __slots__ = ("name", "output", "keep", "writeback", "inplace", "postscale", "finish")

    def __init__(self, name: str, output: Optional[torch.Tensor], keep: Tuple[Any, ...],
                 writeback: Optional[Tuple[torch.Tensor, torch.Tensor]], inplace: bool,
                 postscale: float = 1.0, finish=None):
        self.name = name
        self.output = output
        self.keep = keep
        self.writeback = writeback
        self.inplace = inplace
        self.postscale = postscale
        self.finish = finish


_ops_lock = threading.Lock()
_ops: Dict[int, _Op] = {}
# A group handle (negative, never a core handle) -> the handles of its operations, in order:
# Horovod's grouped operations, completed together by one synchronize.
_groups: Dict[int, List[int]] = {}
_group_ids = itertools.count(-1, -1)


def _group(handles: List[int]) -> int:
    """One handle for ``handles`` (each from :func:`_start`): :func:`poll` is True when all
    finished, :func:`synchronize` waits for all and returns their results as a list."""
    gid = next(_group_ids)
    with _ops_lock:
        _groups[gid] = list(handles)
    return gid


def _dtype_name(tensor: torch.Tensor) -> str:
    try:
        return _DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise InvalidTypeError(
            f"byteps.torch: unsupported tensor dtype {tensor.dtype}; supported dtypes: "
            f"{_SUPPORTED_TEXT}"
        ) from None


def _check_tensor(tensor: Any, fn: str) -> str:
    """Validate ``tensor`` for the core; returns the core's dtype name."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidTypeError(f"{fn}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type == "cuda":
        from byteps.cuda import cuda_status

        status = cuda_status()
        if not status["available"]:
            raise InvalidTypeError(f"{fn}: tensor is on {tensor.device}, but CUDA support is off "
                                   f"in byteps: {status['reason']}")
    elif tensor.device.type != "cpu":
        raise InvalidTypeError(
            f"{fn}: tensor is on device {tensor.device}; byteps.torch reduces CPU and CUDA "
            "tensors: pass tensor.cpu()"
        )
    if tensor.layout != torch.strided:
        raise InvalidTypeError(
            f"{fn}: only dense (strided) tensors are supported, got {tensor.layout}")
    return _dtype_name(tensor)


def _resolve_name(name: Optional[str]) -> str:
    if name is None:
        return _b.unique_name("torch.noname")
    if not isinstance(name, str):
        raise InvalidTypeError(f"name must be a str or None, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError(
            "name must not be empty (pass None for an automatic unique name)")
    return name


def _start(tensor: torch.Tensor, average: bool, name: Optional[str], version: int,
           priority: Optional[int], inplace: bool, fn: str, op: str = "sum",
           postscale: float = 1.0, process_set=None) -> int:
    """Start one push_pull of ``tensor`` (``op``: :data:`byteps.basics.REDUCE_OPS`) among
    ``process_set``'s ranks (None: all); the result is multiplied by ``postscale`` when
    :func:`synchronize` takes it (1.0: not)."""
    dtype = _check_tensor(tensor, fn)
    name = _resolve_name(name)
    # 0 (the upstream default) and None both mean: let the core order by declaration
    # (earlier-declared first, docs/architecture.md §5). Other values are explicit (larger first).
    prio = resolve_priority(priority, fn)
    src = tensor.detach()
    shape = tuple(src.shape)
    writeback = None
    if inplace:
        overlap = getattr(torch, "_debug_has_internal_overlap", None)
        if overlap is not None and src.numel() > 1 and overlap(src) == 1:
            raise InvalidArgumentError(f"{fn}: the tensor has elements sharing memory (e.g. from "
                                       "expand()); an in-place result cannot be written into it")
        if src.is_contiguous():
            buf = src
        else:
            buf = src.contiguous()  # a copy; copied back into `tensor` by synchronize()
            writeback = (src, buf)
        inp = out = buf
        result = tensor
        keep: Tuple[Any, ...] = (tensor, buf)
    else:
        inp = src.contiguous()  # no copy if already contiguous
        out = torch.empty(shape, dtype=src.dtype, device=src.device)
        result = out
        keep = (tensor, inp, out)
    nbytes = inp.numel() * inp.element_size()
    if src.device.type == "cuda":
        handle, event = _start_cuda(name, inp, out, nbytes, dtype, shape, average, prio, version,
                                    op, process_set)
        keep = keep + (event,)
    else:
        handle = _b.push_pull_async(name, inp.data_ptr(), out.data_ptr(), nbytes, dtype, shape,
                                    bool(average), priority=prio, version=version, op=op,
                                    process_set=process_set)
    # Nobody else knows the handle before we return it, so registering afterwards is race-free.
    with _ops_lock:
        _ops[handle] = _Op(name, result, keep, writeback, inplace, postscale)
    return handle


def _start_cuda(name: str, inp: torch.Tensor, out: torch.Tensor, nbytes: int, dtype: str,
                shape, average: bool, prio: Optional[int], version: int, op: str = "sum",
                process_set=None):
    """Start a CUDA tensor's push_pull on the core's device stages: the core's first copy
    waits for an event recorded now on the tensor's current stream (after its producer's
    kernels and the contiguous copy, if any). Returns (handle, the event: kept alive until
    synchronize)."""
    stream = torch.cuda.current_stream(inp.device)
    event = torch.cuda.Event()
    event.record(stream)
    handle = _b.push_pull_async(name, inp.data_ptr(), out.data_ptr(), nbytes, dtype, list(shape),
                                bool(average), prio, version, device="cuda",
                                device_id=inp.device.index, ready_event=event.cuda_event, op=op,
                                process_set=process_set)
    return handle, event


# --------------------------------------------------------------------------------------------
# public operations
# --------------------------------------------------------------------------------------------
def push_pull_async(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
                    version: int = 0, priority: int = 0) -> int:
    """Start summing (or averaging) ``tensor`` across all workers into a new tensor.

    The input is not modified; its contents are read by the core while the operation runs,
    so do not write to it before :func:`synchronize`. The output is a new C-contiguous tensor
    with the input's shape and dtype, returned by :func:`synchronize`.

    Args:
        tensor: a CPU or CUDA tensor of any shape (including 0-d and empty) with a dtype in
            :data:`SUPPORTED_DTYPES` (float16, bfloat16, float32, float64, int8, uint8, int32,
            int64). Non-contiguous tensors are copied to a contiguous buffer first.
        average: divide the sum by :func:`size` (floor division for integer dtypes, as upstream
            on torch >= 1.5). Default True.
        name: the tensor's name, the same on every rank; at most one operation per name may be
            in flight. ``None`` generates a unique name (the same on every rank as long as all
            ranks make their unnamed calls in the same order). Each new name takes a key in the
            core: name tensors that are reduced repeatedly.
        version: accepted for upstream compatibility (upstream never read it; rounds are
            versioned inside the core).
        priority: 0 (default) lets the core schedule by declaration order (earlier-declared
            first); any other value is an explicit priority, larger runs first.

    Returns:
        an integer handle for :func:`poll` and :func:`synchronize`.

    Raises:
        InvalidTypeError (a TypeError): not a tensor, a sparse tensor or one on another device
            than CPU or CUDA, a CUDA tensor while CUDA support is off (the message says why),
            or an unsupported dtype (e.g. bool, int16, complex); the message lists the
            supported dtypes.
        InvalidArgumentError (a ValueError): an operation with the same name is already in flight,
            an empty name, or (in-place variants) a tensor whose elements share memory
            (``expand()``).
        byteps.errors.NotInitializedError: before :func:`init`.
    """
    return _start(tensor, average, name, version, priority, False, "push_pull_async")


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True,
                            name: Optional[str] = None, version: int = 0,
                            priority: int = 0, process_set=None) -> int:
    """Like :func:`push_pull_async`, but the result is written into ``tensor`` itself.

    ``tensor`` must not be read or written until :func:`synchronize` returns. A non-contiguous
    ``tensor`` is reduced through a contiguous copy which :func:`synchronize` copies back.
    ``process_set``: among a registered ``ProcessSet``'s ranks (None: every rank).
    Also exported as ``byteps.torch.byteps_push_pull`` (upstream's name).

    Returns:
        an integer handle; :func:`synchronize` returns ``tensor``.

    Raises:
        the same errors as :func:`push_pull_async`.
    """
    return _start(tensor, average, name, version, priority, True, "push_pull_async_inplace",
                  process_set=process_set)


#: Upstream's package-level name for :func:`push_pull_async_inplace`.
byteps_push_pull = push_pull_async_inplace


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
                      version: int = 0, priority: int = 0) -> torch.Tensor:
    """Synchronous in-place push_pull: :func:`push_pull_async_inplace` then
    :func:`synchronize`. Returns ``tensor`` (now holding the sum or average).

    Raises:
        the errors of :func:`push_pull_async` and :func:`synchronize`.
    """
    return synchronize(push_pull_async_inplace(tensor, average, name, version, priority))


def poll(handle: int) -> bool:
    """True if the operation behind ``handle`` has finished (successfully or not); never
    blocks. :func:`synchronize` must still be called to get the result and release it.

    Raises:
        InvalidArgumentError (a ValueError): unknown handle (never issued, or already synchronised).
    """
    with _ops_lock:
        members = _groups.get(handle)
        if members is None and handle not in _ops:
            raise InvalidArgumentError(f"poll: unknown or already synchronized handle {handle!r}")
    if members is not None:
        return all(_b.poll(h) for h in members)
    return _b.poll(handle)


def synchronize(handle: int):
    """Wait for the operation behind ``handle`` and return its output tensor; for the handle of
    a grouped operation (``grouped_allreduce_async``) wait for all of its tensors and return
    them as a list (the first error is raised after every member has finished).

    For out-of-place operations that is the new tensor; for in-place ones the input tensor
    (for a non-contiguous input the result is first copied back into it). The handle is
    released: synchronising it again raises ``InvalidArgumentError`` (a
    ``ValueError``; upstream returned None).
    The wait blocks with the GIL released; the core times out stalled operations.

    Raises:
        InvalidArgumentError (a ValueError): unknown or already synchronised handle.
        byteps.errors.MismatchError: ranks disagree on this name's dtype or shape.
        byteps.errors.PeerLostError, byteps.errors.BytePSTimeoutError, ...: the operation's
            error, raised on every rank taking part.
    """
    with _ops_lock:
        members = _groups.pop(handle, None)
    if members is not None:
        results, first_error = [], None
        for h in members:  # every member is waited for, so no buffer outlives its operation
            try:
                results.append(_synchronize_one(h))
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results
    return _synchronize_one(handle)


def _synchronize_one(handle: int) -> torch.Tensor:
    with _ops_lock:
        op = _ops.get(handle)
    if op is None:
        raise InvalidArgumentError(
            f"synchronize: unknown or already synchronized handle {handle!r}")
    try:
        _b.wait(handle)
    except Exception:
        # The core has released the handle and no longer touches the buffers.
        with _ops_lock:
            _ops.pop(handle, None)
        raise
    # (On KeyboardInterrupt the record stays, so the buffers outlive the core's use of them.)
    with _ops_lock:
        _ops.pop(handle, None)
    if op.finish is not None:
        result = op.finish()
        if op.postscale != 1.0:
            result = result * op.postscale
        if not op.inplace:
            return result
        with torch.no_grad():
            op.output.copy_(result)
        return op.output
    if op.postscale != 1.0:
        with torch.no_grad():
            (op.writeback[1] if op.writeback is not None else op.output).mul_(op.postscale)
    if op.writeback is not None:
        dst, src = op.writeback
        with torch.no_grad():
            dst.copy_(src)
    elif op.inplace:
        # In place through raw memory: tell autograd the tensor changed, so a stale saved
        # value is reported instead of silently used.
        _bump_version(op.output)
    return op.output


def _bump_version(tensor: torch.Tensor) -> None:
    inc = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
    if inc is not None:
        try:
            inc(tensor)
        except Exception:  # pragma: no cover - inference tensors etc.
            pass


def _name_for(base: str, dtype: torch.dtype, shape, compression=None) -> str:
    """A tensor name derived from ``base`` that has only ever been used (through
    :func:`byteps.naming.name_for`, shared by every adapter) with this dtype and shape:
    ``base`` itself, or ``base~1``, ``base~2``... The core fixes a name's dtype and shape at
    first use, so e.g. the state dicts of two different models (both with a ``"0.weight"``)
    could otherwise not be broadcast one after the other (upstream crashed). Deterministic:
    every rank making the same calls gets the same names. ``compression``: the core compressor
    kwargs the name is declared with (a name is never reused with another compressor)."""
    return name_for(base, _DTYPE_NAMES.get(dtype, str(dtype)), shape, compression)


def _start_group(tensors, name: Optional[str], fn: str, start_one) -> int:
    """Start ``start_one(tensor, "<name>.<i>")`` (which returns a handle) for each of
    ``tensors`` (a list or tuple) under one group handle (Horovod's grouped operations). If one
    fails to start, the ones already started are waited for (so no buffer is freed under the
    core) and the error is raised.

    Raises:
        InvalidTypeError: ``tensors`` is a tensor or not a list or tuple; what ``start_one``
            raises."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise InvalidTypeError(f"{fn}: expected a list or tuple of tensors, got "
                               f"{type(tensors).__name__}")
    base = _resolve_name(name)
    handles: List[int] = []
    try:
        for i, t in enumerate(tensors):
            handles.append(start_one(t, f"{base}.{i}"))
    except BaseException:
        if handles:
            try:
                synchronize(_group(handles))
            except Exception:
                pass
        raise
    return _group(handles)


def _register(handle: int, op: _Op) -> int:
    """Track ``op`` under the core's ``handle`` (for :func:`poll` and :func:`synchronize`)."""
    with _ops_lock:
        _ops[handle] = op
    return handle


def _in_flight() -> int:
    """Number of operations started and not yet synchronised (for tests)."""
    with _ops_lock:
        return len(_ops)
