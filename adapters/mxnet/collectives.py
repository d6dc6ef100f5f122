"""Horovod's ``allreduce`` and ``allreduce_`` for MXNet NDArrays (``horovod/mxnet/mpi_ops.py``)
with its reduction ops, over the core's push_pull (docs/collectives.md "Reduction ops").

Asynchronous for Python as :func:`byteps.mxnet.byteps_push_pull`: MXNet's engine orders the
operation after earlier writes of the tensor and makes later reads wait for the result; an
error of the operation is raised by MXNet at that read. Not here yet: ``process_set=`` (only the
global set exists; the argument is not accepted) and :data:`Adasum`, refused with an error
naming it. The scale factors are NDArray multiplications around the push_pull (one pass each
when not 1.0).
"""

from __future__ import annotations

from typing import Optional

import mxnet as mx

from byteps import basics as _b
from byteps import reduce_ops
from byteps.errors import InvalidTypeError
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
               postscale_factor: float = 1.0, op=None) -> mx.nd.NDArray:
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
    _b.declare(name)  # here, in program order: keys must agree across ranks
    if pre != 1.0:
        tensor *= pre
    _reduce_in_place(tensor, name, prio, dtype, avg, core_op)
    if post != 1.0:
        tensor *= post
    return tensor


def allreduce(tensor: mx.nd.NDArray, average: Optional[bool] = None,
              name: Optional[str] = None, priority: int = 0, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None) -> mx.nd.NDArray:
    """Horovod's ``allreduce``: as :func:`allreduce_` on a copy of ``tensor``, which is left
    unchanged; returns the copy. Errors: as :func:`allreduce_`."""
    check_tensor(tensor, "allreduce")
    return allreduce_(tensor.copy(), average, name, priority, prescale_factor,
                      postscale_factor, op)
