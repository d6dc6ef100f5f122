"""Keras 3 callbacks shared by ``byteps.tensorflow.keras.callbacks`` and
``byteps.keras.callbacks`` (upstream ``byteps/_keras/callbacks.py``; Horovod's current
signatures and semantics). Each ``make_*`` builds the callback class for a front's Keras
module (``keras.callbacks.Callback`` differs between ``tf.keras`` and ``keras`` only in
name)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from byteps.errors import InvalidArgumentError

from .. import functions, ops
from . import _optimizer_variables

__all__ = ["make_callbacks"]


def _get_lr(optimizer) -> float:
    import keras
    lr = optimizer.learning_rate
    return float(keras.ops.convert_to_numpy(lr))


def _set_lr(optimizer, value: float) -> None:
    from keras.optimizers.schedules import LearningRateSchedule
    if isinstance(getattr(optimizer, "_learning_rate", None), LearningRateSchedule):
        raise InvalidArgumentError(
            "learning-rate callbacks cannot set the learning rate of an optimizer "
            "that uses a LearningRateSchedule")
    optimizer.learning_rate = float(value)


def _set_momentum(optimizer, value: float) -> None:
    m = optimizer.momentum
    if hasattr(m, "assign"):
        m.assign(float(value))  # the distributed optimizer's variable-backed momentum
    else:
        optimizer.momentum = float(value)  # plain optimizer: takes effect when (re)traced


def make_callbacks(keras):
    """Return ``(BroadcastGlobalVariablesCallback, MetricAverageCallback,
    LearningRateScheduleCallback, LearningRateWarmupCallback)`` for ``keras``."""
    Callback = keras.callbacks.Callback

    class BroadcastGlobalVariablesCallback(Callback):
        """Broadcast the model's variables and its optimizer's variables from ``root_rank``
        at the end of the FIRST batch, once (upstream/Horovod): the optimizer's slot
        variables exist only after its first step, so every rank starts the second step
        from identical weights and optimizer state. The first step itself runs on each
        rank's own initial weights with averaged gradients.

        Args:
            root_rank: the source rank.
            device: accepted for compatibility (unused).
        """

        def __init__(self, root_rank: int, device: str = ""):
            super().__init__()
            self.root_rank = root_rank
            self.device = device
            self.broadcast_done = False

        def on_batch_end(self, batch, logs=None):
            if self.broadcast_done:
                return
            functions.broadcast_variables(self.model.variables, self.root_rank,
                                          scope="BroadcastGlobalVariablesCallback/Model/")
            opt_vars = _optimizer_variables(getattr(self.model, "optimizer", None))
            if opt_vars:
                functions.broadcast_variables(
                    opt_vars, self.root_rank,
                    scope="BroadcastGlobalVariablesCallback/Optimizer/")
            self.broadcast_done = True

    class MetricAverageCallback(Callback):
        """Average every entry of ``logs`` across workers at the end of each epoch (sorted
        key order, one operation, float64), so every rank reports and records (History,
        checkpoints, early stopping) identical metrics. Put it before callbacks that read
        the metrics.

        Args:
            device: accepted for compatibility (unused).
        """

        def __init__(self, device: str = ""):
            super().__init__()
            self.device = device

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            import tensorflow as tf
            keys = sorted(logs)
            values = [tf.constant(np.asarray(logs[k], dtype=np.float64).reshape(()))
                      for k in keys]
            names = [f"MetricAverageCallback.{ops._normalize_name(k)}" for k in keys]
            outs = ops._push_pull_many(values, names, True)
            for k, out in zip(keys, outs):
                logs[k] = float(out.numpy())

    class LearningRateScheduleCallback(Callback):
        """Set the learning rate to ``initial_lr * multiplier(epoch)`` between
        ``start_epoch`` (inclusive) and ``end_epoch`` (exclusive) (Horovod semantics).

        With ``staircase=True`` the rate changes at the first batch of each epoch; with
        ``False`` at every batch, using the fractional epoch ``epoch + batch /
        steps_per_epoch``. With ``momentum_correction`` and an optimizer that has
        ``momentum``, the momentum is scaled by ``new_lr / old_lr`` for the batch in which the
        rate changed and restored after it (Goyal et al., 2017). The current rate is logged as
        ``logs["lr"]`` at the end of each epoch.

        Args:
            initial_lr: base rate (Horovod order: first). Upstream BytePS's order
                (``multiplier`` first, ``initial_lr`` keyword, read from the optimizer when
                omitted) is accepted too: a callable first argument is taken as the
                multiplier.
            multiplier: a constant or a function of the (possibly fractional) epoch.
            start_epoch, end_epoch: the epochs the schedule applies to.
            staircase: per-epoch (True) or per-batch (False) adjustment; a constant
                multiplier forces True.
            momentum_correction: scale momentum as described above.
            steps_per_epoch: batches per epoch; default from Keras' ``params["steps"]``.

        Raises:
            InvalidArgumentError (a ValueError): no multiplier; steps per epoch needed but unknown;
                an optimizer with a ``LearningRateSchedule``.
        """

        def __init__(self, initial_lr=None, multiplier=None, start_epoch: int = 0,
                     end_epoch: Optional[int] = None, staircase: bool = True,
                     momentum_correction: bool = True,
                     steps_per_epoch: Optional[int] = None):
            super().__init__()
            if callable(initial_lr) and multiplier is None:
                initial_lr, multiplier = None, initial_lr  # upstream BytePS's order
            if multiplier is None:
                raise InvalidArgumentError("LearningRateScheduleCallback: multiplier is required")
            self.initial_lr = initial_lr
            self.start_epoch = start_epoch
            self.end_epoch = end_epoch
            self.staircase = staircase
            self.momentum_correction = momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.restore_momentum = None
            self.current_epoch = None
            if not callable(multiplier):
                self.staircase = True
                constant = float(multiplier)
                self.multiplier = lambda epoch: constant
            else:
                self.multiplier = multiplier

        def _autodetect_steps_per_epoch(self) -> int:
            steps = (self.params or {}).get("steps")
            if steps:
                return int(steps)
            raise InvalidArgumentError(
                f"{type(self).__name__}: could not detect the number of steps "
                "per epoch; pass steps_per_epoch")

        def _adjust_learning_rate(self, epoch: float) -> None:
            opt = self.model.optimizer
            old_lr = _get_lr(opt)
            new_lr = self.initial_lr * self.multiplier(epoch)
            _set_lr(opt, new_lr)
            if self.momentum_correction and hasattr(opt, "momentum") and old_lr != 0:
                self.restore_momentum = float(opt.momentum)
                _set_momentum(opt, self.restore_momentum * new_lr / old_lr)

        def _restore_momentum_if_needed(self) -> None:
            if self.restore_momentum is not None:
                _set_momentum(self.model.optimizer, self.restore_momentum)
                self.restore_momentum = None

        def on_train_begin(self, logs=None):
            if self.initial_lr is None:
                self.initial_lr = _get_lr(self.model.optimizer)
            if not self.staircase and not self.steps_per_epoch:
                self.steps_per_epoch = self._autodetect_steps_per_epoch()

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_batch_begin(self, batch, logs=None):
            if self.current_epoch < self.start_epoch or (
                    self.end_epoch is not None and self.current_epoch >= self.end_epoch):
                return
            if self.staircase and batch == 0:
                self._adjust_learning_rate(self.current_epoch)
            elif not self.staircase:
                self._adjust_learning_rate(self.current_epoch
                                           + float(batch) / self.steps_per_epoch)

        def on_batch_end(self, batch, logs=None):
            self._restore_momentum_if_needed()

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Linear warm-up from ``initial_lr / size()`` to ``initial_lr`` over
        ``warmup_epochs`` (Goyal et al., 2017; Horovod semantics): at fractional epoch ``e``
        (advanced by one batch, so the last batch of the warm-up reaches ``initial_lr``) the
        rate is ``initial_lr / size * (e * (size - 1) / warmup_epochs + 1)``, adjusted every
        batch, with momentum correction.

        Args:
            initial_lr: the target rate (Horovod order: first; ``None`` reads the optimizer's
                rate at train begin, as upstream BytePS).
            warmup_epochs: length of the warm-up (default 5).
            momentum_correction: see :class:`LearningRateScheduleCallback`.
            steps_per_epoch: batches per epoch; default from Keras' ``params["steps"]``.
            verbose: > 0 prints a line when the warm-up ends.

        Upstream BytePS's positional order (``warmup_epochs`` first) is ambiguous with
        Horovod's and is not supported; pass its arguments by keyword.
        """

        def __init__(self, initial_lr=None, warmup_epochs: int = 5,
                     momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                     verbose: int = 0):
            def multiplier(epoch):
                epoch += 1.0 / self.steps_per_epoch
                n = ops.size()
                return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                             staircase=False, momentum_correction=momentum_correction,
                             steps_per_epoch=steps_per_epoch)
            self.warmup_epochs = warmup_epochs
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{_get_lr(self.model.optimizer):g}.")

    return (BroadcastGlobalVariablesCallback, MetricAverageCallback,
            LearningRateScheduleCallback, LearningRateWarmupCallback)
