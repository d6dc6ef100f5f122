"""``byteps.keras``: BytePS for the standalone ``keras`` package (Keras 3, TensorFlow backend).

Typical use::

    import byteps.keras as bps
    bps.init()
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.01 * bps.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0),
                               bps.callbacks.MetricAverageCallback()])

Same API as :mod:`byteps.tensorflow.keras`; all logic lives in :mod:`byteps.tensorflow._keras`.
"""

from __future__ import annotations

import keras

from byteps.telemetry import get_pushpull_speed, get_telemetry
from byteps.tensorflow._keras.front import make_front
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.ops import (
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

if not hasattr(keras, "optimizers") or not hasattr(keras.optimizers.Optimizer, "apply"):
    raise ImportError("byteps.keras needs Keras 3 (keras >= 3.0) "
                      "on the TensorFlow backend")

from . import callbacks

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
from byteps.tensorflow._async import pull_parameters  # noqa: E402 (re-exported)
