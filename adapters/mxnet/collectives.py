"""Horovod's ``allreduce`` and ``allreduce_`` for MXNet NDArrays (``horovod/mxnet/mpi_ops.py``)
with its reduction ops, over the core's push_pull (docs/collectives.md "Reduction ops"), and
its ``allgather``, ``broadcast``, ``broadcast_``, ``reducescatter`` and ``alltoall`` over
:mod:`byteps.collectives` (synchronous: through host NumPy arrays).

Asynchronous for Python as :func:`byteps.mxnet.byteps_push_pull`: MXNet's engine orders the
operation after earlier writes of the tensor and makes later reads wait for the result; an
error of the operation is raised by MXNet at that read. Every function takes Horovod's
``process_set=`` (a registered ``ProcessSet``; default every rank); an allreduce in a process
set is synchronous, through a host NumPy copy (MXNet's engine path serves the global set
only). :data:`Adasum` is refused with an error naming it. The scale factors are NDArray
multiplications around the push_pull (one pass each when not 1.0).
"""

from __future__ import annotations

from typing import Optional

import mxnet as mx
import numpy as np

from byteps import basics as _b
from byteps import collectives, reduce_ops
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import resolve_priority

from .ops import _reduce_in_place, check_tensor, resolve_name

#: Horovod's reduction ops (byteps.reduce_ops).
Average, Sum, Adasum = reduce_ops.AVERAGE, reduce_ops.SUM, reduce_ops.ADASUM
Min, Max, Product = reduce_ops.MIN, reduce_ops.MAX, reduce_ops.PRODUCT


