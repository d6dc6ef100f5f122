"""``byteps.tensorflow.keras``: BytePS for ``tf.keras`` (Keras 3 on TensorFlow >= 2.16).

Typical use::

    import byteps.tensorflow.keras as bps
    bps.init()
    opt = bps.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * bps.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0),
                               bps.callbacks.MetricAverageCallback()])

Same API as :mod:`byteps.keras`; all logic lives in :mod:`byteps.tensorflow._keras`.
"""

from __future__ import annotations

import tensorflow as tf
from byteps.telemetry import get_pushpull_speed, get_telemetry

from .. import _keras
from ..compression import Compression
from ..ops import (
    Adasum,
    Average,
    Sum,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)

keras = tf.keras
if not hasattr(keras, "optimizers") or not hasattr(keras.optimizers.Optimizer, "apply"):
    raise ImportError("byteps.tensorflow.keras needs Keras 3 as tf.keras (TensorFlow >= 2.16 "
                      "without TF_USE_LEGACY_KERAS)")

from . import callbacks  # noqa: E402

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
           "get_pushpull_speed", "get_telemetry",
           "Compression", "Average", "Sum", "Adasum", "DistributedOptimizer",
           "broadcast_global_variables", "push_pull", "broadcast", "load_model", "callbacks",
           "pull_parameters"]


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, compression_params=None):
    """A distributed copy of the Keras 3 ``optimizer`` (same class, config and state) whose
    ``apply``/``apply_gradients`` first averages the gradients across workers; see
    :func:`byteps.tensorflow._keras.create_distributed_optimizer` for the arguments and
    errors (``device_dense``/``device_sparse`` are accepted for compatibility;
    ``compression_params``: gradient compression by the core, upstream's MXNet dict)."""
    return _keras.create_distributed_optimizer(keras, optimizer, name, compression,
                                               sparse_as_dense, backward_passes_per_step, op,
                                               compression_params)


def pull_parameters(optimizer, variables=None):
    """Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``): read the servers' parameters into the
    variables the distributed ``optimizer`` updates; see
    :func:`byteps.tensorflow._async.pull_parameters`."""
    from byteps.tensorflow._async import pull_parameters as pull

    return pull(optimizer, variables)


def broadcast_global_variables(model_or_variables, root_rank=0):
    """Broadcast a model's (and its optimizer's) variables, or a list of variables, from
    ``root_rank``; see :func:`byteps.tensorflow._keras.broadcast_global_variables`."""
    return _keras.broadcast_global_variables(model_or_variables, root_rank)


def push_pull(value, name=None, average=True):
    """Average (or sum) ``value`` across workers; returns a NumPy array. See
    :func:`byteps.tensorflow._keras.push_pull`."""
    return _keras.push_pull(value, name, average)


def broadcast(value, root_rank, name=None):
    """``root_rank``'s ``value`` on every rank, as a NumPy array. See
    :func:`byteps.tensorflow._keras.broadcast`."""
    return _keras.broadcast(value, root_rank, name)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Load a Keras model whose optimizer is distributed (state restored). See
    :func:`byteps.tensorflow._keras.load_model`."""
    return _keras.load_model(keras, filepath, custom_optimizers, custom_objects, compression)
