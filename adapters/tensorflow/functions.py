"""``push_pull``, ``broadcast`` and ``broadcast_variables`` for TensorFlow (upstream
``byteps/tensorflow/__init__.py``, Horovod semantics). See :mod:`byteps.tensorflow.ops` for
how tensors reach the core and how they are named. ``broadcast_object`` is the framework-free
:func:`byteps.naming.broadcast_object` (cloudpickle over NumPy push_pulls)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

import tensorflow as tf
from byteps import collectives
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import broadcast_object

from . import ops
from .compression import Compression

__all__ = ["push_pull", "allreduce", "broadcast", "broadcast_variables", "broadcast_object"]


def _base(tensor: Any, scope: str, name: Optional[str], prefix: str, fn: str) -> str:
    if not isinstance(scope, str):
        raise InvalidTypeError(f"{fn}: scope must be a str, got {type(scope).__name__}")
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{fn}: name must be a non-empty str or None, got {name!r}")
        return scope + name
    label = ops._label(tensor)
    if label is None:
        return scope + prefix + ".eager"
    return scope + prefix + "_" + ops._normalize_name(label)


@tf.autograph.experimental.do_not_convert
def push_pull(tensor, scope: str = "", average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op: Optional[str] = None,
              name: Optional[str] = None, process_set=None) -> tf.Tensor:
    """Sum or average ``tensor`` over all workers; returns a new tensor (the input is
    unchanged).

    Works eagerly and inside ``tf.function`` (one code path) and is differentiable: the
    gradient of the output is the push_pull (same op) of the incoming gradient, as upstream.

    Args:
        tensor: ``tf.Tensor``, ``tf.Variable`` (its value) or ``tf.IndexedSlices`` (densified;
            upstream did not handle them), any shape, dtype float16, bfloat16, float32,
            float64, int8, uint8, int32 or int64.
        scope: prefix of the tensor name (upstream used the current name scope).
        average: deprecated; ``True`` = Average, ``False`` = Sum. Use ``op``.
        device_dense, device_sparse: accepted for compatibility; tensors pass through host
            memory in this build.
        compression: :class:`Compression` member applied around the reduction.
        op: :data:`Average` (the default when neither ``op`` nor ``average`` is given),
            :data:`Sum`, :data:`Min`, :data:`Max` (elementwise; a NaN wins) or :data:`Product`
            (integers wrap; docs/collectives.md). Averaging of integer tensors is floor
            division. A name keeps its op.
        name: the name, the same on every rank (with ``scope`` prepended). Default: upstream's
            ``"BytePSPushPull_" + normalised tensor.name`` in graph mode, the variable's name
            for a variable, ``"BytePSPushPull.eager"`` for an eager tensor (eager calls are
            synchronous, so one name per dtype/shape is reused); with op Min, Max or Product
            the default ends in ``.min``, ``.max`` or ``.product`` (a name keeps its op).
        process_set: a registered ``ProcessSet`` (Horovod's; default: every rank): only its
            ranks call it, Average divides by its size (docs/collectives.md).

    Returns:
        a ``tf.Tensor`` with the input's shape and dtype.

    Raises:
        InvalidTypeError (a TypeError): not a tensor (e.g. a list or NumPy array), a
            ``tf.RaggedTensor`` or ``tf.SparseTensor``, or an unsupported dtype (bool, string,
            complex, int16...).
        InvalidArgumentError (a ValueError): both ``op`` and ``average`` given; ``op=Adasum`` or an
            unknown op.
        byteps.errors.NotInitializedError: before :func:`init`.
        byteps.errors.MismatchError: ranks disagree on the dtype or shape for this name.
    """
    core_op, avg = ops._resolve_reduce(op, average, "push_pull")
    base = _base(tensor, scope, name, "BytePSPushPull", "push_pull")
    if name is None and core_op != "sum":  # a name keeps its op: defaults differ per op
        base += "." + core_op
    dense = ops._as_dense(tensor, "push_pull")
    compressed, ctx = compression.compress(dense)
    out = ops._push_pull_one(compressed, base, avg, core_op, process_set)
    return compression.decompress(out, ctx)


def _scale(tensor, factor, what: str) -> Optional[float]:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise InvalidTypeError(f"allreduce: {what} must be a number, got {type(factor).__name__}")
    if float(factor) == 1.0:
        return None
    if not tf.as_dtype(tensor.dtype).is_floating:
        raise InvalidTypeError(f"allreduce: {what}={factor} needs a floating-point tensor, got "
                               f"{tensor.dtype.name}")
    return float(factor)


@tf.autograph.experimental.do_not_convert
def allreduce(tensor, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set=None) -> tf.Tensor:
    """Horovod's ``allreduce``: ``postscale_factor * reduce(prescale_factor * tensor)`` over
    all ranks, with :func:`push_pull`'s ops, naming and gradient (eager and in
    ``tf.function``). The factors are applied by TensorFlow around the push_pull (one pass
    each when not 1.0) and only to floating-point tensors.

    Args: as :func:`push_pull` (no ``scope``; ``process_set`` too), plus ``prescale_factor``
        and ``postscale_factor`` (numbers, default 1.0).

    Returns:
        a ``tf.Tensor`` with the input's shape and dtype.

    Raises:
        the errors of :func:`push_pull`; InvalidTypeError (a TypeError): a factor that is not a
        number, or not 1.0 on an integer tensor.
    """
    # the input's name, not the scaled tensor's; a name keeps its op, so defaults differ per op
    base = _base(tensor, "", name, "BytePSPushPull", "allreduce")
    core_op = ops._resolve_reduce(op, average, "allreduce")[0]
    if name is None and core_op != "sum":
        base += "." + core_op
    dense = ops._as_dense(tensor, "allreduce")
    pre = _scale(dense, prescale_factor, "prescale_factor")
    post = _scale(dense, postscale_factor, "postscale_factor")
    if pre is not None:
        dense = dense * tf.cast(pre, dense.dtype)
    out = push_pull(dense, "", average, device_dense, device_sparse, compression, op, base,
                    process_set)
    return out if post is None else out * tf.cast(post, out.dtype)


@tf.autograph.experimental.do_not_convert
def broadcast(tensor, root_rank: int, scope: str = "", name: Optional[str] = None,
              is_variable: bool = True, process_set=None) -> tf.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank (bit for bit).

    Horovod's broadcast over the worker mesh (``byteps.collectives.broadcast_start``: a chain
    from the root's machine, docs/collectives.md), eagerly or as one ``tf.numpy_function``.
    Differentiable: the gradient w.r.t. the root's input is the sum of the upstream gradients
    of all ranks, zero on the other ranks (upstream/Horovod).

    Args:
        tensor: as for :func:`push_pull` (same shape and dtype on every rank).
        root_rank: the rank whose value everyone receives, ``0 <= root_rank < size()``.
        scope: name prefix.
        name: the name, the same on every rank; default ``"BytePSBroadcast_" + normalised
            tensor name`` (``"BytePSBroadcast.eager"`` for eager tensors).
        is_variable: accepted for compatibility. Upstream zeroed a variable input in place on
            non-root ranks; here the input is never modified (assign the result yourself, or
            use :func:`broadcast_variables`).
        process_set: a registered ``ProcessSet`` (default: every rank); ``root_rank`` is one
            of its global ranks.

    Returns:
        a ``tf.Tensor`` with the input's shape and dtype.

    Raises:
        InvalidTypeError (a TypeError): as for :func:`push_pull`.
        InvalidArgumentError (a ValueError): bad ``root_rank``.
        byteps.errors.NotInitializedError: before :func:`init`.
    """
    base = _base(tensor, scope, name, "BytePSBroadcast", "broadcast")
    dense = ops._as_dense(tensor, "broadcast")
    root = ops._check_root(root_rank, "broadcast")
    return _mesh_broadcast(dense, base, root, process_set)