def _factor(value, what: str, fn: str, dtype: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{fn}: {what} must be a number, got {type(value).__name__}")
    if float(value) != 1.0 and not dtype.startswith("float"):
        raise InvalidTypeError(f"{fn}: {what}={value} needs a floating-point NDArray, got "
                               f"{dtype}")
    return float(value)


def allreduce_(tensor: mx.nd.NDArray, average: Optional[bool] = None,
               name: Optional[str] = None, priority: int = 0, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, op=None, process_set=None) -> mx.nd.NDArray:
    """Reduce ``tensor`` over all ranks in place and return it (Horovod's ``allreduce_``):
    ``postscale_factor * reduce(prescale_factor * tensor)``.

    Args:
        tensor: a dense NDArray (CPU, or a GPU through a pinned host copy) of a dtype of
            ``byteps.mxnet.SUPPORTED_DTYPES``.
        average: deprecated (Horovod): True = Average, False = Sum; give ``op`` instead.
        name: the same name on every rank (``None``: a generated one, the same on every rank
            when all make their unnamed calls in the same order). A name keeps its op.
        priority: 0 = the core's order (declaration order), otherwise larger first.
        prescale_factor, postscale_factor: numbers; not 1.0 only on floating-point tensors.
        op: :data:`Average` (default), :data:`Sum`, :data:`Min`, :data:`Max` (a NaN wins),
            :data:`Product` (integers wrap).
        process_set: a registered ``ProcessSet`` (default: every rank): only its ranks call
            it, Average divides by its size; synchronous (waits for the result).

    Raises:
        InvalidArgumentError (a ValueError): both ``op`` and ``average``, an unknown op,
            :data:`Adasum`, an empty name.
        InvalidTypeError (a TypeError): not an NDArray, an unsupported dtype, a bad factor.
        byteps.errors.BytePSError subclasses: raised by MXNet at the next read of ``tensor``
            when the operation failed (ranks disagreeing on the name's dtype, shape or op, a
            name first reduced with another op, a dead peer, a timeout).
    """
    fn = "allreduce_"
    dtype = check_tensor(tensor, fn)
    core_op, avg = reduce_ops.resolve(op, average, fn)
    pre = _factor(prescale_factor, "prescale_factor", fn, dtype)
    post = _factor(postscale_factor, "postscale_factor", fn, dtype)
    name = resolve_name(name, fn)
    prio = resolve_priority(priority, fn)
    _b.declare(name, process_set=process_set)  # here, in program order: keys must agree
    if pre != 1.0:
        tensor *= pre
    if process_set is not None and process_set.process_set_id:
        a = np.ascontiguousarray(tensor.asnumpy())
        _b.wait(_b.push_pull_async(name, a.ctypes.data, a.ctypes.data, a.nbytes, dtype,
                                   a.shape, avg, prio, op=core_op, process_set=process_set))
        tensor[:] = a
    else:
        _reduce_in_place(tensor, name, prio, dtype, avg, core_op)
    if post != 1.0:
        tensor *= post
    return tensor


def allreduce(tensor: mx.nd.NDArray, average: Optional[bool] = None,
              name: Optional[str] = None, priority: int = 0, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None, process_set=None) -> mx.nd.NDArray:
    """Horovod's ``allreduce``: as :func:`allreduce_` on a copy of ``tensor``, which is left
    unchanged; returns the copy. Errors: as :func:`allreduce_`."""
    check_tensor(tensor, "allreduce")
    return allreduce_(tensor.copy(), average, name, priority, prescale_factor,
                      postscale_factor, op, process_set)


def _array_of(tensor: mx.nd.NDArray, fn: str):
    if not isinstance(tensor, mx.nd.NDArray):
        raise InvalidTypeError(f"{fn}: expected an mxnet NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise InvalidTypeError(f"{fn}: sparse NDArrays ({tensor.stype}) are not supported")
    return tensor.asnumpy()  # waits for the engine's pending writes of the tensor


def allgather(tensor: mx.nd.NDArray, name: Optional[str] = None,
              process_set=None) -> mx.nd.NDArray:
    """Horovod's ``allgather`` (docs/collectives.md): every rank's ``tensor`` concatenated
    along the first dimension, in rank order, as a new NDArray on ``tensor``'s context.
    Synchronous (it waits for the tensor's pending writes, then for the operation).

    Args:
        tensor: a dense NDArray, at least 1-d, any dtype; the ranks' NDArrays may differ in the
            first dimension only.
        name: the same on every rank (``None``: a generated one, the same on every rank when
            all make their unnamed calls in the same order).
        process_set: a registered ``ProcessSet`` (default: every rank; as every function
            below): its ranks, in their order.

    Raises:
        InvalidArgumentError (a ValueError): a 0-d NDArray; ranks whose NDArrays differ beyond
            the first dimension (on every rank).
        InvalidTypeError (a TypeError): not a dense NDArray.
    """
    array = _array_of(tensor, "allgather")
    out = collectives.allgather_start(array, resolve_name(name, "allgather"),
                                      process_set=process_set).wait()
    return mx.nd.array(out, ctx=tensor.context, dtype=out.dtype)


def broadcast(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None,
              process_set=None) -> mx.nd.NDArray:
    """Horovod's ``broadcast``: ``root_rank``'s ``tensor`` on every rank, as a new NDArray
    (synchronous; the worker mesh's chain from the root's machine, docs/collectives.md).

    Raises:
        InvalidArgumentError (a ValueError): a root outside the job. Ranks naming different
            roots fail with ``MismatchError`` on every rank.
        InvalidTypeError (a TypeError): not a dense NDArray, a root that is not an int.
    """
    array = _array_of(tensor, "broadcast")
    out = collectives.broadcast_start(array, root_rank, resolve_name(name, "broadcast"),
                                      process_set=process_set).wait()
    return mx.nd.array(out, ctx=tensor.context, dtype=out.dtype)


def broadcast_(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None,
               process_set=None) -> mx.nd.NDArray:
    """In-place :func:`broadcast` (Horovod's ``broadcast_``): returns ``tensor``."""
    tensor[:] = broadcast(tensor, root_rank, name, process_set)
    return tensor


def reducescatter(tensor: mx.nd.NDArray, name: Optional[str] = None, op=None,
                  process_set=None) -> mx.nd.NDArray:
    """Horovod's ``reducescatter``: ``tensor`` summed (``op=Sum``) or averaged (``Average``,
    the default) over the ranks; this rank's shard of the first dimension (``rows // size``
    rows, the first ``rows % size`` ranks one more), as a new NDArray. Synchronous.

    Raises:
        InvalidArgumentError (a ValueError): an op other than Sum or Average, a 0-d NDArray.
        InvalidTypeError (a TypeError): not a dense NDArray of a supported dtype.
    """
    fn = "reducescatter"
    check_tensor(tensor, fn)
    core_op, avg = reduce_ops.resolve(op if op is not None else Average, None, fn)
    if core_op != "sum":
        raise InvalidArgumentError(f"{fn}: op must be Sum or Average (Horovod's "
                                   f"reducescatter), got {op}")
    out = collectives.reducescatter_start(_array_of(tensor, fn), resolve_name(name, fn),
                                          average=avg, process_set=process_set).wait()
    return mx.nd.array(out, ctx=tensor.context, dtype=out.dtype)


def alltoall(tensor: mx.nd.NDArray, splits=None, name: Optional[str] = None,
             process_set=None) -> mx.nd.NDArray:
    """Horovod's ``alltoall``: ``splits[j]`` rows of ``tensor`` go to rank j; returns the rows
    every rank sent this one, concatenated in rank order, as a new NDArray. Synchronous.

    Args:
        tensor: a dense NDArray, at least 1-d, any dtype.
        splits: ``size()`` non-negative ints (a list or an NDArray) adding up to the rows;
            ``None``: the rows split evenly (they must divide by ``size()``).

    Raises:
        InvalidArgumentError (a ValueError): splits of the wrong length or sum, rows that do not
            divide evenly, a 0-d NDArray, ranks whose NDArrays differ beyond the first dimension.
        InvalidTypeError (a TypeError): not a dense NDArray.
    """
    if isinstance(splits, mx.nd.NDArray):
        splits = splits.asnumpy().tolist()
    out, _ = collectives.alltoall_start(_array_of(tensor, "alltoall"), splits,
                                        resolve_name(name, "alltoall"),
                                        process_set=process_set).wait()
    return mx.nd.array(out, ctx=tensor.context, dtype=out.dtype)


def _grouped_names(tensors, name: Optional[str], fn: str) -> list:
    if not isinstance(tensors, (list, tuple)):
        raise InvalidTypeError(f"{fn}: expected a list or tuple of NDArrays, got "
                               f"{type(tensors).__name__}")
    base = resolve_name(name, fn)
    return [f"{base}.{i}" for i in range(len(tensors))]


def grouped_allreduce_(tensors, average: Optional[bool] = None, name: Optional[str] = None,
                       priority: int = 0, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, op=None, process_set=None) -> list:
    """Horovod's ``grouped_allreduce_``: :func:`allreduce_` of each NDArray (named
    ``<name>.<i>``), all started before any is read; returns the list. Errors: as
    :func:`allreduce_`; InvalidTypeError: not a list or tuple."""
    names = _grouped_names(tensors, name, "grouped_allreduce_")
    return [allreduce_(t, average, n, priority, prescale_factor, postscale_factor, op,
                       process_set) for t, n in zip(tensors, names)]


def grouped_allreduce(tensors, average: Optional[bool] = None, name: Optional[str] = None,
                      priority: int = 0, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, op=None, process_set=None) -> list:
    """Horovod's ``grouped_allreduce``: :func:`grouped_allreduce_` on copies; the inputs are
    left unchanged."""
    for t in tensors if isinstance(tensors, (list, tuple)) else ():
        check_tensor(t, "grouped_allreduce")
    copies = [t.copy() for t in tensors] if isinstance(tensors, (list, tuple)) else tensors
    return grouped_allreduce_(copies, average, name, priority, prescale_factor,
                              postscale_factor, op, process_set)


def grouped_allgather(tensors, name: Optional[str] = None, process_set=None) -> list:
    """Horovod's ``grouped_allgather``: :func:`allgather` of each NDArray (``<name>.<i>``)."""
    names = _grouped_names(tensors, name, "grouped_allgather")
    return [allgather(t, n, process_set) for t, n in zip(tensors, names)]


def grouped_reducescatter(tensors, name: Optional[str] = None, op=None,
                          process_set=None) -> list:
    """Horovod's ``grouped_reducescatter``: :func:`reducescatter` of each NDArray
    (``<name>.<i>``, Sum or Average)."""
    names = _grouped_names(tensors, name, "grouped_reducescatter")
    return [reducescatter(t, n, op, process_set) for t, n in zip(tensors, names)]


def join() -> int:
    """Horovod's ``join``: this rank has run out of data; blocks until every rank has joined,
    while the others' allreduce, allgather, broadcast and reducescatter complete without it
    (zeros to a sum, no rows to a gather). Returns the rank that joined last. Errors:
    ``byteps.collectives.join``."""
    return collectives.join()
