"""Horovod's ``allgather``, ``reducescatter`` and ``alltoall`` for TensorFlow, over :mod:`byteps.collectives`
(the core's programs over the worker mesh, docs/collectives.md), eagerly and inside
``tf.function`` (one ``tf.numpy_function`` op), as the rest of the adapter.

``allgather`` concatenates every rank's tensor along the first dimension in rank order (ranks
may differ in that dimension only; any dtype). ``reducescatter`` sums (``op=Sum``) or averages
(``Average``, the default) a tensor of the same shape on every rank and returns this rank's
shard of the first dimension (``rows // size`` rows, the first ``rows % size`` ranks one more).
``alltoall`` sends ``splits[j]`` rows to rank j and returns what every rank sent this one (in
rank order) and how many came from each. allgather and reducescatter are differentiable for floating-point tensors, with the gradients of the PyTorch adapter
(Horovod's): allgather's is this rank's slice of the averaged output gradient, reducescatter's
the allgathered output gradient (divided by ``size()`` for Average). Every function takes
Horovod's ``process_set=`` (a registered ``ProcessSet``; default every rank): ranks, sizes and
splits are then the set's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import tensorflow as tf
from byteps import basics, collectives
from byteps.errors import InvalidArgumentError, InvalidTypeError

from . import ops
from .compression import Compression
from .functions import _base, allreduce


def _dense(tensor, fn: str) -> tf.Tensor:
    if isinstance(tensor, (tf.RaggedTensor, tf.SparseTensor)):
        raise InvalidTypeError(f"{fn}: {type(tensor).__name__} is not supported; pass a dense "
                               "tf.Tensor")
    try:
        dense = tf.convert_to_tensor(tensor)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"{fn}: expected a tf.Tensor or tf.Variable, got "
                               f"{type(tensor).__name__}") from None
    if dense.shape.rank == 0:
        raise InvalidArgumentError(f"{fn}: a 0-d tensor has no first dimension")
    return dense


def _call(run, x: tf.Tensor, rows: Optional[int]) -> tf.Tensor:
    """``run`` (NumPy in, NumPy out) eagerly or as one ``tf.numpy_function``; the result has
    ``x``'s dtype and trailing shape and ``rows`` rows (None: known when it runs)."""
    if tf.executing_eagerly():
        return tf.convert_to_tensor(run(x.numpy()))
    out = tf.numpy_function(run, [x], x.dtype, stateful=True, name="BytePSCollective")
    out.set_shape([rows] + x.shape.as_list()[1:])
    return out


@tf.autograph.experimental.do_not_convert
def _rank_size(process_set) -> tuple:
    if process_set is None or not process_set.process_set_id:
        return basics.rank(), basics.size()
    return process_set.rank(), process_set.size()


@tf.autograph.experimental.do_not_convert
def allgather(tensor, name: Optional[str] = None, process_set=None) -> tf.Tensor:
    """Horovod's ``allgather``: every rank's ``tensor`` concatenated along the first
    dimension, in rank order.

    Args:
        tensor: a ``tf.Tensor`` or ``tf.Variable``, at least 1-d, any dtype; the ranks' tensors
            may differ in the first dimension only.
        name: the same on every rank (default: from the tensor's name in a ``tf.function``,
            ``BytePSAllgather.eager`` eagerly).

    Raises:
        byteps.errors.InvalidArgumentError: a 0-d tensor; ranks whose tensors differ beyond the
            first dimension (on every rank).
        byteps.errors.InvalidTypeError: not a dense tensor.
    """
    base = _base(tensor, "", name, "BytePSAllgather", "allgather")
    x = _dense(tensor, "allgather")

    def gather(a, key=base):
        return collectives.allgather_start(np.asarray(a), key, process_set=process_set).wait()

    if not x.dtype.is_floating:
        return _call(gather, x, None)

    @tf.custom_gradient
    def _ag(v):
        y = _call(gather, v, None)

        def grad(dy):
            g = allreduce(tf.convert_to_tensor(dy), op=ops.Average, name=base + ".grad",
                          process_set=process_set)
            rank, size = _rank_size(process_set)
            rows = _call(lambda a: gather(a, base + ".grad.rows"),
                         tf.reshape(tf.shape(v, out_type=tf.int64)[0], [1]), size)
            offset = tf.reduce_sum(rows[:rank])
            return tf.slice(g, tf.concat([[offset], tf.zeros([tf.rank(g) - 1], tf.int64)], 0),
                            tf.shape(v, out_type=tf.int64))

        return y, grad

    return _ag(x)


@tf.autograph.experimental.do_not_convert
def reducescatter(tensor, name: Optional[str] = None, op: Optional[str] = None,
                  process_set=None) -> tf.Tensor:
    """Horovod's ``reducescatter``: ``tensor`` reduced over the ranks with ``op`` (``Sum``, or
    ``Average``: the default), this rank's shard of the first dimension.

    Args:
        tensor: at least 1-d, a dtype of ``byteps.tensorflow.SUPPORTED_DTYPES``, the same shape
            on every rank.
        name: as :func:`allgather` (default prefix ``BytePSReducescatter``).
        op: ``Sum`` or ``Average`` (default).

    Raises:
        byteps.errors.InvalidArgumentError: another op, a 0-d tensor.
        byteps.errors.InvalidTypeError: an unsupported dtype.
    """
    core_op, average = ops._resolve_reduce(op if op is not None else ops.Average, None,
                                           "reducescatter")
    if core_op != "sum":
        raise InvalidArgumentError(f"reducescatter: op must be Sum or Average (Horovod's "
                                   f"reducescatter), got {op}")
    base = _base(tensor, "", name, "BytePSReducescatter", "reducescatter")
    x = _dense(tensor, "reducescatter")
    ops._dtype_name(x.dtype, "reducescatter")
    rank, size = _rank_size(process_set)
    rows = x.shape[0]
    mine = collectives.shard_counts(rows, size)[rank] if rows is not None else None

    def scatter(a):
        return collectives.reducescatter_start(np.asarray(a), base, average=average,
                                               process_set=process_set).wait()

    if not x.dtype.is_floating:
        return _call(scatter, x, mine)

    @tf.custom_gradient
    def _rs(v):
        y = _call(scatter, v, mine)

        def grad(dy):
            g = allgather(tf.convert_to_tensor(dy), name=base + ".grad", process_set=process_set)
            return g / size if average else g

        return y, grad

    return _rs(x)


