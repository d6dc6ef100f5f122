"""``byteps.torch``: BytePS for PyTorch (API-compatible with upstream BytePS and Horovod).

Typical use::

    import byteps.torch as bps
    bps.init()
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    bps.broadcast_optimizer_state(optimizer, root_rank=0)

Run under the launcher: ``bpslaunch --workers 2 --servers 1 python train.py``.

Exports: :func:`init`, :func:`shutdown`, :func:`is_initialized`, :func:`size`, :func:`rank`,
:func:`local_size`, :func:`local_rank`, :func:`declare`, :func:`push_pull`,
:func:`push_pull_async`, :func:`push_pull_async_inplace`, :func:`push_pull_inplace`,
:func:`byteps_push_pull`, :func:`poll`, :func:`synchronize`, :class:`Compression`,
:class:`DistributedOptimizer`, :func:`broadcast_parameters`,
:func:`broadcast_optimizer_state`, :func:`broadcast_object`, :func:`pull_parameters`
(asynchronous training, ``BYTEPS_ENABLE_ASYNC=1``: the servers' parameters), and Horovod's
:func:`allreduce`, :func:`allreduce_async`, :func:`allreduce_`, :func:`allreduce_async_`, the
``grouped_allreduce`` forms, with
its ops :data:`Average`, :data:`Sum`, :data:`Min`, :data:`Max`, :data:`Product`
(:data:`Adasum` is refused; docs/collectives.md), :func:`barrier`, and Horovod's build queries
(:func:`mpi_built`, :func:`nccl_built`, :func:`cuda_built`... : :mod:`byteps.capabilities`),
:class:`SyncBatchNorm` (batch statistics over every rank), and Horovod's process sets
(:class:`ProcessSet`, :data:`global_process_set`, :func:`add_process_set`,
:func:`remove_process_set`; every collective and ``DistributedOptimizer`` take
``process_set=``; docs/collectives.md) and :func:`join` (uneven data).

CPU and CUDA tensors: a CUDA tensor goes through the core's device stages (copied to pinned
host memory after its producer's event and back; docs/gpu.md) where CUDA support is on
(:func:`byteps.cuda_status`), and raises ``byteps.errors.InvalidTypeError`` (a ``TypeError``)
naming the reason where it is off; a tensor on another device raises it too. Requires
torch >= 2.1
(``Tensor.register_post_accumulate_grad_hook``).
"""

from __future__ import annotations

from typing import Optional

import torch

_MIN_TORCH = (2, 1)


def _torch_version() -> tuple:
    parts = []
    for piece in torch.__version__.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


if _torch_version() < _MIN_TORCH or not hasattr(torch.Tensor,
                                                "register_post_accumulate_grad_hook"):
    raise ImportError(
        f"byteps.torch needs torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]} (it hooks gradients with "
        f"Tensor.register_post_accumulate_grad_hook); found torch {torch.__version__}"
    )

from byteps import capabilities as _capabilities  # noqa: E402
from byteps.basics import barrier, cross_rank, cross_size, is_homogeneous, resume, suspend  # noqa: E402  (resume: elastic restart)
from byteps.capabilities import *  # noqa: E402, F403  (Horovod's build queries)
from byteps.process_sets import (  # noqa: E402  (Horovod's process sets)
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from byteps.telemetry import get_pushpull_speed, get_telemetry, start_timeline, stop_timeline  # noqa: E402

from ._async import pull_parameters  # noqa: E402
from .broadcast import (  # noqa: E402
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .collectives import (  # noqa: E402
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: E402
from .gather_scatter import (  # noqa: E402
    allgather,
    allgather_async,
    allgather_object,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)
from .ops import (  # noqa: E402
    SUPPORTED_DTYPES,
    _check_tensor,
    _resolve_name,
    byteps_push_pull,
    declare,
    init,
    is_initialized,
    local_rank,
    local_size,
    poll,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_inplace,
    rank,
    shutdown,
    size,
    synchronize,
)
from .optimizer import DistributedOptimizer, _DistributedOptimizer  # noqa: E402
from .sync_batch_norm import SyncBatchNorm  # noqa: E402

__all__ = [
    "init",
    "shutdown",
    "suspend",
    "resume",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_rank",
    "cross_size",
    "is_homogeneous",
    "get_pushpull_speed",
    "get_telemetry",
    "start_timeline",
    "stop_timeline",
    "declare",
    "push_pull",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_inplace",
    "byteps_push_pull",
    "poll",
    "synchronize",
    "barrier",
    "join",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "SyncBatchNorm",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "allgather_object",
    "alltoall",
    "alltoall_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "ReduceOp",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "DistributedOptimizer",
    "_DistributedOptimizer",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "pull_parameters",
    "SUPPORTED_DTYPES",
]
__all__ += _capabilities.__all__


class _PushPull(torch.autograd.Function):
    """Autograd function: forward = push_pull of the input; backward = push_pull of the
    incoming gradient under ``name + ".grad"`` with the same ``average``."""

    @staticmethod
    def forward(ctx, tensor, average, name, version, priority):
        ctx.average = average
        ctx.name = name
        ctx.version = version
        ctx.priority = priority
        return synchronize(push_pull_async(tensor, average, name, version, priority))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(push_pull_async(grad_output, ctx.average, ctx.name + ".grad",
                                           ctx.version, ctx.priority))
        return grad, None, None, None, None


def push_pull(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
              version: int = 0, priority: int = 0,
              compression=Compression.none) -> torch.Tensor:
    """Sum (or average) ``tensor`` over all workers and return the result as a new tensor.

    Synchronous and differentiable: the gradient of the output is push_pulled the same way
    (same ``average``) under the name ``name + ".grad"``, so ``d(sum_r x_r)/dx`` works across
    ranks. The input is not modified.

    Args:
        tensor: CPU tensor, any shape (0-d and empty included), dtype float16, bfloat16,
            float32, float64, int8, uint8, int32 or int64; non-contiguous is fine.
        average: divide by :func:`size` (floor division for integer dtypes). Default True.
        name: the same name on every rank. Upstream required one (``AssertionError``);
            ``None`` here generates a unique name (all ranks must then make their unnamed
            calls in the same order). Each distinct name takes a key in the core, so name
            tensors you reduce repeatedly.
        version: accepted for upstream compatibility; unused.
        priority: 0 = core default (declaration order), otherwise larger runs first.
        compression: :class:`Compression` member applied around the reduction (e.g.
            ``Compression.fp16`` reduces float tensors as float16 and returns the input dtype).

    Returns:
        a new tensor with the input's shape and dtype.

    Raises:
        byteps.errors.InvalidTypeError (a ``TypeError``): unsupported dtype (bool, int16,
            complex, ...), GPU tensor, or not a tensor.
        byteps.errors.InvalidArgumentError (a ``ValueError``): an operation with this name is
            already in flight.
        byteps.errors.MismatchError: ranks disagree on this name's dtype or shape.
        byteps.errors.NotInitializedError: before :func:`init`.
    """
    _check_tensor(tensor, "push_pull")  # before the compressor, which expects a tensor
    name = _resolve_name(name)
    if tensor.requires_grad:
        # Declare the gradient's name now, in forward order, so its key agrees on every rank
        # whatever order the backward passes run in.
        declare(name)
        declare(name + ".grad")
    compressed, ctx = compression.compress(tensor)
    summed = _PushPull.apply(compressed, average, name, version, priority)
    return compression.decompress(summed, ctx)
