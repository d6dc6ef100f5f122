"""Horovod's allgather, broadcast, reducescatter and alltoall for PyTorch (``hvd.allgather``,
``allgather_async``, ``grouped_allgather``, ``broadcast``, ``broadcast_``, ``broadcast_async``,
``broadcast_async_``, ``reducescatter``, ``reducescatter_async``, ``grouped_reducescatter``,
``alltoall``, ``alltoall_async``),
over :mod:`byteps.collectives` (the core's programs over the worker mesh, docs/collectives.md).

Semantics are Horovod's (``horovod/torch/mpi_ops.py``): allgather concatenates every rank's
tensor along the first dimension in rank order (ranks may differ in that dimension only);
broadcast gives every rank the root's tensor; reducescatter reduces (Sum or Average, with
``prescale_factor`` / ``postscale_factor``) and gives rank r its shard of the first dimension
(``rows // size`` rows, the first ``rows % size`` ranks one more); alltoall sends ``splits[j]``
rows to rank j and returns what every rank sent this one, in rank order. The synchronous forms
are differentiable as Horovod's autograd functions are: allgather's gradient is this rank's
slice of the averaged output gradient, broadcast's the averaged gradient on the root and zeros
elsewhere, reducescatter's the allgathered output gradient (divided by ``size()`` for
Average), alltoall's the alltoall of the output gradient back with the received splits.

Tensors of any dtype allgather, broadcast and alltoall (they move bytes); reducescatter takes
``byteps.torch.SUPPORTED_DTYPES``. CUDA tensors travel through host memory (a copy each way).
Not here yet: ``process_set=`` (only the global set exists; the argument is not accepted).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from byteps import basics, collectives
from byteps.errors import InvalidArgumentError, InvalidTypeError

from .collectives import Average, ReduceOp, Sum, _factor, _resolve_op, allreduce
from .ops import _check_tensor, _Op, _register, _resolve_name, _start_group, synchronize

# torch dtypes NumPy lacks, moved as the same-size integers NumPy has.
_BITS_AS = {torch.bfloat16: torch.int16, torch.bool: torch.uint8}


def _host_array(tensor: torch.Tensor, fn: str) -> np.ndarray:
    """``tensor``'s values as a NumPy array (a view for a contiguous CPU tensor)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidTypeError(f"{fn}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise InvalidTypeError(f"{fn}: only dense (strided) tensors are supported, got "
                               f"{tensor.layout}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise InvalidTypeError(f"{fn}: tensor is on device {tensor.device}; pass tensor.cpu()")
    t = tensor.detach().cpu().contiguous()
    if t.dtype in _BITS_AS:
        t = t.view(_BITS_AS[t.dtype])
    try:
        return t.numpy()
    except TypeError:
        raise InvalidTypeError(f"{fn}: tensors of {tensor.dtype} cannot be sent") from None


def _to_torch(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    out = torch.from_numpy(array)
    if like.dtype in _BITS_AS:
        out = out.view(like.dtype)
    return out.to(like.device) if like.device.type != "cpu" else out


def _start(pending: collectives.Pending, like: torch.Tensor, name: str,
           output: Optional[torch.Tensor] = None, postscale: float = 1.0) -> int:
    """Register ``pending`` under its handle; ``output``: the in-place target."""
    op = _Op(name, output, pending.keep, None, output is not None, postscale,
             finish=lambda: _to_torch(pending.finish(), like))
    return _register(pending.handle, op)


# ---------------------------------------------------------------------------------- allgather
def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set=None) -> int:
    """Start Horovod's allgather: every rank's ``tensor`` concatenated along the first
    dimension, in rank order; :func:`synchronize` returns the new tensor.

    Args:
        tensor: at least 1-d, any dtype, CPU or CUDA; the ranks' tensors may differ in the first
            dimension only. Not modified.
        name: the same on every rank (``None``: a generated one; every rank must then make its
            unnamed calls in the same order).
        process_set: a registered ``ProcessSet`` (default: every rank): only its ranks call
            it; the result is theirs, in their order (as every collective of this module).

    Returns:
        a handle for :func:`poll` and :func:`synchronize`. The ranks' sizes are agreed before
        this returns (one small round trip).

    Raises:
        byteps.errors.InvalidArgumentError: a 0-d tensor, or ranks whose tensors differ beyond
            the first dimension (on every rank).
        byteps.errors.InvalidTypeError: not a tensor, a sparse tensor or a dtype with no bytes
            to move.
    """
    fn = "allgather"
    array = _host_array(tensor, fn)
    name = _resolve_name(name)
    return _start(collectives.allgather_start(array, name, process_set=process_set), tensor,
                  name)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0]
        ctx.name = name
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        ps = ctx.process_set
        grad = allreduce(grad_output.contiguous(), op=Average, name=f"{ctx.name}.grad",
                         process_set=ps)
        rows = synchronize(allgather_async(torch.tensor([ctx.rows]), f"{ctx.name}.grad.rows",
                                           ps))
        offset = int(rows[:_rank_in(ps)].sum())
        return grad.narrow(0, offset, ctx.rows), None, None


