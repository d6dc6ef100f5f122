"""``byteps.mxnet``: BytePS for MXNet 1.x (API-compatible with upstream BytePS).

Typical use (Gluon)::

    import byteps.mxnet as bps
    bps.init()
    net.initialize(ctx=mx.cpu())
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    # parameters are broadcast from root_rank on the first trainer.step()

Module API::

    opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1))
    mod.init_optimizer(optimizer=opt)
    arg_params, aux_params = mod.get_params()
    bps.broadcast_parameters(arg_params, root_rank=0)
    bps.broadcast_parameters(aux_params, root_rank=0)
    mod.set_params(arg_params, aux_params)

Run under the launcher: ``bpslaunch --workers 2 --servers 1 python train.py``.

Exports: :func:`init`, :func:`shutdown`, :func:`suspend`, :func:`resume`,
:func:`is_initialized`, :func:`size`, :func:`rank`, :func:`local_size`, :func:`local_rank`,
:func:`byteps_declare_tensor`, :func:`byteps_push_pull`, Horovod's :func:`allreduce` and
:func:`allreduce_` with its ops, :func:`allgather`, :func:`broadcast`, :func:`broadcast_`,
:func:`reducescatter`, :func:`alltoall` and the grouped forms (docs/collectives.md), each with
``process_set=``, Horovod's process sets (:class:`ProcessSet`, :func:`add_process_set`, ...),
:func:`barrier`, Horovod's build queries
(:mod:`byteps.capabilities`), :class:`DistributedOptimizer`,
:class:`DistributedTrainer`, :func:`broadcast_parameters`, :func:`broadcast_object`,
:func:`pull_parameters` (asynchronous training),
:class:`Compression`. NDArrays in host memory are push_pulled in place; a GPU NDArray through a
pinned host copy that MXNet's engine makes before and after the push_pull (three engine
operations, not the core's device stages). Tested with MXNet 1.9.1 (``pip install "byteps[mxnet]"``,
which pins ``numpy==1.23.5``: MXNet 1.9 uses ``np.bool``, removed in NumPy 1.24).
"""

from __future__ import annotations

try:
    import mxnet  # noqa: F401
except (ImportError, AttributeError) as exc:
    # AttributeError: mxnet 1.9 under NumPy >= 1.24 ("module 'numpy' has no attribute 'bool'").
    raise ImportError(
        f"byteps.mxnet needs MXNet 1.x, which cannot be imported here ({type(exc).__name__}: "
        f"{exc}). Install it with: pip install \"byteps[mxnet]\" (mxnet==1.9.1 with "
        "numpy==1.23.5), in its own virtual environment: newer NumPy breaks `import mxnet`."
    ) from exc

from byteps import capabilities as _capabilities
from byteps.basics import barrier, cross_rank, cross_size, is_homogeneous, resume, suspend
from byteps.capabilities import *  # noqa: F403  (Horovod's build queries)
from byteps.naming import broadcast_object
from byteps.process_sets import (  # Horovod's process sets
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from byteps.telemetry import get_pushpull_speed, get_telemetry, start_timeline, stop_timeline

from ._async import pull_parameters
from .collectives import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    join,
    reducescatter,
)
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .ops import (
    SUPPORTED_DTYPES,
    byteps_declare_tensor,
    byteps_push_pull,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from .optimizer import DistributedOptimizer, broadcast_parameters
from .trainer import DistributedTrainer

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
    "byteps_declare_tensor",
    "byteps_push_pull",
    "allreduce",
    "allreduce_",
    "allgather",
    "alltoall",
    "broadcast",
    "broadcast_",
    "reducescatter",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allgather",
    "grouped_reducescatter",
    "barrier",
    "join",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "DistributedOptimizer",
    "DistributedTrainer",
    "broadcast_parameters",
    "broadcast_object",
    "pull_parameters",
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "SUPPORTED_DTYPES",
]
__all__ += _capabilities.__all__
