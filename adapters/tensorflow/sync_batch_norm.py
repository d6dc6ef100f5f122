"""Horovod's ``SyncBatchNormalization`` for TensorFlow / Keras 3: batch normalization whose
training statistics cover every rank's batch (docs/collectives.md "SyncBatchNorm").

A subclass of ``tf.keras.layers.BatchNormalization`` that replaces only how the batch's moments
are computed: per channel, the count of values, their sum and the sum of their squares (in
float64) are summed over the ranks in one ``byteps.tensorflow.allreduce`` (op Sum), which gives
the mean and the biased variance of the concatenated batch; normalization, the moving
statistics and everything else are Keras's. The allreduce is differentiable (its gradient is
the allreduce of the incoming gradients), so the input's gradient is that of the loss summed
over the ranks, as for BatchNormalization on the concatenated batch. Ranks may have different
batch sizes. Inference (``training=False``) uses the moving statistics, with no communication.
"""

from __future__ import annotations

import tensorflow as tf
from byteps.errors import InvalidArgumentError

from . import ops
from .functions import allreduce


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """``tf.keras.layers.BatchNormalization`` with the statistics of every rank's batch
    (Horovod's ``hvd.SyncBatchNormalization``); the same arguments. Every rank must build its
    layers in the same order (each layer's allreduce is named after the layer), and call them
    in training mode in the same order.

    Raises:
        byteps.errors.InvalidArgumentError: a ``mask`` in training mode, or ``renorm=True``
            (neither is synchronized here).
    """

    def __init__(self, *args, **kwargs):
        if kwargs.get("renorm"):
            raise InvalidArgumentError("SyncBatchNormalization: renorm=True is not supported")
        kwargs.pop("synchronized", None)  # Keras's own flag is for its distribution strategies
        super().__init__(*args, **kwargs)

    def _moments(self, inputs, mask):
        if mask is not None:
            raise InvalidArgumentError("SyncBatchNormalization: a mask is not supported in "
                                       "training mode")
        axes = list(self._reduction_axes)
        x = tf.cast(inputs, tf.float64)
        local_sum = tf.reduce_sum(x, axis=axes)
        local_sq = tf.reduce_sum(tf.square(x), axis=axes)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float64)
        packed = tf.concat([local_sum, local_sq, tf.reshape(count, [1])], 0)
        total = allreduce(packed, op=ops.Sum, name=f"SyncBatchNormalization.{self.name}")
        c = tf.shape(local_sum)[0]
        mean = total[:c] / total[-1]
        variance = tf.maximum(total[c:2 * c] / total[-1] - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
