"""The Module-API pieces of byteps.mxnet: :class:`DistributedOptimizer` and
:func:`broadcast_parameters` (upstream ``byteps/mxnet/__init__.py``).

A broadcast is a push_pull sum to which every rank except the root contributes zeros, so the
result is the root's value. Every rank must make the same calls in the same order.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import mxnet as mx

from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import check_root, name_for
from byteps.sync import async_train

from . import _async, ops
from .compression import Compression

__all__ = ["DistributedOptimizer", "broadcast_parameters"]


def _named_arrays(params: Any) -> List[Tuple[str, List[mx.nd.NDArray]]]:
    """``params`` as ``(name, [arrays to overwrite])`` pairs in a rank-independent order."""
    if isinstance(params, mx.nd.NDArray):
        raise InvalidArgumentError(
            "broadcast_parameters: params must be a dict or a list, not a single "
            "NDArray (wrap it: [('name', array)])")
    if isinstance(params, (dict, mx.gluon.ParameterDict)):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        try:
            seq = list(params)
        except TypeError:
            raise InvalidArgumentError(
                "broadcast_parameters: params must be a dict of NDArrays (Module "
                "get_params()), a Gluon ParameterDict, or a list of NDArrays / "
                f"(name, NDArray) pairs; got {type(params).__name__}") from None
        items = [(str(it[0]), it[1]) if isinstance(it, tuple) and len(it) == 2 else (str(i), it)
                 for i, it in enumerate(seq)]
    out = []
    for name, value in items:
        if value is None:
            continue
        if isinstance(value, mx.gluon.Parameter):
            if value._deferred_init or value._data is None:
                raise InvalidArgumentError(
                    f"broadcast_parameters: Gluon parameter {value.name!r} is not initialised "
                    "yet (deferred initialisation); run one forward pass first, or let "
                    "DistributedTrainer broadcast the parameters on its first step")
            out.append((str(name), list(value.list_data())))
        else:
            ops.check_tensor(value, "broadcast_parameters")
            out.append((str(name), [value]))
    return out


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str = "parameter.") -> None:
    """Overwrite, in place, every array in ``params`` with its value on ``root_rank``, and wait
    until all of them hold it.

    Args:
        params: a Module's ``arg_params``/``aux_params`` dict (``name -> NDArray``, processed in
            sorted name order), a Gluon ``ParameterDict`` or dict of initialised
            ``Parameter`` s (every context's copy is overwritten), or a list of NDArrays /
            ``(name, NDArray)`` pairs (unnamed ones are named by position). ``None`` values are
            skipped. Dtypes as for :func:`~byteps.mxnet.byteps_push_pull`.
        root_rank: the rank whose values everyone receives (default 0).
        prefix: prepended to each name to form the tensor's name (``~k`` is appended when a
            name was used before with another dtype or shape).

    Raises:
        InvalidArgumentError (a ValueError): bad ``root_rank``, a single NDArray or another
            unsupported container, or an uninitialised Gluon parameter (upstream raised
            ``TypeError`` for every Gluon ``ParameterDict``).
        InvalidTypeError (a TypeError): an array that is sparse or of an unsupported dtype.
        byteps.errors.BytePSError subclasses: a push_pull failed.
    """
    root = check_root(root_rank, "broadcast_parameters")
    named = [(name_for(prefix + name, ops.check_tensor(arrays[0], "broadcast_parameters"),
                       arrays[0].shape), arrays)
             for name, arrays in _named_arrays(params)]
    broadcast_copies(named, root)


def broadcast_copies(named, root: int) -> None:
    """Zero-and-sum broadcast from ``root`` of each ``(tensor name, [copies])`` pair: the
    first copy is push_pulled (zeroed first on the other ranks), the others receive it; then
    wait until every copy holds the root's value (raises a failed operation's error)."""
    is_root = ops.rank() == root
    sent = []
    for name, arrays in named:
        first = arrays[0]
        if not is_root:
            first[:] = 0
        ops.byteps_push_pull(first, is_average=False, name=name)
        for other in arrays[1:]:
            first.copyto(other)
        sent.extend(arrays)
    ops.wait_all(sent)


def push_pull_compressed(grad, name_of, compression) -> None:
    """Average ``grad`` across workers in place through ``compression``; ``name_of(tensor)``
    gives the tensor name of the (compressed) array that is push_pulled."""
    compressed, ctx = compression.compress(grad)
    ops.byteps_push_pull(compressed, is_average=True, name=name_of(compressed))
    restored = compression.decompress(compressed, ctx)
    if restored is not grad:
        restored.copyto(grad)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wrap an ``mx.optimizer.Optimizer`` for the Module API: every gradient is averaged across
    all workers (push_pull, in place) before the wrapped optimizer's update (upstream
    ``DistributedOptimizer``, synchronous mode).

    Everything else (learning rate, multipliers, states, attributes Module sets such as
    ``idx2name`` and ``rescale_grad``) goes to the wrapped optimizer. Use it with
    ``mod.init_optimizer(kvstore=None, optimizer=DistributedOptimizer(opt))`` (``'local'`` is
    the same with one device), and broadcast the initial parameters with
    :func:`broadcast_parameters`. Gradient ``i`` is push_pulled as
    ``"optimizer.gradient_<i>"`` (``~k`` appended when another model used the name with another
    shape), declared at its first update (the Module updates in index order on every rank).

    Args:
        optimizer: the optimizer to wrap (any ``mx.optimizer.Optimizer``).
        compression: :class:`~byteps.mxnet.Compression` member applied around each push_pull
            (default ``Compression.none``).

    Raises:
        InvalidTypeError (a TypeError): ``optimizer`` is not an ``mx.optimizer.Optimizer``.
    """

    _OWN = ("_optimizer", "_compression")
    #: Gradient i is push_pulled as "optimizer.gradient_<i>" (upstream: "gradient_<i>", the
    #: names DistributedTrainer uses too; distinct here so both can live in one process).
    _NAME_PREFIX = "optimizer.gradient_"

    def __init__(self, optimizer: mx.optimizer.Optimizer, compression=Compression.none):
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise InvalidTypeError("DistributedOptimizer wraps an mx.optimizer.Optimizer, got "
                                   f"{type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_compression", compression)

    # Attribute access goes to the wrapped optimizer (Module and Updater read and set
    # rescale_grad, idx2name, aggregate_num... on the object they were given).
    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def __setattr__(self, key, value):
        if key in self._OWN:
            object.__setattr__(self, key, value)
        else:
            setattr(self._optimizer, key, value)

    @property
    def learning_rate(self):
        return self._optimizer.learning_rate

    def _push_pull(self, index, grad) -> None:
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(index, (list, tuple)) else [grad]
        for i, g in zip(indices, grads):
            ops.check_tensor(g, "DistributedOptimizer")
            push_pull_compressed(g, lambda t, i=i: name_for(
                f"{self._NAME_PREFIX}{i}", ops.check_tensor(t, "DistributedOptimizer"), t.shape),
                self._compression)

    def update(self, index, weight, grad, state):
        """Average ``grad`` across workers, then apply the wrapped optimizer's update.
        Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``): the update runs locally and each
        weight's delta is exchanged for the servers' value (:func:`_async.module_update`)."""
        if async_train.enabled():
            return _async.module_update(self._optimizer.update, index, weight, grad, state)
        self._push_pull(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """Average ``grad`` across workers, then the wrapped ``update_multi_precision``
        (asynchronous training: as :meth:`update`)."""
        if async_train.enabled():
            return _async.module_update(self._optimizer.update_multi_precision, index, weight,
                                        grad, state)
        self._push_pull(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)

    def _set_current_context(self, device_id: int) -> None:
        self._optimizer._set_current_context(device_id)

    def __getstate__(self):
        return {"optimizer": self._optimizer, "compression": self._compression}

    def __setstate__(self, state):
        object.__setattr__(self, "_optimizer", state["optimizer"])
        object.__setattr__(self, "_compression", state["compression"])


def _unwrap(optimizer: Any) -> Optional[Any]:
    """The wrapped optimizer of a :class:`DistributedOptimizer`, else None."""
    return optimizer._optimizer if isinstance(optimizer, DistributedOptimizer) else None

