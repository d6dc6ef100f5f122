"""Horovod's allreduce family for PyTorch (``hvd.allreduce``, ``allreduce_async``,
``allreduce_``, ``allreduce_async_``) and its reduction ops, over the core's push_pull.

The grouped forms (``grouped_allreduce``, ``grouped_allreduce_async``, ``grouped_allreduce_``,
``grouped_allreduce_async_``) start one push_pull per tensor, all before any is waited for, under
one handle that :func:`synchronize` completes together (returning the list).

Semantics are Horovod's (``horovod/torch/mpi_ops.py``, docs "API"): ``op`` is one of
:data:`Average` (default), :data:`Sum`, :data:`Min`, :data:`Max`, :data:`Product`; the old
``average=`` flag maps to Average / Sum and giving both is a ``ValueError``; the result is
``postscale_factor * reduce(prescale_factor * tensor)``; the synchronous forms are
differentiable (the gradient is allreduced with the same op and factors, as Horovod's
``HorovodAllreduce``). Min, max and product are combined by the core's kernels on the servers,
in the local reduce and in the all-reduce schemes (docs/collectives.md "Reduction ops").

Not here yet: ``process_set=`` (only the global set exists; the argument is not accepted) and
:data:`Adasum`, which is refused with an error naming it. The scale factors are applied by
torch around the push_pull (one extra pass over the tensor each, when not 1.0).
"""

from __future__ import annotations

import enum
from typing import Optional, Tuple

import torch

from byteps import reduce_ops
from byteps.errors import InvalidArgumentError, InvalidTypeError

from .ops import _check_tensor, _resolve_name, _start, _start_group, declare, synchronize


class ReduceOp(enum.IntEnum):
    """Horovod's reduction ops (the same values as ``horovod.common.basics``)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

def _resolve_op(op, average: Optional[bool], fn: str) -> ReduceOp:
    """Horovod's ``handle_average_backwards_compatibility`` (:func:`byteps.reduce_ops.resolve`):
    ``op`` wins, ``average`` maps to Average / Sum, neither means Average; both is an error,
    and so are Adasum and an unknown op."""
    name = None
    if op is not None:
        try:
            name = ReduceOp(op).name.capitalize()  # AVERAGE -> "Average", Horovod's names
        except ValueError:
            raise InvalidArgumentError(f"{fn}: op must be one of Average, Sum, Min, Max, "
                                       f"Product (byteps.torch), got {op!r}") from None
    core_op, avg = reduce_ops.resolve(name, average, fn)
    return ReduceOp.AVERAGE if avg else ReduceOp[core_op.upper()]


def _core_op(op: ReduceOp) -> Tuple[str, bool]:
    """(push_pull's op, average) of a resolved op."""
    return reduce_ops.CORE_OPS[op.name.capitalize()]


def _factor(value, what: str, fn: str, tensor: torch.Tensor) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{fn}: {what} must be a number, got {type(value).__name__}")
    value = float(value)
    if value != 1.0 and not (tensor.is_floating_point()):
        raise InvalidTypeError(f"{fn}: {what}={value} needs a floating-point tensor, got "
                               f"{tensor.dtype}")
    return value


def _allreduce_start(tensor, average, name, op, prescale_factor, postscale_factor, inplace,
                     fn: str, process_set=None) -> int:
    _check_tensor(tensor, fn)
    hvd_op = _resolve_op(op, average, fn)
    core_op, avg = _core_op(hvd_op)
    pre = _factor(prescale_factor, "prescale_factor", fn, tensor)
    post = _factor(postscale_factor, "postscale_factor", fn, tensor)
    if pre != 1.0:
        if inplace:
            with torch.no_grad():
                tensor.mul_(pre)
        else:
            tensor = tensor.detach() * pre
    return _start(tensor, avg, name, 0, None, inplace, fn, op=core_op, postscale=post,
                  process_set=process_set)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set=None) -> int:
    """Start reducing ``tensor`` over all ranks into a new tensor (Horovod's
    ``allreduce_async``); :func:`synchronize` returns the result.

    Args:
        tensor: a CPU or CUDA tensor, any shape, a dtype of ``byteps.torch.SUPPORTED_DTYPES``;
            not modified.
        average: deprecated (Horovod): True = Average, False = Sum; give ``op`` instead.
        name: the same name on every rank (``None``: a generated one; every rank must then
            make its unnamed calls in the same order). A name keeps its op.
        op: :data:`Average` (default: the sum divided by ``size()``, floor division for
            integer dtypes), :data:`Sum`, :data:`Min`, :data:`Max` (elementwise; a NaN wins),
            :data:`Product` (integers wrap).
        prescale_factor, postscale_factor: the result is ``postscale_factor *
            reduce(prescale_factor * tensor)``; not 1.0 only for floating-point tensors.
        process_set: a registered ``ProcessSet`` (default: every rank); only its ranks call
            it, Average divides by its size.

    Returns:
        an integer handle for :func:`poll` and :func:`synchronize`.

    Raises:
        byteps.errors.InvalidArgumentError (a ``ValueError``): both ``op`` and ``average``,
            an unknown op, :data:`Adasum`, a name in flight or first reduced with another op.
        byteps.errors.InvalidTypeError (a ``TypeError``): not a tensor, an unsupported dtype
            or device, a scale factor that is not a number or not 1.0 on an integer tensor.
        byteps.errors.MismatchError: ranks disagree on the name's dtype, shape or op (at
            :func:`synchronize`, on every rank); a ``process_set`` not registered or
            without this rank: ``InvalidArgumentError``.
    """
    return _allreduce_start(tensor, average, name, op, prescale_factor, postscale_factor,
                            False, "allreduce_async", process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set=None) -> int:
    """In-place :func:`allreduce_async`: the result is written into ``tensor``, which must not
    be read or written until :func:`synchronize` returns it. Errors: as
    :func:`allreduce_async`."""
    return _allreduce_start(tensor, average, name, op, prescale_factor, postscale_factor,
                            True, "allreduce_async_", process_set)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None,
               name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set=None) -> torch.Tensor:
    """Synchronous in-place allreduce: returns ``tensor`` holding the result. Errors: as
    :func:`allreduce_async`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    """Forward: allreduce; backward: the gradient allreduced with the same op and factors
    under ``name + ".grad"`` (Horovod's ``HorovodAllreduce``)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (name, op, prescale_factor, postscale_factor, process_set)
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        name, op, pre, post, process_set = ctx.args
        grad = synchronize(allreduce_async(grad_output.contiguous(), None, name + ".grad", op,
                                           pre, post, process_set))
        return grad, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None,
              name: Optional[str] = None, compression=None, op=None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set=None) -> torch.Tensor:
    """Synchronous, differentiable allreduce (Horovod's ``allreduce``): a new tensor holding
    ``postscale_factor * reduce(prescale_factor * tensor)`` over all ranks.

    Args: as :func:`allreduce_async`, plus ``compression``: a ``byteps.torch.Compression``
        member applied around the reduction (``None``: none).

    Raises: as :func:`allreduce_async`, and the operation's error on every rank.
    """
    fn = "allreduce"
    _check_tensor(tensor, fn)
    hvd_op = _resolve_op(op, average, fn)
    name = _resolve_name(name)
    if tensor.requires_grad and process_set is None:  # the gradient's key, in forward order
        declare(name)
        declare(name + ".grad")
    if compression is None:
        return _Allreduce.apply(tensor, name, hvd_op, prescale_factor, postscale_factor,
                                process_set)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, hvd_op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