def _mesh_broadcast(x: tf.Tensor, base: str, root: int, process_set) -> tf.Tensor:
    def run(a):
        return collectives.broadcast_start(np.asarray(a), root, base,
                                           process_set=process_set).wait()

    def call(t):
        if tf.executing_eagerly():
            return tf.convert_to_tensor(run(t.numpy()))
        out = tf.numpy_function(run, [t], t.dtype, stateful=True, name="BytePSBroadcast")
        out.set_shape(t.shape)
        return out

    if not x.dtype.is_floating:
        return call(x)
    is_root = ops.rank() == root

    @tf.custom_gradient
    def _bc(v):
        def grad(dy):
            dy = ops._as_dense(dy, "broadcast gradient")
            g = ops._push_pull_many([dy], [base + ".grad"], False, process_set=process_set)[0]
            return g if is_root else tf.zeros_like(g)

        return call(v), grad

    return _bc(x)


def _var_name(var: Any, i: int) -> str:
    label = ops._label(var)
    return f"{i}.{ops._normalize_name(label)}" if label else str(i)


@tf.autograph.experimental.do_not_convert
def broadcast_variables(variables: Iterable[Any], root_rank: int, scope: str = ""):
    """Assign ``root_rank``'s values to ``variables`` on every rank.

    All variables go through ONE operation (started together, waited together, earlier
    variables first). Variable ``i`` is reduced under ``scope + "BytePSBroadcast.<i>.<name>"``
    (its position and normalised name, the same on every rank running the same model), so
    repeated broadcasts of the same variables reuse their keys. Unlike upstream this also runs
    when ``size() == 1`` (then it assigns each variable its own value).

    Args:
        variables: ``tf.Variable`` or Keras variables, e.g. ``model.variables``; every rank
            passes the same list (same order, shapes and dtypes).
        root_rank: the source rank.
        scope: name prefix.

    Returns:
        ``None`` when executing eagerly (the variables are updated on return); inside
        ``tf.function`` a ``tf.group`` of the assignments.

    Raises:
        InvalidTypeError (a TypeError): an element is not a variable, or has an unsupported dtype.
        InvalidArgumentError (a ValueError): bad ``root_rank``.
        byteps.errors.MismatchError: shapes or dtypes differ across ranks.
    """
    variables = list(variables)
    for v in variables:
        if not (isinstance(v, tf.Variable) or (tf.is_tensor(v) and hasattr(v, "assign"))):
            raise InvalidTypeError("broadcast_variables: expected tf.Variable or Keras variables, "
                                   f"got {type(v).__name__}")
    root = ops._check_root(root_rank, "broadcast_variables")
    if not variables:
        return None if tf.executing_eagerly() else tf.group()
    values = [ops._as_dense(v, "broadcast_variables") for v in variables]
    bases = [f"{scope}BytePSBroadcast.{_var_name(v, i)}" for i, v in enumerate(variables)]
    n = len(values)
    not_root = ops.rank() != root
    outs = ops._push_pull_many(values, bases, False, priorities=[n - i for i in range(n)],
                               zero=[not_root] * n)
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if isinstance(a, (tf.Tensor, tf.Operation))])
