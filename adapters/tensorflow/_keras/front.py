"""The module-level functions of the two Keras fronts, ``byteps.tensorflow.keras`` (``tf.keras``)
and ``byteps.keras`` (the ``keras`` package): :func:`make_front` binds them to a front's Keras
module, as :func:`byteps.tensorflow._keras.callbacks.make_callbacks` does for the callbacks. All
logic lives in :mod:`byteps.tensorflow._keras`."""

from __future__ import annotations

from types import SimpleNamespace

from ..compression import Compression
from ..ops import Average

__all__ = ["make_front"]


def make_front(keras) -> SimpleNamespace:
    """``DistributedOptimizer``, ``broadcast_global_variables``, ``push_pull``, ``broadcast``
    and ``load_model`` for the Keras 3 module ``keras`` (``tf.keras`` or ``keras``)."""
    from . import broadcast as _broadcast
    from . import broadcast_global_variables as _broadcast_global_variables
    from . import create_distributed_optimizer
    from . import load_model as _load_model
    from . import push_pull as _push_pull

    def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                             compression=Compression.none, sparse_as_dense=False,
                             backward_passes_per_step=1, op=Average, compression_params=None):
        """A distributed copy of the Keras 3 ``optimizer`` (same class, config and state) whose
        ``apply``/``apply_gradients`` first averages the gradients across workers; see
        :func:`byteps.tensorflow._keras.create_distributed_optimizer` for the arguments and
        errors (``device_dense``/``device_sparse`` are accepted for compatibility;
        ``compression_params``: gradient compression by the core, upstream's MXNet dict)."""
        return create_distributed_optimizer(keras, optimizer, name, compression,
                                            sparse_as_dense, backward_passes_per_step, op,
                                            compression_params)

    def broadcast_global_variables(model_or_variables, root_rank=0):
        """Broadcast a model's (and its optimizer's) variables, or a list of variables, from
        ``root_rank``; see :func:`byteps.tensorflow._keras.broadcast_global_variables`."""
        return _broadcast_global_variables(model_or_variables, root_rank)

    def push_pull(value, name=None, average=True):
        """Average (or sum) ``value`` across workers; returns a NumPy array. See
        :func:`byteps.tensorflow._keras.push_pull`."""
        return _push_pull(value, name, average)

    def broadcast(value, root_rank, name=None):
        """``root_rank``'s ``value`` on every rank, as a NumPy array. See
        :func:`byteps.tensorflow._keras.broadcast`."""
        return _broadcast(value, root_rank, name)

    def load_model(filepath, custom_optimizers=None, custom_objects=None,
                   compression=Compression.none):
        """Load a Keras model whose optimizer is distributed (state restored). See
        :func:`byteps.tensorflow._keras.load_model`."""
        return _load_model(keras, filepath, custom_optimizers, custom_objects, compression)

    fns = (DistributedOptimizer, broadcast_global_variables, push_pull, broadcast, load_model)
    for fn in fns:
        fn.__qualname__ = fn.__name__  # as help() should show them: module-level functions
    return SimpleNamespace(**{fn.__name__: fn for fn in fns})
