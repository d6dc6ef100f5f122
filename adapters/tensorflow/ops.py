"""TensorFlow operations over the byteps core (upstream ``byteps/tensorflow/ops.py``).

TensorFlow tensors reach the core as NumPy arrays: eagerly through ``Tensor.numpy()``, inside a
``tf.function`` through one ``tf.numpy_function`` op. Either way the same Python routine
(:func:`_run`) starts one asynchronous push_pull per tensor (all of them first, so the core
reduces them in parallel and in priority order) and then waits for all of them; the arrays
stay referenced until every wait has returned. Nothing here is compiled against TensorFlow.

Names (the core fixes a name's dtype and shape at first use, and keys follow declaration
order, which must agree on every rank):

* an explicit ``name`` (with ``scope`` prepended) is used as given;
* in graph mode (``tf.function``) an unnamed tensor gets upstream's
  ``scope + "BytePSPushPull_" + normalised(tensor.name)``; a variable its variable name;
* eagerly an unnamed tensor has no name, so the name is ``scope + "BytePSPushPull.eager"``.
  Eager calls are synchronous, so one name per (dtype, shape) is enough; upstream declared a
  new random name on every eager call (unbounded keys, different on every rank).

A name reused with another dtype or shape becomes ``name~1``, ``name~2``... (see
:func:`_name_for`). Names of statically shaped tensors are declared when the op is created
(Python order, the same on every rank), not when TensorFlow happens to run it.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import tensorflow as tf
from byteps import basics as _b
from byteps import reduce_ops
from byteps.basics import (  # re-exported as-is
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import check_root as _check_root  # noqa: F401 (used by functions.py)
from byteps.naming import name_for

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "declare",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "SUPPORTED_DTYPES",
]

#: Reduction operations (upstream / Horovod constants: byteps.reduce_ops; docs/collectives.md).
Average, Sum, Adasum = reduce_ops.AVERAGE, reduce_ops.SUM, reduce_ops.ADASUM
Min, Max, Product = reduce_ops.MIN, reduce_ops.MAX, reduce_ops.PRODUCT

#: TensorFlow dtypes the core can sum, with the core's name for each.
_DTYPE_NAMES: Dict[tf.DType, str] = {
    tf.float16: "float16",
    tf.bfloat16: "bfloat16",
    tf.float32: "float32",
    tf.float64: "float64",
    tf.int8: "int8",
    tf.uint8: "uint8",
    tf.int32: "int32",
    tf.int64: "int64",
}

#: Supported TensorFlow dtypes, in the order error messages list them.
SUPPORTED_DTYPES: Tuple[tf.DType, ...] = tuple(_DTYPE_NAMES)

_SUPPORTED_TEXT = ", ".join(d.name for d in SUPPORTED_DTYPES)


# --------------------------------------------------------------------------------------------
# basics (re-exported by byteps.tensorflow)
# --------------------------------------------------------------------------------------------
def init(lazy: bool = True, process_sets=None) -> None:
    """Start byteps in this process. Idempotent: a second call does nothing.

    Args:
        lazy: accepted for upstream compatibility; the core always connects at ``init`` so
            that configuration and network errors surface here.
        process_sets: Horovod's: a list of ``ProcessSet`` to register now, in order (every
            rank passes the same); ``"dynamic"`` or None: none (``add_process_set`` any time).

    Raises:
        byteps.errors.ConfigError: a ``BYTEPS_*`` / ``DMLC_*`` variable is missing or bad.
        byteps.errors.BytePSTimeoutError: the scheduler did not answer in time.
        byteps.errors.PeerLostError: a peer failed during rendezvous.
    """
    _b.init(lazy=lazy, process_sets=process_sets)


def declare(name: str, process_set=None) -> int:
    """Declare a tensor name ahead of use and return its key (declaration order, which must
    be the same on every worker). Declaring an existing name returns the same key.
    ``process_set``: among a registered ``ProcessSet``'s ranks (keys count per set).

    Raises:
        InvalidTypeError (a TypeError): ``name`` is not a string.
        byteps.errors.NotInitializedError: before :func:`init`.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(f"declare(name): name must be a str, got {type(name).__name__}")
    return _b.declare(name, process_set=process_set)


