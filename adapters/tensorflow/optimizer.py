"""``byteps.tensorflow.DistributedOptimizer`` (upstream ``byteps/tensorflow/__init__.py``):
a Keras 3 optimizer becomes the Keras distributed optimizer (:mod:`byteps.tensorflow._keras`);
a legacy ``tf.compat.v1.train.Optimizer`` is wrapped so that ``compute_gradients`` averages
the gradients across workers. In asynchronous training (``BYTEPS_ENABLE_ASYNC=1``) gradients
are not reduced: each update is applied locally and its delta exchanged for the servers'
parameters (:mod:`byteps.tensorflow._async`)."""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.sync import async_train

from . import _async, ops
from . import _compress_plan as cplan
from .compression import Compression

__all__ = ["DistributedOptimizer"]


class _LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a ``tf.compat.v1.train.Optimizer``: ``compute_gradients`` push_pulls every
    gradient (one operation, priority by variable index) under
    ``"Distributed<Opt>_Push_Pull/Gradient.<i>.<variable name>"``; ``apply_gradients``,
    ``get_slot``, ``get_slot_names`` and ``variables`` are delegated."""

    def __init__(self, optimizer, name, use_locking, compression, average,
                 compression_params=None):
        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        compression = cplan.resolve_intra(compression, compression_params)
        momentum = getattr(optimizer, "_momentum", None)
        mu = None
        if cplan.needs_optimizer_mu(compression_params) and isinstance(momentum, (int, float)):
            mu = float(momentum) or None
        plan = cplan.make_plan(compression_params, mu)
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._bps_scope = f"{name}_Push_Pull"
        self._bps_compression = compression
        self._bps_average = average
        self._bps_plan = plan
        if plan is not None and plan.mu is not None and momentum:
            # the core's Nesterov momentum replaces the optimizer's (MomentumOptimizer reads
            # _momentum when it builds its update)
            cplan.warn_momentum_moved(momentum, plan.mu)
            optimizer._momentum = 0.0
            if getattr(optimizer, "_use_nesterov", False):
                optimizer._use_nesterov = False

    def _bps_learning_rate(self):
        if self._bps_plan is None:
            return None
        lr = getattr(self._optimizer, "_learning_rate", None)
        if callable(lr):
            lr = lr()
        return lr

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``(gradient, variable)`` pairs with averaged gradients
        (``tf.IndexedSlices`` densified; a ``None`` gradient contributes zeros and is replaced
        by the reduced tensor, see :func:`byteps.tensorflow.ops.push_pull_gradients`)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if async_train.enabled():
            return pairs  # asynchronous training: the gradients stay local
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        names = [f"{self._bps_scope}/Gradient.{i}."
                 f"{ops._normalize_name(ops._label(v) or 'variable')}"
                 for i, v in enumerate(variables)]
        reduced = ops.push_pull_gradients(grads, names, self._bps_average,
                                          self._bps_compression, "DistributedOptimizer",
                                          variables=variables, plan=self._bps_plan,
                                          lr=self._bps_learning_rate())
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Delegated to the wrapped optimizer. In asynchronous training
        (``BYTEPS_ENABLE_ASYNC=1``; eagerly or inside ``tf.function``): applied locally, then
        every variable's delta is exchanged for the servers' value (the variables' first
        update starts from the servers' initial value, rank 0's)."""
        if not async_train.enabled():
            return self._optimizer.apply_gradients(grads_and_vars, *args, **kwargs)
        if self._bps_plan is not None or self._bps_compression is not Compression.none:
            raise InvalidArgumentError(
                "DistributedOptimizer in asynchronous training (BYTEPS_ENABLE_ASYNC=1) pushes "
                "parameter deltas uncompressed: compression and compression_params are not "
                "supported")
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        names = _async.async_names(self._bps_scope, variables)
        return _async.async_update(
            variables, names, lambda: self._optimizer.apply_gradients(pairs, *args, **kwargs))

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
                         backward_passes_per_step: int = 1, op: str = ops.Average,
                         compression_params=None):
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
        compression_params: gradient compression by the core, upstream's MXNet dict (see
            :func:`byteps.sync.compression.compression_kwargs`; default None: none): every
            float16/32/64 gradient is declared with it, and in a distributed job the core
            compresses those of at least ``BYTEPS_MIN_COMPRESS_BYTES`` bytes, so a step
            applies ``C(sum_i C(g_i / size))``. The optimizer's learning rate reaches the core
            before each step's push_pulls (error feedback). ``"momentum": "nesterov"`` takes mu
            from ``momentum_mu`` or the optimizer's momentum and sets the optimizer's momentum
            to 0 (warning). Keras optimizers: see
            :func:`byteps.tensorflow._keras.create_distributed_optimizer`. Legacy optimizers:
            the learning rate is ``_learning_rate`` (a number, tensor or callable), the
            momentum ``_momentum`` (``MomentumOptimizer``; ``use_nesterov`` turned off).

    Raises:
        InvalidTypeError (a TypeError): neither a Keras 3 nor a ``tf.compat.v1.train.Optimizer``
            (e.g. a ``tf_keras`` optimizer).
        InvalidArgumentError (a ValueError): ``op=Adasum`` or unknown; bad
            ``backward_passes_per_step``; an invalid ``compression_params``.
    """
    average = ops._resolve_op(op, None, "DistributedOptimizer")
    keras = _keras_module_of(optimizer)
    if keras is not None:
        from . import _keras
        return _keras.create_distributed_optimizer(
            keras, optimizer, name=name, compression=compression,
            sparse_as_dense=sparse_as_dense, backward_passes_per_step=backward_passes_per_step,
            op=op, compression_params=compression_params)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise InvalidArgumentError("DistributedOptimizer: backward_passes_per_step > 1 is not "
                                       "supported for tf.compat.v1.train optimizers (as upstream)")
        return _LegacyDistributedOptimizer(optimizer, name, use_locking, compression, average,
                                           compression_params)
    raise InvalidTypeError(
        "DistributedOptimizer: expected a Keras 3 optimizer (keras.optimizers.Optimizer) or a "
        f"tf.compat.v1.train.Optimizer, got {type(optimizer).__module__}."
        f"{type(optimizer).__name__}")
