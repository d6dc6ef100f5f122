"""Callbacks of ``byteps.keras`` (the ``keras`` package): see
:mod:`byteps.tensorflow._keras.callbacks` for their documentation."""

from __future__ import annotations

import keras

from byteps.tensorflow._keras.callbacks import make_callbacks

(BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
 LearningRateWarmupCallback) = make_callbacks(keras)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