@tf.autograph.experimental.do_not_convert
def alltoall(tensor, splits=None, name: Optional[str] = None, process_set=None):
    """Horovod's ``alltoall``: ``splits[j]`` rows of ``tensor`` go to rank j; returns
    ``(output, received_splits)``: the rows every rank sent this one, concatenated in rank
    order, and an int32 tensor of how many came from each. Eager and in ``tf.function``; not
    differentiable.

    Args:
        tensor: at least 1-d, any dtype; the ranks' tensors may differ in the first dimension
            only.
        splits: ``size()`` non-negative ints (a list or an integer tensor) adding up to the
            rows; ``None``: the rows split evenly (they must divide by ``size()``).
        name: as :func:`allgather` (default prefix ``BytePSAlltoall``).

    Raises:
        byteps.errors.InvalidArgumentError: splits of the wrong length or sum, rows that do not
            divide evenly, a 0-d tensor, ranks whose tensors differ beyond the first dimension.
    """
    base = _base(tensor, "", name, "BytePSAlltoall", "alltoall")
    x = _dense(tensor, "alltoall")
    even = splits is None
    s = tf.zeros([0], tf.int64) if even else tf.cast(tf.convert_to_tensor(splits), tf.int64)

    def run(a, sp):
        out, received = collectives.alltoall_start(
            np.asarray(a), None if even else [int(v) for v in np.asarray(sp)], base,
            process_set=process_set).wait()
        return out, received.astype(np.int32)

    if tf.executing_eagerly():
        out, received = run(x.numpy(), s.numpy())
        return tf.convert_to_tensor(out), tf.convert_to_tensor(received)
    out, received = tf.numpy_function(run, [x, s], [x.dtype, tf.int32], stateful=True,
                                      name="BytePSAlltoall")
    out.set_shape([None] + x.shape.as_list()[1:])
    received.set_shape([_rank_size(process_set)[1]])
    return out, received


def allgather_object(obj, name: Optional[str] = None, process_set=None) -> list:
    """Horovod's ``allgather_object``: every rank's picklable ``obj``, as a list in rank order
    (eagerly; ``name`` default: ``type(obj).__name__``)."""
    return collectives.allgather_object(obj, name if name is not None else type(obj).__name__,
                                        process_set)


def _names(tensors, name: Optional[str], prefix: str, fn: str) -> list:
    if not isinstance(tensors, (list, tuple)):
        raise InvalidTypeError(f"{fn}: expected a list or tuple of tensors, got "
                               f"{type(tensors).__name__}")
    base = name if name is not None else f"{prefix}.{len(tensors)}"
    return [f"{base}.{i}" for i in range(len(tensors))]


def grouped_allreduce(tensors, average: Optional[bool] = None, compression=None,
                      op: Optional[str] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, name: Optional[str] = None,
                      process_set=None) -> list:
    """Horovod's ``grouped_allreduce``: :func:`byteps.tensorflow.allreduce` of each tensor
    (named ``<name>.<i>``), the same ``op`` and factors; returns the list. Each is its own
    push_pull (differentiable as ``allreduce``).

    Raises: as ``allreduce``; InvalidTypeError: ``tensors`` is not a list or tuple."""
    names = _names(tensors, name, "BytePSGroupedAllreduce", "grouped_allreduce")
    return [allreduce(t, average=average, compression=compression or Compression.none, op=op,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      name=n, process_set=process_set) for t, n in zip(tensors, names)]


def grouped_allgather(tensors, name: Optional[str] = None, process_set=None) -> list:
    """Horovod's ``grouped_allgather``: :func:`allgather` of each tensor (named
    ``<name>.<i>``); returns the list."""
    names = _names(tensors, name, "BytePSGroupedAllgather", "grouped_allgather")
    return [allgather(t, name=n, process_set=process_set) for t, n in zip(tensors, names)]


def grouped_reducescatter(tensors, name: Optional[str] = None, op: Optional[str] = None,
                          process_set=None) -> list:
    """Horovod's ``grouped_reducescatter``: :func:`reducescatter` of each tensor (named
    ``<name>.<i>``, Sum or Average); returns the list of shards."""
    names = _names(tensors, name, "BytePSGroupedReducescatter", "grouped_reducescatter")
    return [reducescatter(t, name=n, op=op, process_set=process_set)
            for t, n in zip(tensors, names)]


@tf.autograph.experimental.do_not_convert
def join():
    """Horovod's ``join``: this rank has run out of data; blocks until every rank has joined,
    while the others' allreduce, allgather, broadcast and reducescatter complete without it
    (zeros to a sum, no rows to a gather; an Average still divides by ``size()``). Returns the
    rank that joined last: an int eagerly, an int32 scalar tensor inside ``tf.function`` (one
    ``tf.numpy_function``, as Horovod's op). Errors: ``byteps.collectives.join``."""
    if tf.executing_eagerly():
        return collectives.join()
    out = tf.numpy_function(lambda: np.int32(collectives.join()), [], tf.int32, stateful=True,
                            name="BytePSJoin")
    out.set_shape([])
    return out
