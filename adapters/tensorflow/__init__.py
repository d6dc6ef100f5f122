"""``byteps.tensorflow``: BytePS for TensorFlow 2 (API-compatible with upstream BytePS and
Horovod).

Typical use::

    import byteps.tensorflow as bps
    bps.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = bps.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    ...
    bps.broadcast_variables(model.variables, root_rank=0)   # after the first step

Keras users: :mod:`byteps.tensorflow.keras` (``tf.keras``) or :mod:`byteps.keras` (the
``keras`` package). Run under the launcher:
``bpslaunch --workers 2 --servers 1 python train.py``.

Exports: :func:`init`, :func:`shutdown`, :func:`is_initialized`, :func:`size`, :func:`rank`,
:func:`local_size`, :func:`local_rank`, :func:`declare`, :func:`push_pull`,
:func:`allreduce` (Horovod's, with its scale factors), :func:`allgather`,
:func:`reducescatter`, :func:`alltoall`, their grouped forms, :func:`barrier`, Horovod's process
sets (:class:`ProcessSet`, :func:`add_process_set`, ...; ``process_set=`` on every collective and
``DistributedGradientTape``), Horovod's build
queries (:mod:`byteps.capabilities`), :func:`broadcast`, :func:`broadcast_variables`, :func:`broadcast_object`,
:func:`DistributedOptimizer`, :class:`SyncBatchNormalization`,
:func:`DistributedGradientTape`, :class:`Compression`, and the ops :data:`Average`,
:data:`Sum`, :data:`Min`, :data:`Max`, :data:`Product` (push_pull and allreduce;
docs/collectives.md), :data:`Adasum` (Adasum raises
``byteps.errors.InvalidArgumentError``, a ``ValueError``, wherever an op is taken).

The adapter is Python over the core (no TensorFlow custom op is compiled): tensors pass
through host memory as NumPy arrays, eagerly or via ``tf.numpy_function`` inside
``tf.function``. Requires TensorFlow 2.x (Keras 3 for the Keras parts); models using the
distributed Keras optimizer must not be XLA-compiled (``jit_compile=False`` on GPU hosts).
"""

from __future__ import annotations

import tensorflow as tf

if not tf.__version__.startswith("2."):
    raise ImportError(f"byteps.tensorflow needs TensorFlow 2.x; found {tf.__version__}")

from byteps import capabilities as _capabilities
from byteps.basics import barrier, cross_rank, cross_size, is_homogeneous, resume, suspend
from byteps.capabilities import *  # noqa: F403  (Horovod's build queries)
from byteps.process_sets import (  # Horovod's process sets
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from byteps.telemetry import get_pushpull_speed, get_telemetry, start_timeline, stop_timeline

from ._async import pull_parameters
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .functions import allreduce, broadcast, broadcast_object, broadcast_variables, push_pull
from .gather_scatter import (
    allgather,
    allgather_object,
    alltoall,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from .ops import (
    SUPPORTED_DTYPES,
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    declare,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNormalization
from .tape import DistributedGradientTape

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
    "allreduce",
    "allgather",
    "allgather_object",
    "alltoall",
    "grouped_allreduce",
    "grouped_allgather",
    "grouped_reducescatter",
    "reducescatter",
    "barrier",
    "join",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "broadcast",
    "broadcast_variables",
    "broadcast_object",
    "pull_parameters",
    "DistributedOptimizer",
    "SyncBatchNormalization",
    "DistributedGradientTape",
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "SUPPORTED_DTYPES",
]
__all__ += _capabilities.__all__
