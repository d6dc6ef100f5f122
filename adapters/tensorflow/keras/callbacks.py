"""Callbacks of ``byteps.tensorflow.keras`` (``tf.keras``): see
:mod:`byteps.tensorflow._keras.callbacks` for their documentation."""

from __future__ import annotations

import tensorflow as tf

from .._keras.callbacks import make_callbacks

(BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
 LearningRateWarmupCallback) = make_callbacks(tf.keras)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
