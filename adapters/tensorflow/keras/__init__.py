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

from .._keras.front import make_front
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


_front = make_front(keras)
DistributedOptimizer = _front.DistributedOptimizer
broadcast_global_variables = _front.broadcast_global_variables
push_pull = _front.push_pull
broadcast = _front.broadcast
load_model = _front.load_model
from .._async import pull_parameters  # noqa: E402 (re-exported)
