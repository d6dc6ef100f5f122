"""Asynchronous training for TensorFlow and Keras (``BYTEPS_ENABLE_ASYNC=1``; docs/async.md):
what the distributed optimizers' ``apply`` / ``apply_gradients`` do in asynchronous mode, and
:func:`pull_parameters`.

An update: the variables' first update (in this process) reads their initial value from the
servers (rank 0's, pushed by this very update on rank 0); then the wrapped optimizer applies the
local gradients, each variable's delta (after minus before) is push_pulled (summed, under
``"AsyncParam.<scope>/Param.<i>.<variable>"``) and the servers' answer, the parameters' current
value, is assigned to the variable. Nothing waits for the other workers. Eagerly the exchanges
run at once; inside ``tf.function`` each is one ``tf.numpy_function`` (ordered after the
assignments before it by TensorFlow's automatic control dependencies), so whether a variable's
exchange is its first is decided when the step runs.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np

import tensorflow as tf
from byteps.sync import async_train

from . import ops

__all__ = ["async_names", "async_update", "pull_parameters"]


def async_names(scope: str, variables: Sequence) -> List[str]:
    """The asynchronous parameters' names of ``variables`` (index and label, under ``scope``),
    declared now, in order (the same on every rank)."""
    names = []
    for i, v in enumerate(variables):
        label = ops._normalize_name(ops._label(v) or "variable")
        names.append(async_train.wire_name(f"{scope}/Param.{i}.{label}"))
    for n in names:
        ops.declare(n)
    return names


def _exchange(arrays, names: Sequence[str], initial: bool) -> List[np.ndarray]:
    """NumPy side. ``initial``: the servers' value of every name whose first push_pull this is
    (local rank 0 offers its array, the others zeros); the others are returned unchanged.
    Otherwise every array is a delta, summed into the servers' value, which is returned."""
    arrays = [np.asarray(a) for a in arrays]
    idx = [i for i, n in enumerate(names)
           if not initial or async_train.pushes_initial_value(n)]
    if not idx:
        return arrays
    zero = initial and not async_train.contributes_initial_value()
    sel = [names[i] for i in idx]
    res = ops._run([arrays[i] for i in idx], sel, sel,
                   [ops._DTYPE_NAMES[tf.as_dtype(arrays[i].dtype)] for i in idx], False,
                   [-(i + 1) for i in idx], [zero] * len(idx))
    out = list(arrays)
    for i, r in zip(idx, res):
        out[i] = r
    return out


def _call(tensors: List[tf.Tensor], names: Sequence[str], initial: bool) -> List[tf.Tensor]:
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(o) for o in
                _exchange([t.numpy() for t in tensors], names, initial)]
    outs = tf.numpy_function(lambda *a: _exchange(a, names, initial), tensors,
                             [t.dtype for t in tensors], stateful=True,
                             name="BytePSAsyncExchange")
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return list(outs)


def _values(variables) -> List[tf.Tensor]:
    return [tf.identity(tf.convert_to_tensor(v)) for v in variables]


def _assign(variables, values) -> None:
    for v, x in zip(variables, values):
        v.assign(tf.cast(x, v.dtype))


@tf.autograph.experimental.do_not_convert
def async_update(variables: Sequence, names: Sequence[str], apply: Callable[[], object]):
    """One asynchronous update of ``variables`` around ``apply`` (the wrapped optimizer's own
    update); returns what ``apply`` returns."""
    variables = list(variables)
    _assign(variables, _call(_values(variables), names, initial=True))
    before = _values(variables)
    result = apply()
    deltas = [tf.convert_to_tensor(v) - b for v, b in zip(variables, before)]
    _assign(variables, _call(deltas, names, initial=False))
    return result


def keras_apply(opt, base: type, grads, trainable_variables):
    """The Keras distributed optimizer's ``apply`` in asynchronous mode: the base class's
    ``apply`` (local gradients) inside :func:`async_update`.

    Raises:
        InvalidArgumentError: gradient compression or ``backward_passes_per_step > 1`` (deltas
            are pushed uncompressed, every step); ``grads`` without variables before the
            optimizer is built.
    """
    from byteps.errors import InvalidArgumentError

    from .compression import Compression

    if opt._bps_plan is not None or opt._bps_compression is not Compression.none \
            or opt._bps_passes > 1:
        raise InvalidArgumentError(
            "DistributedOptimizer in asynchronous training (BYTEPS_ENABLE_ASYNC=1) pushes "
            "parameter deltas uncompressed after every step: compression, compression_params "
            "and backward_passes_per_step > 1 are not supported")
    if trainable_variables is not None:
        variables = list(trainable_variables)
    elif opt.built:
        variables = list(opt._trainable_variables)
    else:
        raise InvalidArgumentError("When passing `grads` without `variables`, the optimizer "
                                   "must already be built on a list of variables.")
    names = async_names(opt._bps_scope, variables)
    return async_update(variables, names, lambda: base.apply(opt, grads, trainable_variables))


def pull_parameters(optimizer_or_variables, variables=None, scope: str = "") -> None:
    """Read the servers' parameters into variables (asynchronous training,
    ``BYTEPS_ENABLE_ASYNC=1``), e.g. before a checkpoint or at the end of training.

    Args:
        optimizer_or_variables: a distributed Keras optimizer in asynchronous mode (its
            trainable variables, or ``variables`` if given, under its names), or a list of
            variables (then ``scope`` must be the optimizer's scope, default
            ``"Distributed<OptimizerClass>_Push_Pull"``).
        variables: with an optimizer: the variables it updates, in the order it was given
            them (default: those it was built with).
        scope: with a list of variables: the optimizer's name scope.

    A name's first push_pull in this process offers the variable's value as the initial one
    (rank 0's is kept). Each call counts as one round of this worker for the staleness bound.
    Eager only.

    Raises:
        UsageError: not in asynchronous mode.
        InvalidArgumentError: an optimizer that was never built and no ``variables``.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    from byteps.errors import InvalidArgumentError

    async_train.require("pull_parameters")
    opt_scope = getattr(optimizer_or_variables, "_bps_scope", None)
    if opt_scope is not None:
        if variables is None:
            if not getattr(optimizer_or_variables, "built", False):
                raise InvalidArgumentError("pull_parameters: the optimizer was never built; "
                                           "pass variables=model.trainable_variables")
            variables = optimizer_or_variables._trainable_variables
        scope = opt_scope
    else:
        variables = optimizer_or_variables
    variables = list(variables)
    names = async_names(scope, variables)
    first = [async_train.pushes_initial_value(n) for n in names]
    values = _exchange([v.numpy() for v in variables], names, initial=True)
    rest = [i for i, f in enumerate(first) if not f]
    if rest:  # not their first: a zero delta reads the current value
        zeros = [np.zeros_like(values[i]) for i in rest]
        got = _exchange(zeros, [names[i] for i in rest], initial=False)
        for i, g in zip(rest, got):
            values[i] = g
    _assign(variables, values)
