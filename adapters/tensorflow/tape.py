"""``DistributedGradientTape`` (upstream ``byteps/tensorflow/__init__.py``, Horovod
semantics): a ``tf.GradientTape`` whose ``gradient()`` returns gradients averaged (or summed)
over all workers."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from byteps.errors import InvalidArgumentError, InvalidTypeError, UsageError
from byteps.sync import async_train

from . import ops
from ._compress_plan import make_plan, resolve_intra
from .compression import Compression

__all__ = ["DistributedGradientTape"]

_SCOPE = "Distributed_Push_Pull/Gradient"


class _DistributedGradientTapeMixin:
    """Methods of the dynamic tape subclass (see :func:`DistributedGradientTape`)."""

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The base tape's gradients, push_pulled across workers in one operation.

        The structure of ``sources`` is kept; a source without a gradient contributes zeros
        and gets the reduced tensor (never ``None``); ``tf.IndexedSlices`` come back as dense
        tensors (see :func:`DistributedGradientTape`).
        """
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        names = [f"{_SCOPE}.{i}.{ops._normalize_name(ops._label(s) or 'tensor')}"
                 for i, s in enumerate(flat_sources)]
        reduced = ops.push_pull_gradients(flat_grads, names, self._bps_average,
                                          self._bps_compression, "DistributedGradientTape",
                                          variables=flat_sources, plan=self._bps_plan,
                                          process_set=self._bps_process_set)
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression=Compression.none,
                            sparse_as_dense: bool = False, op: str = ops.Average,
                            compression_params=None, process_set=None) -> Any:
    """Wrap ``gradtape`` so that ``gradient()`` averages (or sums) gradients across workers.

    Typical use (eagerly or inside ``tf.function``)::

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    Returns a new tape of a dynamic subclass of ``type(gradtape)`` sharing its recorded state
    (``bps.DistributedGradientTape(tf.GradientTape())`` may also be used as the context
    manager). All non-``None`` gradients of one ``gradient()`` call travel in ONE operation,
    earlier sources with higher priority. Gradient ``i`` is named
    ``"Distributed_Push_Pull/Gradient.<i>.<source name>"`` (the same on every rank for the
    same sources). Unlike upstream the gradients are push_pulled also when ``size() == 1``.

    A source with no gradient on this rank (``None``: it took no part in this rank's forward
    pass) contributes ``tf.zeros_like(source)``, and ``gradient()`` returns the reduced tensor
    for it on every rank, so the ranks push the same names (no deadlock when only some ranks
    use a parameter) and apply the same update. Upstream BytePS and Horovod return ``None``
    there and skip the reduction, which hangs when the ranks disagree.

    Args:
        gradtape: a ``tf.GradientTape`` (recorded, or about to be entered).
        device_dense, device_sparse: accepted for compatibility (host memory is used).
        compression: :class:`Compression` member applied to every gradient.
        sparse_as_dense: accepted for compatibility: ``tf.IndexedSlices`` gradients (e.g. of
            an embedding) are ALWAYS densified with ``tf.convert_to_tensor`` before the
            reduction (with ``True`` as Horovod does; with ``False`` too, since the core
            reduces dense tensors only), so they come back dense.
        op: :data:`Average` (default) or :data:`Sum`.
        compression_params: gradient compression by the core, upstream's MXNet dict (keys
            ``compressor``, ``ef``, ``momentum``, ``momentum_mu``, ``scaling``, ``k``,
            ``seed``, ``partition``, ``normalize``, ``fp16``; see
            :func:`byteps.sync.compression.compression_kwargs`). Default None: none. Every
            float16/32/64 gradient is declared with it when ``gradient()`` first builds its
            operation; in a distributed job the core compresses those of at least
            ``BYTEPS_MIN_COMPRESS_BYTES`` bytes, so ``gradient()`` returns ``C(sum_i C(g_i /
            size))`` with ``op=Average`` (``C(sum_i C(g_i))`` with ``Sum``). Every rank must
            pass the same dict (else ``MismatchError`` on every rank). ``"fp16": True`` selects
            ``Compression.fp16`` as well. A tape has no optimizer, so: ``"momentum":
            "nesterov"`` needs ``"momentum_mu"`` in the dict (use an optimizer without
            momentum; gradients the core does not compress get the same Nesterov momentum
            here), and error feedback's learning-rate correction applies only if you call
            ``byteps.basics.set_learning_rate(lr)`` before ``gradient()`` whenever the rate
            changes (with a constant rate there is nothing to correct).
        process_set: Horovod's: a registered ``ProcessSet`` whose ranks alone reduce the
            gradients (Average divides by its size); default every rank. Not together with
            ``compression_params``.

    Raises:
        InvalidTypeError (a TypeError): ``gradtape`` is not a ``tf.GradientTape``; at
            ``gradient()``, a gradient of unsupported dtype; a ``compression_params`` value of
            the wrong type.
        InvalidArgumentError (a ValueError): ``op=Adasum`` or an unknown op; an invalid
            ``compression_params`` (see :func:`byteps.sync.compression.compression_kwargs`);
            ``compression_params`` with a ``process_set``.
        UsageError: in asynchronous training (``BYTEPS_ENABLE_ASYNC=1``), where gradients are
            not reduced (use ``DistributedOptimizer``, docs/async.md).
    """
    if async_train.enabled():
        raise UsageError("DistributedGradientTape averages gradients synchronously; in "
                         "asynchronous training (BYTEPS_ENABLE_ASYNC=1) use "
                         "DistributedOptimizer, which exchanges parameter deltas with the "
                         "servers (docs/async.md)")
    if not isinstance(gradtape, tf.GradientTape):
        raise InvalidTypeError("DistributedGradientTape: expected a tf.GradientTape, got "
                               f"{type(gradtape).__name__}")
    average = ops._resolve_op(op, None, "DistributedGradientTape")
    compression = resolve_intra(compression, compression_params)
    plan = make_plan(compression_params)
    if process_set is not None and not process_set.process_set_id:
        process_set = None  # global_process_set
    if plan is not None and process_set is not None:
        raise InvalidArgumentError("DistributedGradientTape: compression_params declare the "
                                   "gradients over every rank; they are not available with a "
                                   "process_set")
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedGradientTapeMixin, base), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._bps_average = average
    tape._bps_compression = compression
    tape._bps_plan = plan
    tape._bps_sparse_as_dense = bool(sparse_as_dense)
    tape._bps_process_set = process_set
    return tape