# --------------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------------
def _resolve_op(op: Optional[str], average: Optional[bool], fn: str = "push_pull") -> bool:
    """``op``/``average`` -> average flag, for what sums gradients (Average or Sum only);
    Horovod's rules: :func:`byteps.reduce_ops.resolve`."""
    core_op, avg = reduce_ops.resolve(op, average, fn)
    if core_op != "sum":
        raise InvalidArgumentError(f"{fn}: gradients are averaged or summed: op must be "
                                   f"Average or Sum, got {op!r}")
    return avg


def _resolve_reduce(op: Optional[str], average: Optional[bool], fn: str) -> Tuple[str, bool]:
    """``op``/``average`` -> (the core's op, average): :func:`byteps.reduce_ops.resolve`."""
    return reduce_ops.resolve(op, average, fn)


def _dtype_name(dtype: tf.DType, fn: str) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise InvalidTypeError(f"{fn}: unsupported tensor dtype {dtype.name}; supported dtypes: "
                               f"{_SUPPORTED_TEXT}") from None


def _as_dense(tensor: Any, fn: str) -> tf.Tensor:
    """Validate ``tensor`` and return it as a dense ``tf.Tensor`` of a supported dtype.

    Accepts ``tf.Tensor``, ``tf.Variable``, Keras variables and ``tf.IndexedSlices`` (densified
    with ``tf.convert_to_tensor``). Raises ``InvalidTypeError`` (a ``TypeError``)
    for anything else."""
    if isinstance(tensor, tf.RaggedTensor):
        raise InvalidTypeError(f"{fn}: tf.RaggedTensor is not supported; pass a dense tf.Tensor "
                               "(e.g. tensor.to_tensor()) or tf.Variable")
    if isinstance(tensor, tf.SparseTensor):
        raise InvalidTypeError(f"{fn}: tf.SparseTensor is not supported; pass a dense tf.Tensor "
                               "(tf.sparse.to_dense) or tf.Variable")
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tf.convert_to_tensor(tensor)
    elif isinstance(tensor, tf.Variable) or (tf.is_tensor(tensor)
                                             and not isinstance(tensor, tf.Tensor)):
        tensor = tf.convert_to_tensor(tensor)  # tf.Variable, Keras variable
    if not isinstance(tensor, tf.Tensor):
        raise InvalidTypeError(f"{fn}: expected a tf.Tensor, tf.Variable or tf.IndexedSlices, got "
                               f"{type(tensor).__name__}")
    _dtype_name(tensor.dtype, fn)
    return tensor