def _group_start(tensors, average, name, op, prescale_factor, postscale_factor, inplace,
                 fn: str, process_set=None) -> int:
    if isinstance(tensors, (list, tuple)):
        for t in tensors:
            _check_tensor(t, fn)
    _resolve_op(op, average, fn)  # its errors before anything starts
    return _start_group(tensors, name, fn, lambda t, n: _allreduce_start(
        t, average, n, op, prescale_factor, postscale_factor, inplace, fn, process_set))


def grouped_allreduce_async(tensors, average: Optional[bool] = None,
                            name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set=None) -> int:
    """Horovod's ``grouped_allreduce_async``: :func:`allreduce_async` of every tensor of the
    list (names ``<name>.<i>``), all started before this returns, under one handle;
    :func:`synchronize` returns the list of results. Errors: as :func:`allreduce_async`, and
    ``InvalidTypeError`` for ``tensors`` that is not a list or tuple."""
    return _group_start(tensors, average, name, op, prescale_factor, postscale_factor, False,
                        "grouped_allreduce_async", process_set)


def grouped_allreduce_async_(tensors, average: Optional[bool] = None,
                             name: Optional[str] = None, op=None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set=None) -> int:
    """In-place :func:`grouped_allreduce_async`: each tensor receives its result."""
    return _group_start(tensors, average, name, op, prescale_factor, postscale_factor, True,
                        "grouped_allreduce_async_", process_set)


def grouped_allreduce_(tensors, average: Optional[bool] = None, name: Optional[str] = None,
                       op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set=None):
    """Synchronous in-place grouped allreduce: returns the list of ``tensors``."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    """Forward: one grouped allreduce; backward: the gradients grouped-allreduced with the same
    op and factors under ``name + ".grad"`` (Horovod's ``HorovodGroupedAllreduce``)."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (name, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grads):
        name, op, pre, post, process_set = ctx.args
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], None,
                                                      name + ".grad", op, pre, post,
                                                      process_set))
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average: Optional[bool] = None, name: Optional[str] = None,
                      op=None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=None) -> list:
    """Horovod's ``grouped_allreduce``: new tensors, each ``postscale_factor *
    reduce(prescale_factor * tensor)``, reduced together; differentiable. Errors: as
    :func:`grouped_allreduce_async`."""
    fn = "grouped_allreduce"
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise InvalidTypeError(f"{fn}: expected a list or tuple of tensors, got "
                               f"{type(tensors).__name__}")
    hvd_op = _resolve_op(op, average, fn)
    name = _resolve_name(name)
    if not tensors:
        return []
    if any(getattr(t, "requires_grad", False) for t in tensors) and process_set is None:
        for i in range(len(tensors)):  # the gradients' keys, in forward order on every rank
            declare(f"{name}.{i}")
            declare(f"{name}.grad.{i}")
    return list(_GroupedAllreduce.apply(name, hvd_op, prescale_factor, postscale_factor,
                                        process_set, *tensors))
