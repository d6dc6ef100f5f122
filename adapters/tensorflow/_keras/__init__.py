"""Shared Keras 3 implementation behind ``byteps.tensorflow.keras`` and ``byteps.keras``
(upstream ``byteps/_keras/__init__.py``; Horovod's Keras 3 semantics).

Every function takes the ``keras`` module of its front (``tf.keras`` or the ``keras``
package); with TensorFlow >= 2.16 both are Keras 3 on the TensorFlow backend.

How the distributed optimizer works: Keras 3's TensorFlow trainer calls
``optimizer.apply_gradients(zip(grads, vars))`` inside its compiled train function, which calls
``optimizer.apply(grads, vars)``. The distributed optimizer is a dynamic subclass of the
optimizer's class whose ``apply`` first push_pulls every gradient (one ``tf.numpy_function``
for all of them) and then runs the original ``apply`` (loss-scale, clipping, weight decay,
update), so clipping sees averaged gradients, as with Horovod. In asynchronous training
(``BYTEPS_ENABLE_ASYNC=1``) ``apply`` reduces nothing: :mod:`byteps.tensorflow._async`. A gradient that is ``None``
(the variable took no part in this rank's forward pass) is pushed as zeros and the reduced
tensor is applied on every rank, so the ranks agree on the names and keep identical weights
(upstream/Horovod skip such gradients and hang when the ranks disagree). With
``backward_passes_per_step = N > 1`` the gradients are summed locally in optimizer variables
and communicated and applied on every N-th call only (see :func:`_apply_aggregated`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

import tensorflow as tf
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.sync import async_train

from .. import _async, functions, ops
from .. import _compress_plan as cplan
from ..compression import Compression

__all__ = [
    "create_distributed_optimizer",
    "broadcast_global_variables",
    "push_pull",
    "broadcast",
    "load_model",
    "is_distributed",
]

_BY_BASE: Dict[type, type] = {}


class _Momentum:
    """A momentum hyper-parameter that can change inside a compiled train function.

    Keras 3 optimizers keep ``momentum`` as a Python float that is baked into the traced
    ``update_step``; this object behaves as that float in Python comparisons (``!= 0``,
    ``> 0``) but converts to a tensor by reading a variable, so :meth:`assign` (used by the
    learning-rate callbacks' momentum correction) takes effect in the next step."""

    def __init__(self, value: float):
        self._value = float(value)
        self._var = tf.Variable(self._value, trainable=False, dtype=tf.float32,
                                name="bps_momentum")

    def assign(self, value: float) -> None:
        self._value = float(value)
        self._var.assign(self._value)

    def __float__(self) -> float:
        return self._value

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.convert_to_tensor(self._var.value(), dtype=dtype, name=name)

    def __eq__(self, other):
        return self._value == other

    def __ne__(self, other):
        return self._value != other

    def __lt__(self, other):
        return self._value < other

    def __le__(self, other):
        return self._value <= other

    def __gt__(self, other):
        return self._value > other

    def __ge__(self, other):
        return self._value >= other

    def __mul__(self, other):
        return self._value * other

    __rmul__ = __mul__

    def __hash__(self):
        return hash(self._value)

    def __repr__(self):
        return repr(self._value)


def _distributed_class(base: type) -> type:
    """The dynamic subclass of optimizer class ``base`` (cached, so pickling/isinstance of
    two distributed SGDs agree). Per-instance settings live in ``_bps_*`` attributes."""
    cls = _BY_BASE.get(base)
    if cls is not None:
        return cls

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        _setup(self, _PENDING.get("settings") or _default_settings(base))

    def build(self, variables):
        base.build(self, variables)
        if self._bps_passes > 1:
            # Created after the base class's variables, so those keep their positions in
            # ``optimizer.variables`` (state copy in create_distributed_optimizer).
            with tf.init_scope():
                self._bps_accumulators = [
                    self.add_variable_from_reference(v, name="bps_grad_accumulator")
                    for v in variables]
                self._bps_counter = self.add_variable(
                    shape=(), initializer="zeros", dtype="int64",
                    name="bps_backward_passes")

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if async_train.enabled():  # docs/async.md: local update, then the delta exchange
            return _async.keras_apply(self, base, grads, trainable_variables)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
        elif self.built:
            variables = list(self._trainable_variables)
        else:
            variables = [None] * len(grads)
        names = [f"{self._bps_scope}/Gradient.{i}."
                 f"{ops._normalize_name(ops._label(v) or 'variable')}"
                 for i, v in enumerate(variables)]
        if self._bps_passes == 1 or not grads:
            grads = ops.push_pull_gradients(grads, names, self._bps_average,
                                            self._bps_compression, "DistributedOptimizer",
                                            variables=variables, plan=self._bps_plan,
                                            lr=_learning_rate(self))
            return base.apply(self, grads, trainable_variables)
        return _apply_aggregated(self, base, grads, trainable_variables, names)

    def get_config(self):
        config = base.get_config(self)
        if isinstance(config.get("momentum"), _Momentum):
            config["momentum"] = float(config["momentum"])
        return config

    cls = type(base.__name__, (base,), {
        "__init__": __init__,
        "build": build,
        "apply": apply,
        "get_config": get_config,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_bps_distributed": True,
        "_bps_base_class": base,
    })
    _BY_BASE[base] = cls
    return cls


def _apply_aggregated(opt, base: type, grads: list, trainable_variables, names: list):
    """``apply`` with ``backward_passes_per_step = N > 1`` (Horovod's local gradient
    aggregation, done with Keras optimizer variables): add the gradients to per-variable
    accumulators; on every N-th call push_pull the sums (one operation) and apply them through
    the base class's ``apply`` (which increments ``iterations``), then zero the accumulators.
    The other calls apply nothing. The choice is a ``tf.cond`` on a counter variable, so this
    works eagerly and inside the compiled train function."""
    if trainable_variables is None:
        if not opt.built:
            raise InvalidArgumentError(
                "When passing `grads` without `variables`, the optimizer must "
                "already be built on a list of variables.")
        variables = list(opt._trainable_variables)
    else:
        variables = list(trainable_variables)
        if not opt.built:
            with tf.name_scope(opt.name):
                opt.build(variables)
            opt.built = True
    if len(grads) != len(variables):
        raise InvalidArgumentError(f"DistributedOptimizer: {len(grads)} gradients for "
                                   f"{len(variables)} variables")
    accs = [opt._bps_accumulators[opt._get_variable_index(v)] for v in variables]
    for g, acc in zip(grads, accs):
        if g is not None:  # no gradient on this rank: adds nothing, the sum is still pushed
            acc.assign_add(tf.cast(ops._as_dense(g, "DistributedOptimizer"), acc.dtype))
    count = opt._bps_counter.assign_add(1)
    if not tf.is_tensor(count):
        count = tf.convert_to_tensor(opt._bps_counter)
    passes = opt._bps_passes

    def communicate_and_apply():
        sums = [tf.convert_to_tensor(acc) for acc in accs]
        reduced = ops.push_pull_gradients(sums, names, opt._bps_average, opt._bps_compression,
                                          "DistributedOptimizer", plan=opt._bps_plan,
                                          lr=_learning_rate(opt))
        base.apply(opt, reduced, variables)
        for acc in accs:
            acc.assign(tf.zeros_like(acc))
        return tf.constant(True)

    return tf.cond(tf.equal(count % passes, 0), communicate_and_apply,
                   lambda: tf.constant(False))


def _learning_rate(opt):
    """The optimizer's current learning rate (a variable, or a tensor for a schedule) when
    the core needs it (error feedback), else None."""
    return opt.learning_rate if opt._bps_plan is not None else None


_PENDING: Dict[str, Any] = {}


def _default_settings(base: type) -> dict:
    return dict(scope=f"Distributed{base.__name__}_Push_Pull", compression=Compression.none,
                average=True, sparse_as_dense=False, backward_passes_per_step=1, plan=None)


def _setup(opt, settings: dict) -> None:
    opt._bps_scope = settings["scope"]
    opt._bps_compression = settings["compression"]
    opt._bps_plan = settings.get("plan")
    opt._bps_average = settings["average"]
    opt._bps_sparse_as_dense = settings["sparse_as_dense"]
    opt._bps_passes = int(settings.get("backward_passes_per_step", 1))
    opt._bps_accumulators = []
    opt._bps_counter = None
    momentum = getattr(opt, "momentum", None)
    if isinstance(momentum, float) and not isinstance(momentum, bool):
        opt.momentum = _Momentum(momentum)


def is_distributed(optimizer: Any) -> bool:
    """True if ``optimizer`` was made by :func:`create_distributed_optimizer`."""
    return bool(getattr(type(optimizer), "_bps_distributed", False))


def create_distributed_optimizer(keras, optimizer, name: Optional[str] = None,
                                 compression=Compression.none, sparse_as_dense: bool = False,
                                 backward_passes_per_step: int = 1, op: str = ops.Average,
                                 compression_params=None):
    """Return a distributed copy of the Keras 3 ``optimizer``: same class (a dynamic subclass
    with the same name), same config, same state (slot variables, iterations, learning rate
    are copied if ``optimizer`` was already built), gradients averaged across workers.

    Args:
        keras: the front's Keras module (``tf.keras`` or ``keras``).
        optimizer: a ``keras.optimizers.Optimizer`` instance (not already distributed).
        name: scope of the gradient names (default ``"Distributed<Class>_Push_Pull"``);
            gradient ``i`` is ``"<scope>/Gradient.<i>.<variable path>"``.
        compression: :class:`Compression` member applied to every gradient.
        sparse_as_dense: accepted for compatibility: ``tf.IndexedSlices`` gradients (e.g. of
            an Embedding layer) are always densified before the reduction (Horovod did so only
            with ``True``; the core reduces dense tensors only).
        backward_passes_per_step: ``N > 1``: local gradient aggregation (as the torch
            adapter and Horovod): each ``apply``/``apply_gradients`` call adds its gradients
            to per-variable accumulators (optimizer variables ``bps_grad_accumulator``, plus
            an int64 counter ``bps_backward_passes``, created in ``build`` after the base
            class's variables); every N-th call push_pulls the SUMS (one communication per N
            passes, averaged across workers with ``op=Average``, never divided by N) and
            applies them through the base optimizer; the other calls apply nothing (a
            ``tf.cond``, so it works in ``model.fit``'s compiled train function).
            ``iterations`` counts applied updates (as Keras' own gradient accumulation and a
            single-process run doing the same accumulation; Horovod counts every call). Not
            combinable with the optimizer's own ``gradient_accumulation_steps`` (which
            averages, and would communicate every call). A model saved with such an
            optimizer is not restored by :func:`load_model` (it rebuilds ``N = 1``).
        op: ``Average`` (default) or ``Sum``.
        compression_params: gradient compression by the core, upstream's MXNet dict (keys
            ``compressor``, ``ef``, ``momentum``, ``momentum_mu``, ``scaling``, ``k``,
            ``seed``, ``partition``, ``normalize``, ``fp16``; see
            :func:`byteps.sync.compression.compression_kwargs`), e.g. ``{"compressor": "onebit",
            "ef": "vanilla"}``. Default None: none. Every float16/32/64 gradient is declared
            with it; in a distributed job the core compresses those of at least
            ``BYTEPS_MIN_COMPRESS_BYTES`` bytes and a step applies ``C(sum_i C(g_i / size))``
            (each worker compresses its share of the average, the server the sum). Every rank
            must pass the same dict (else ``MismatchError`` on every rank at the first step).
            ``"fp16": True`` selects ``Compression.fp16`` as well. The optimizer's
            ``learning_rate`` (its variable, or the schedule's value at ``iterations``) is read
            when each step's reduction runs and handed to the core first (error feedback's
            previous_lr / lr correction), inside ``model.fit`` too. ``"momentum":
            "nesterov"``: mu from ``momentum_mu`` or else the optimizer's ``momentum`` config;
            the distributed copy is made with ``momentum=0`` (and ``nesterov=False``; a
            warning says so) and Nesterov momentum is applied to each gradient instead: by the
            core before compressing, or here after the reduction for gradients the core does
            not compress (upstream MXNet's ``Compression.nag``). Weight decay stays in the
            optimizer (without momentum).

    Momentum: a float ``momentum`` hyper-parameter (SGD, RMSprop) becomes an object that acts
    as that float but reads a variable in the compiled update, so the callbacks' momentum
    correction takes effect inside ``model.fit``; ``get_config`` still returns a float.
    Compile models with ``jit_compile=False`` on GPU machines (push_pull runs through
    ``tf.numpy_function``, which XLA cannot compile; CPU-only Keras never uses XLA by default).

    Raises:
        InvalidTypeError (a TypeError): not a Keras 3 optimizer (a legacy ``tf_keras``/TF1
            optimizer, ...).
        InvalidArgumentError (a ValueError): already distributed; ``op=Adasum``/unknown op; bad
            ``backward_passes_per_step``, or ``> 1`` with the optimizer's own
            ``gradient_accumulation_steps`` set; an invalid ``compression_params``.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise InvalidTypeError("DistributedOptimizer: expected a Keras 3 optimizer "
                               f"(keras.optimizers.Optimizer), got {type(optimizer).__module__}."
                               f"{type(optimizer).__name__}")
    if is_distributed(optimizer):
        raise InvalidArgumentError("DistributedOptimizer: the optimizer is already distributed")
    average = ops._resolve_op(op, None, "DistributedOptimizer")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step,
                                                                    int) \
            or backward_passes_per_step < 1:
        raise InvalidArgumentError(
            "DistributedOptimizer: backward_passes_per_step must be an int >= 1, "
            f"got {backward_passes_per_step!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidArgumentError(
            f"DistributedOptimizer: name must be a non-empty str, got {name!r}")
    base = type(optimizer)
    config = optimizer.get_config()
    if backward_passes_per_step > 1 and config.get("gradient_accumulation_steps"):
        raise InvalidArgumentError(
            f"DistributedOptimizer: backward_passes_per_step={backward_passes_per_step} "
            "cannot be combined with the optimizer's own gradient_accumulation_steps="
            f"{config['gradient_accumulation_steps']} (use one of them)")
    compression = cplan.resolve_intra(compression, compression_params)
    momentum = config.get("momentum")
    mu = None
    if cplan.needs_optimizer_mu(compression_params) and isinstance(momentum, (int, float)):
        mu = float(momentum) or None
    plan = cplan.make_plan(compression_params, mu)
    if plan is not None and plan.mu is not None and momentum:
        cplan.warn_momentum_moved(momentum, plan.mu)
        config["momentum"] = 0.0
        if config.get("nesterov"):
            config["nesterov"] = False
    settings = dict(scope=name or f"Distributed{base.__name__}_Push_Pull",
                    compression=compression, average=average,
                    sparse_as_dense=bool(sparse_as_dense),
                    backward_passes_per_step=backward_passes_per_step, plan=plan)
    cls = _distributed_class(base)
    _PENDING["settings"] = settings
    try:
        new = cls.from_config(config)
    finally:
        _PENDING.clear()
    if optimizer.built:
        new.build(list(optimizer._trainable_variables))
        old_vars, new_vars = list(optimizer.variables), list(new.variables)
        # the accumulators of backward_passes_per_step > 1 come after the base variables
        if len(new_vars) >= len(old_vars) and all(
                tuple(d.shape) == tuple(s.shape) for d, s in zip(new_vars, old_vars)):
            for dst, src in zip(new_vars, old_vars):
                dst.assign(src)
    return new


# --------------------------------------------------------------------------------------------
# helpers of the Keras fronts
# --------------------------------------------------------------------------------------------
def _optimizer_variables(optimizer) -> list:
    if optimizer is None:
        return []
    v = getattr(optimizer, "variables", [])
    return list(v() if callable(v) else v)


def broadcast_global_variables(model_or_variables, root_rank: int = 0) -> None:
    """Assign ``root_rank``'s values to a model's variables and its optimizer's variables (or
    to a list of variables) on every rank.

    Keras 3 has no global-variable collection (upstream broadcast TF1 global variables), so
    pass the model (its ``variables`` under ``"Model/"``, then its optimizer's ``variables``
    under ``"Optimizer/"``) or the variables.

    Raises:
        InvalidTypeError (a TypeError): ``model_or_variables`` is a rank (upstream's signature) or
            holds non-variables.
        InvalidArgumentError (a ValueError): bad ``root_rank``.
    """
    if isinstance(model_or_variables, (int, np.integer)):
        raise InvalidTypeError("broadcast_global_variables(model_or_variables, root_rank): Keras 3 "
                               "has no global variables; pass the model (or a list of variables)")
    if hasattr(model_or_variables, "variables") and hasattr(model_or_variables, "layers"):
        model = model_or_variables
        functions.broadcast_variables(model.variables, root_rank, scope="Model/")
        opt_vars = _optimizer_variables(getattr(model, "optimizer", None))
        if opt_vars:
            functions.broadcast_variables(opt_vars, root_rank, scope="Optimizer/")
        return None
    functions.broadcast_variables(list(model_or_variables), root_rank, scope="Variables/")
    return None


def _to_tensor(value, fn: str):
    """``value`` as a tensor (``tf.constant`` for NumPy arrays, numbers and nested lists).

    Raises:
        InvalidTypeError (a TypeError): TensorFlow cannot convert ``value``.
    """
    if tf.is_tensor(value):
        return value
    try:
        return tf.constant(value)
    except (TypeError, ValueError) as e:
        raise InvalidTypeError(f"{fn}: cannot make a tensor of a {type(value).__name__} "
                               f"({e})") from e


def push_pull(value, name: Optional[str] = None, average: bool = True) -> np.ndarray:
    """Average (or sum) a value (tensor, NumPy array, Python number or nested list of numbers)
    across workers and return it as a NumPy array (as upstream's ``_keras.push_pull``, which
    evaluated the result). Python floats become float32 tensors, ints int32.

    Args:
        name: the same on every rank; default ``"KerasPushPull"`` (one name per dtype/shape;
            calls are synchronous).

    Raises:
        InvalidTypeError (a TypeError): unsupported dtype (bool, string...), or a value
            TensorFlow cannot make a tensor of.
    """
    tensor = _to_tensor(value, "push_pull")
    out = functions.push_pull(tensor, average=bool(average), name=name or "KerasPushPull")
    return out.numpy()


def broadcast(value, root_rank: int, name: Optional[str] = None) -> np.ndarray:
    """``root_rank``'s ``value`` on every rank, as a NumPy array (see :func:`push_pull` for
    accepted values; default name ``"KerasBroadcast"``).

    Raises:
        InvalidTypeError (a TypeError): unsupported dtype, or a value TensorFlow cannot make a
            tensor of.
        InvalidArgumentError (a ValueError): bad ``root_rank``.
    """
    tensor = _to_tensor(value, "broadcast")
    out = functions.broadcast(tensor, root_rank, name=name or "KerasBroadcast")
    return out.numpy()


#: Keras optimizers that wrap other optimizers (not distributed by class in load_model).
_WRAPPER_OPTIMIZERS = ("LossScaleOptimizer", "MultiOptimizer", "OptimizerMap")


def _builtin_optimizer_classes(keras) -> list:
    out = []
    base = keras.optimizers.Optimizer
    for obj in vars(keras.optimizers).values():
        if isinstance(obj, type) and issubclass(obj, base) and obj is not base \
                and obj.__name__ not in _WRAPPER_OPTIMIZERS:
            out.append(obj)
    return out


def load_model(keras, filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Load a saved Keras model whose optimizer comes back distributed.

    Every built-in optimizer class (and every class in ``custom_optimizers``) is mapped, for
    deserialisation, to its distributed subclass, so the saved optimizer state is restored
    into the distributed optimizer. If the model's optimizer is still not distributed (e.g. a
    registered custom class), it is wrapped with :func:`create_distributed_optimizer`, keeping
    its state.

    Args:
        keras: the front's Keras module.
        filepath: a ``.keras`` file (or anything ``keras.models.load_model`` accepts).
        custom_optimizers: optimizer classes to distribute besides the built-in ones.
        custom_objects: passed on to ``keras.models.load_model``.
        compression: compression of the distributed optimizer.

    Raises:
        whatever ``keras.models.load_model`` raises (missing file, unknown objects...).
    """
    objects = {}
    for klass in _builtin_optimizer_classes(keras) + list(custom_optimizers or []):
        objects[klass.__name__] = _distributed_class(klass)
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return model
    if is_distributed(opt):
        opt._bps_compression = compression
    else:
        model.optimizer = create_distributed_optimizer(keras, opt, compression=compression)
    return model