def _normalize_name(name: str) -> str:
    """Upstream's normalisation: every character outside ``[a-zA-Z0-9_]`` becomes ``_``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _label(obj: Any) -> Optional[str]:
    """The name TensorFlow/Keras gives ``obj`` (``None`` for an eager tensor), without the
    ``:0`` output suffix."""
    if isinstance(obj, tf.Variable) or not isinstance(obj, (tf.Tensor, tf.IndexedSlices)):
        name = getattr(obj, "path", None) or getattr(obj, "name", None)
    elif tf.executing_eagerly():
        return None
    else:
        try:
            name = obj.name
        except (AttributeError, ValueError):
            return None
    if not isinstance(name, str) or not name:
        return None
    return name[:-2] if name.endswith(":0") else name


#: A name derived from ``base`` that has only ever been used with this dtype and shape
#: (``base``, ``base~1``...; shared by every adapter, deterministic on every rank).
_name_for = name_for


# --------------------------------------------------------------------------------------------
# the one routine that talks to the core
# --------------------------------------------------------------------------------------------
def _run(arrays: Sequence[np.ndarray], bases: Sequence[str], names: Sequence[Optional[str]],
         dtypes: Sequence[str], average: bool, priorities: Sequence[Optional[int]],
         zero: Sequence[bool], plan=None, lr: Optional[float] = None,
         op: str = "sum", process_set=None) -> List[np.ndarray]:
    """Start a push_pull for every array, then wait for all; return the results (new arrays).

    ``names[i]`` is None when the name is resolved here from the runtime shape. ``zero[i]``
    sends zeros instead of the array (the non-root side of a broadcast). ``plan``: the
    optimizer's :class:`~byteps.tensorflow._compress_plan.CompressionPlan` (gets ``lr`` before
    the first push_pull, declares runtime names, finishes every result). ``op``: how the ranks'
    values combine (byteps.basics.REDUCE_OPS); ``process_set``: the ranks it runs among (None:
    every rank)."""
    if plan is not None:
        plan.set_learning_rate(lr)
    started = []  # (handle, input, output, name): keeps every buffer alive until waited
    try:
        for arr, base, name, dtype, prio, z in zip(arrays, bases, names, dtypes, priorities,
                                                    zero):
            a = np.zeros(np.shape(arr), dtype=arr.dtype) if z else np.asarray(arr, order="C")
            out = np.empty_like(a)
            if name is None:
                name = _name_for(base, dtype, a.shape, plan.kwargs if plan else None)
                if plan is not None:
                    plan.declare(name, dtype, a.nbytes)
            h = _b.push_pull_async(name, a.ctypes.data, out.ctypes.data, a.nbytes, dtype,
                                   a.shape, average, priority=prio, op=op,
                                   process_set=process_set)
            started.append((h, a, out, name))
    except BaseException:
        _drain(started)
        raise
    errors = _drain(started)
    if errors:
        raise errors[0]
    if plan is not None:
        for _, _, out, name in started:
            plan.finish(name, out)
    return [out for _, _, out, _ in started]


def _drain(started) -> list:
    """Wait for every started operation (so no buffer is freed under the core)."""
    errors = []
    for h, *_ in started:
        try:
            _b.wait(h)
        except Exception as e:
            errors.append(e)
    return errors


@tf.autograph.experimental.do_not_convert
def _push_pull_many(tensors: Sequence[tf.Tensor], bases: Sequence[str], average: bool,
                    priorities: Optional[Sequence[Optional[int]]] = None,
                    zero: Optional[Sequence[bool]] = None, plan=None,
                    lr: Any = None, op: str = "sum", process_set=None) -> List[tf.Tensor]:
    """push_pull dense, validated tensors under the names derived from ``bases``, in ONE
    operation: called directly when executing eagerly, else as one ``tf.numpy_function``
    whose outputs get the inputs' static shapes. Not differentiable by itself.

    ``plan``: a :class:`~byteps.tensorflow._compress_plan.CompressionPlan` (names declared
    with its compressor kwargs); ``lr``: the learning rate (a number, variable or scalar
    tensor, read when the operation runs) handed to the core before the push_pulls."""
    tensors = list(tensors)
    if not tensors:
        return []
    n = len(tensors)
    priorities = list(priorities) if priorities is not None else [None] * n
    zero = list(zero) if zero is not None else [False] * n
    dtypes = [_DTYPE_NAMES[t.dtype] for t in tensors]
    names = []
    for t, base, dtype in zip(tensors, bases, dtypes):
        if t.shape.is_fully_defined():
            # a name is never reused with another compressor (byteps.naming.name_for)
            name = _name_for(base, dtype, t.shape.as_list(), plan.kwargs if plan else None)
            # at op-creation time: the same order on every rank
            if plan is not None:
                plan.declare(name, dtype, t.shape.num_elements() * t.dtype.size)
            else:
                declare(name, process_set)
            names.append(name)
        else:
            size()  # NotInitializedError before init(), also for dynamic shapes
            names.append(None)
    bases = list(bases)

    with_lr = plan is not None and lr is not None

    def fn(*arrays):
        rate = None
        if with_lr:
            rate, arrays = float(arrays[-1]), arrays[:-1]
        return _run(arrays, bases, names, dtypes, average, priorities, zero, plan, rate, op,
                    process_set)

    extra = [tf.cast(tf.convert_to_tensor(lr), tf.float64)] if with_lr else []
    if tf.executing_eagerly():
        outs = fn(*[t.numpy() for t in tensors + extra])
        return [tf.convert_to_tensor(o) for o in outs]
    outs = tf.numpy_function(fn, tensors + extra, [t.dtype for t in tensors], stateful=True,
                             name="BytePSPushPull")
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return list(outs)


def _push_pull_one(tensor: tf.Tensor, base: str, average: bool, op: str = "sum",
                   process_set=None) -> tf.Tensor:
    """Differentiable push_pull of one tensor: the gradient is the push_pull (same
    ``average``, ``op`` and process set) of the upstream gradient under ``name + ".grad"``
    (as upstream/Horovod)."""
    if not tensor.dtype.is_floating:
        return _push_pull_many([tensor], [base], average, op=op, process_set=process_set)[0]

    @tf.custom_gradient
    def _pp(x):
        y = _push_pull_many([x], [base], average, op=op, process_set=process_set)[0]

        def grad(dy):
            dy = _as_dense(dy, "push_pull gradient")
            return _push_pull_many([dy], [base + ".grad"], average, op=op,
                                   process_set=process_set)[0]

        return y, grad

    return _pp(tensor)


@tf.autograph.experimental.do_not_convert
def push_pull_gradients(grads: Sequence[Any], names: Sequence[str], average: bool,
                        compression, fn: str,
                        variables: Optional[Sequence[Any]] = None, plan=None,
                        lr: Any = None, process_set=None) -> List[Any]:
    """push_pull a list of gradients in one operation (used by the tape and the optimizers).

    ``tf.IndexedSlices`` are densified; each gradient is compressed, reduced under
    ``names[i]`` with priority by index (earlier = higher, since the next forward pass needs
    the first layers first) and decompressed.

    ``None`` entries: where ``variables[i]`` is known, ``tf.zeros_like(variables[i])`` is
    pushed instead, so every rank pushes the same names even when a parameter took no part in
    some ranks' forward pass (otherwise the ranks that have a gradient wait forever for the
    others), and the reduced tensor is returned for it on every rank (so all ranks apply the
    same update and the weights stay identical). Upstream BytePS and Horovod leave ``None``
    gradients out, which deadlocks when ranks disagree. Without a known variable a ``None``
    entry stays ``None`` (every rank must then agree on it).

    ``plan``/``lr``: the optimizer's compression plan and learning rate (``compression_params``,
    see :func:`_push_pull_many`); None without core compression. ``process_set``: the ranks
    the gradients are reduced among (None: every rank)."""
    grads = list(grads)
    if variables is not None:
        variables = list(variables)
        for i, g in enumerate(grads):
            if g is None and i < len(variables) and variables[i] is not None:
                grads[i] = tf.zeros_like(variables[i])
    idx = [i for i, g in enumerate(grads) if g is not None]
    if not idx:
        return grads
    dense = [_as_dense(grads[i], fn) for i in idx]
    comp = [compression.compress(t) for t in dense]
    n = len(grads)
    outs = _push_pull_many([c for c, _ in comp], [names[i] for i in idx], average,
                           priorities=[n - i for i in idx], plan=plan, lr=lr,
                           process_set=process_set)
    result = list(grads)
    for i, out, (_, ctx) in zip(idx, outs, comp):
        result[i] = compression.decompress(out, ctx)
    return result
