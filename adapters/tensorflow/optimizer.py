"""``byteps.tensorflow.DistributedOptimizer`` (upstream ``byteps/tensorflow/__init__.py``):
a Keras 3 optimizer becomes the Keras distributed optimizer (:mod:`byteps.tensorflow._keras`);
a legacy ``tf.compat.v1.train.Optimizer`` is wrapped so that ``compute_gradients`` averages
the gradients across workers."""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
from byteps.errors import InvalidArgumentError, InvalidTypeError

from . import ops
from .compression import Compression

__all__ = ["DistributedOptimizer"]


class _LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a ``tf.compat.v1.train.Optimizer``: ``compute_gradients`` push_pulls every
    gradient (one operation, priority by variable index) under
    ``"Distributed<Opt>_Push_Pull/Gradient.<i>.<variable name>"``; ``apply_gradients``,
    ``get_slot``, ``get_slot_names`` and ``variables`` are delegated."""

    def __init__(self, optimizer, name, use_locking, compression, average):
        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._bps_scope = f"{name}_Push_Pull"
        self._bps_compression = compression
        self._bps_average = average

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``(gradient, variable)`` pairs with averaged gradients
        (``tf.IndexedSlices`` densified; a ``None`` gradient contributes zeros and is replaced
        by the reduced tensor, see :func:`byteps.tensorflow.ops.push_pull_gradients`)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        names = [f"{self._bps_scope}/Gradient.{i}."
                 f"{ops._normalize_name(ops._label(v) or 'variable')}"
                 for i, v in enumerate(variables)]
        reduced = ops.push_pull_gradients(grads, names, self._bps_average,
                                          self._bps_compression, "DistributedOptimizer",
                                          variables=variables)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        """Delegated to the wrapped optimizer."""
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        """Delegated to the wrapped optimizer."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """Delegated to the wrapped optimizer."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """Delegated to the wrapped optimizer."""
        return self._optimizer.variables(*args, **kwargs)


def _keras_module_of(optimizer) -> Optional[Any]:
    try:
        import keras
    except ImportError:  # pragma: no cover - TensorFlow >= 2.16 ships Keras 3
        return None
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return keras
    return None


def DistributedOptimizer(optimizer, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression=Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: str = ops.Average):
    """An optimizer that averages (or sums) gradients across workers before applying them.

    * A Keras 3 optimizer (``keras.optimizers.*`` / ``tf.keras.optimizers.*``) gives
      :func:`byteps.tensorflow.keras.DistributedOptimizer`'s result: a distributed copy of the
      same class, config and state, usable in ``model.compile`` / ``model.fit`` and with
      ``optimizer.apply_gradients`` in custom loops (see
      :func:`byteps.tensorflow._keras.create_distributed_optimizer`).
    * A ``tf.compat.v1.train.Optimizer`` is wrapped: ``compute_gradients`` (hence
      ``minimize``) returns averaged gradients; the rest is delegated.

    Args:
        optimizer: the optimizer to wrap.
        name: scope of the gradient names (default ``"Distributed<Class>_Push_Pull"``).
        use_locking: passed to the legacy wrapper's base class.
        device_dense, device_sparse: accepted for compatibility (host memory is used).
        compression: :class:`Compression` member applied to every gradient.
        sparse_as_dense: accepted for compatibility; ``tf.IndexedSlices`` gradients are
            always densified before the reduction (the core reduces dense tensors).
        backward_passes_per_step: Keras optimizers: the gradients of that many
            ``apply_gradients`` calls are summed locally and reduced and applied on every
            N-th call only (see ``create_distributed_optimizer``). Legacy optimizers: must be
            1 (as upstream).
        op: :data:`Average` (default) or :data:`Sum`; ``Adasum`` raises
            ``InvalidArgumentError`` (a ``ValueError``).

    Raises:
        InvalidTypeError (a TypeError): neither a Keras 3 nor a ``tf.compat.v1.train.Optimizer``
            (e.g. a ``tf_keras`` optimizer).
        InvalidArgumentError (a ValueError): ``op=Adasum`` or unknown; bad
            ``backward_passes_per_step``.
    """
    average = ops._resolve_op(op, None, "DistributedOptimizer")
    keras = _keras_module_of(optimizer)
    if keras is not None:
        from . import _keras
        return _keras.create_distributed_optimizer(
            keras, optimizer, name=name, compression=compression,
            sparse_as_dense=sparse_as_dense, backward_passes_per_step=backward_passes_per_step,
            op=op)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise InvalidArgumentError("DistributedOptimizer: backward_passes_per_step > 1 is not "
                                       "supported for tf.compat.v1.train optimizers (as upstream)")
        return _LegacyDistributedOptimizer(optimizer, name, use_locking, compression, average)
    raise InvalidTypeError(
        "DistributedOptimizer: expected a Keras 3 optimizer (keras.optimizers.Optimizer) or a "
        f"tf.compat.v1.train.Optimizer, got {type(optimizer).__module__}."
        f"{type(optimizer).__name__}")