def _rank_in(process_set) -> int:
    return basics.rank() if process_set is None else process_set.rank()


def _size_of(process_set) -> int:
    return basics.size() if process_set is None else process_set.size()


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set=None) -> torch.Tensor:
    """Synchronous, differentiable :func:`allgather_async` (Horovod's ``allgather``)."""
    name = _resolve_name(name)
    if tensor.requires_grad and tensor.is_floating_point():
        return _Allgather.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors: List[torch.Tensor], name: Optional[str] = None,
                            process_set=None) -> int:
    """Start an allgather of each tensor (named ``<name>.<i>``) under one handle:
    :func:`synchronize` returns the list of results (Horovod's ``grouped_allgather_async``)."""
    return _grouped(tensors, name, "grouped_allgather", allgather_async,
                    process_set=process_set)


def grouped_allgather(tensors: List[torch.Tensor], name: Optional[str] = None,
                      process_set=None) -> list:
    """Synchronous :func:`grouped_allgather_async`."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _grouped(tensors, name, fn, start, **kwargs) -> int:
    return _start_group(tensors, name, fn, lambda t, n: start(t, name=n, **kwargs))


# ---------------------------------------------------------------------------------- broadcast
def _broadcast_start(tensor, root_rank, name, inplace: bool, fn: str, process_set=None) -> int:
    array = _host_array(tensor, fn)
    name = _resolve_name(name)
    pending = collectives.broadcast_start(array, root_rank, name, process_set=process_set)
    return _start(pending, tensor, name, output=tensor if inplace else None)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set=None) -> int:
    """Start Horovod's broadcast into a new tensor: :func:`synchronize` returns ``root_rank``'s
    ``tensor`` on every rank.

    Args:
        tensor: any shape and dtype, CPU or CUDA; the same shape and dtype on every rank.
        root_rank: the rank whose tensor is sent, ``0 <= root_rank < size()``; the same on every
            rank (else ``MismatchError`` on every rank).
        name, process_set: as :func:`allgather_async`; in a set ``root_rank`` is a global rank
            of the set (Horovod's).

    Raises:
        byteps.errors.InvalidArgumentError: a root outside the job (or the set).
        byteps.errors.InvalidTypeError: a root that is not an int, not a tensor.
    """
    return _broadcast_start(tensor, root_rank, name, False, "broadcast", process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set=None) -> int:
    """In-place :func:`broadcast_async`: :func:`synchronize` writes the root's values into
    ``tensor`` and returns it."""
    return _broadcast_start(tensor, root_rank, name, True, "broadcast_", process_set)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.name = name
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=Average, name=f"{ctx.name}.grad",
                         process_set=ctx.process_set)
        if basics.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set=None) -> torch.Tensor:
    """Synchronous, differentiable :func:`broadcast_async` (Horovod's ``broadcast``)."""
    name = _resolve_name(name)
    if tensor.requires_grad and tensor.is_floating_point():
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set=None) -> torch.Tensor:
    """Synchronous :func:`broadcast_async_` (Horovod's ``broadcast_``): ``tensor``, holding
    the root's values."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ------------------------------------------------------------------------------ reducescatter
def _reducescatter_op(op, fn: str) -> ReduceOp:
    hvd_op = _resolve_op(op, None, fn)
    if hvd_op not in (Sum, Average):
        raise InvalidArgumentError(f"{fn}: op must be Sum or Average (Horovod's reducescatter), "
                                   f"got {hvd_op.name.capitalize()}")
    return hvd_op


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op=Average,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set=None) -> int:
    """Start Horovod's reducescatter: ``tensor`` summed (``op`` Sum) or averaged (Average, the
    default) over the ranks, ``postscale_factor * reduce(prescale_factor * tensor)``; rank r's
    result is its shard of the first dimension (``rows // size()`` rows, the first
    ``rows % size()`` ranks one more). :func:`synchronize` returns it.

    Args:
        tensor: at least 1-d, a dtype of ``byteps.torch.SUPPORTED_DTYPES``, the same shape on
            every rank; CPU or CUDA. Not modified.
        name: as :func:`allgather_async`.
        op: :data:`Sum` or :data:`Average`.
        prescale_factor, postscale_factor: floats; not 1.0 only for floating-point tensors.
        process_set: as :func:`allgather_async`: the shards are the set's ranks'.

    Raises:
        byteps.errors.InvalidArgumentError: another op, a 0-d tensor.
        byteps.errors.InvalidTypeError: an unsupported dtype or a factor on an integer tensor.
    """
    fn = "reducescatter"
    _check_tensor(tensor, fn)
    hvd_op = _reducescatter_op(op, fn)
    pre = _factor(prescale_factor, "prescale_factor", fn, tensor)
    post = _factor(postscale_factor, "postscale_factor", fn, tensor)
    src = tensor.detach() * pre if pre != 1.0 else tensor
    dtype = _check_tensor(src, fn)
    array = _host_array(src, fn)
    name = _resolve_name(name)
    pending = collectives.reducescatter_start(array, name, average=hvd_op == Average,
                                              dtype=dtype, process_set=process_set)
    return _start(pending, tensor, name, postscale=post)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.scale = pre * post / (_size_of(process_set) if op == Average else 1)
        ctx.name = name
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, pre, post, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allgather_async(grad_output.contiguous(), f"{ctx.name}.grad",
                                           ctx.process_set))
        return grad * ctx.scale, None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, op=Average,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set=None) -> torch.Tensor:
    """Synchronous, differentiable :func:`reducescatter_async` (Horovod's
    ``reducescatter``)."""
    name = _resolve_name(name)
    if tensor.requires_grad and tensor.is_floating_point():
        return _Reducescatter.apply(tensor, name, _reducescatter_op(op, "reducescatter"),
                                    prescale_factor, postscale_factor, process_set)
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor,
                                           process_set))


def grouped_reducescatter_async(tensors: List[torch.Tensor], name: Optional[str] = None,
                                op=Average, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, process_set=None) -> int:
    """Start a reducescatter of each tensor (named ``<name>.<i>``) under one handle:
    :func:`synchronize` returns the list of shards (Horovod's
    ``grouped_reducescatter_async``)."""
    _reducescatter_op(op, "grouped_reducescatter")  # its error before anything starts
    return _grouped(tensors, name, "grouped_reducescatter", reducescatter_async, op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                    process_set=process_set)


def grouped_reducescatter(tensors: List[torch.Tensor], name: Optional[str] = None, op=Average,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set=None) -> list:
    """Synchronous :func:`grouped_reducescatter_async`."""
    return synchronize(grouped_reducescatter_async(tensors, name, op, prescale_factor,
                                                   postscale_factor, process_set))


# ----------------------------------------------------------------------------------- alltoall
def _splits_list(splits, fn: str):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(x) for x in splits.reshape(-1).tolist()]
    try:
        return [int(x) for x in splits]
    except (TypeError, ValueError):
        raise InvalidTypeError(f"{fn}: splits must be a sequence or tensor of ints, got "
                               f"{type(splits).__name__}") from None


def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set=None) -> int:
    """Start Horovod's alltoall: ``splits[j]`` rows of ``tensor`` (in order) go to rank j;
    :func:`synchronize` returns ``(output, received_splits)``: the rows every rank sent this
    one, concatenated in rank order, and how many came from each (an int32 tensor).

    Args:
        tensor: at least 1-d, any dtype, CPU or CUDA; the ranks' tensors may differ in the first
            dimension only. Not modified.
        splits: ``size()`` non-negative ints (a list or an integer tensor) adding up to the
            rows; ``None``: the rows split evenly (they must divide by ``size()``).
        name, process_set: as :func:`allgather_async` (splits: one per rank of the set).

    Raises:
        byteps.errors.InvalidArgumentError: splits of the wrong length or sum, rows that do not
            divide evenly without splits, a 0-d tensor, ranks whose tensors differ beyond the
            first dimension (on every rank).
        byteps.errors.InvalidTypeError: not a tensor, splits that are not ints.
    """
    fn = "alltoall"
    array = _host_array(tensor, fn)
    name = _resolve_name(name)
    pending = collectives.alltoall_start(array, _splits_list(splits, fn), name,
                                         process_set=process_set)

    def finish():
        out, received = pending.finish()
        return _to_torch(out, tensor), torch.from_numpy(received.astype(np.int32))

    return _register(pending.handle, _Op(name, None, pending.keep, None, False, finish=finish))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.name = name
        ctx.process_set = process_set
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _unused):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             f"{ctx.name}.grad", ctx.process_set))
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None, process_set=None):
    """Synchronous, differentiable :func:`alltoall_async` (Horovod's ``alltoall``): the output
    tensor, and with ``splits`` given also the received splits (``(output,
    received_splits)``, as Horovod)."""
    name = _resolve_name(name)
    if tensor.requires_grad and tensor.is_floating_point():
        out, received = _Alltoall.apply(tensor, _splits_list(splits, "alltoall"), name,
                                        process_set)
    else:
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


def allgather_object(obj, name: Optional[str] = None, process_set=None) -> list:
    """Horovod's ``allgather_object``: every rank's picklable ``obj``, as a list in rank order
    (``byteps.collectives.allgather_object``; ``name`` default: ``type(obj).__name__``, as
    Horovod); ``process_set``: its ranks' objects only."""
    return collectives.allgather_object(obj, name if name is not None else type(obj).__name__,
                                        process_set)


def join(device: int = -1) -> int:
    """Horovod's ``join``: this rank has run out of data; blocks until every rank has joined,
    while the others' allreduce, allgather, broadcast and reducescatter (and
    ``DistributedOptimizer``'s reductions) complete without it: it contributes zeros to a sum
    (an Average still divides by ``size()``) and no rows to a gather. Returns the rank that
    joined last. ``device`` is Horovod's (the device of its zero tensors): accepted, ignored
    here, where nothing is sent for the joined rank. Errors: ``byteps.collectives.join``."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise InvalidTypeError(f"join: device must be an int, got {type(device).__name__}")
    return collectives.join()
