"""``DistributedTrainer``: a Gluon ``Trainer`` whose gradients are averaged through byteps
(upstream ``byteps/mxnet/__init__.py``)."""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Dict, Optional

import mxnet as mx

from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import check_root

from . import ops
from .compression import Compression
from .optimizer import _unwrap, broadcast_copies, push_pull_compressed

__all__ = ["DistributedTrainer"]

_trainer_count = itertools.count()


def _compressor(compression_params: Optional[Dict[str, Any]]):
    if compression_params is None:
        return Compression.none
    if not isinstance(compression_params, dict):
        raise InvalidTypeError("compression_params must be a dict or None, got "
                               f"{type(compression_params).__name__}")
    unknown = sorted(set(compression_params) - {"fp16"})
    if unknown:
        raise InvalidArgumentError(
            f"compression_params {unknown}: server-side gradient compression (onebit, topk, "
            "randomk, dithering, error feedback) is not part of this build of byteps; the "
            "supported key is 'fp16' (float16 transfer)")
    return Compression.fp16 if compression_params.get("fp16") else Compression.none


class DistributedTrainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` that averages every gradient across all workers with push_pull and
    starts from ``root_rank``'s parameters (upstream ``DistributedTrainer``).

    On the first :meth:`step` (or ``allreduce_grads``) every initialised parameter is broadcast
    from ``root_rank`` (zero-and-sum push_pull, then a wait). On every step each gradient is
    push_pulled in place with averaging, earliest-declared (first parameter) first, while the
    update of each parameter waits, through MXNet's engine, only for its own gradient. The
    usual ``step(batch_size)`` normalisation applies on top (``rescale_grad = 1/batch_size``),
    so the update equals single-process training on the concatenation of all workers' batches.

    A parameter without a gradient on a rank (not used in its forward pass there; its
    gradient is stale) contributes zeros, and every rank applies the averaged gradient, as in
    byteps.torch; a parameter no rank used therefore gets a zero gradient (momentum and weight
    decay still act) instead of being skipped.

    Args:
        params: a ``ParameterDict`` or dict of ``Parameter`` s (taken in sorted name order, as
            upstream, so every rank gets the same order) or a list of ``Parameter`` s.
        optimizer: optimizer name (``"sgd"``) or ``mx.optimizer.Optimizer`` instance; a
            :class:`~byteps.mxnet.DistributedOptimizer` is unwrapped with a warning.
        optimizer_params: keyword arguments of the optimizer, as for ``gluon.Trainer``.
        root_rank: rank whose initial parameters every worker starts from (default 0).
        compression_params: ``None`` or ``{"fp16": True}`` (float16 transfer). Upstream's
            server-side compressors (``compressor``, ``ef``, ``momentum``...) are not part of
            this build and raise ``InvalidArgumentError`` (a ``ValueError``).

    Tensor names: ``"parameter_<i>"`` and ``"gradient_<i>"`` for the first trainer of the
    process, ``"trainer<k>.parameter_<i>"``... for the k-th, declared when the trainer is created
    (create trainers in the same order on every rank).

    Raises:
        InvalidTypeError (a TypeError): sparse weights or gradients; bad ``compression_params``
            type.
        InvalidArgumentError (a ValueError): parameters on more than one context (one context per
            process), a bad ``root_rank``, unsupported compression keys.
        byteps.errors.NotInitializedError: before :func:`~byteps.mxnet.init`.
    """

    def __init__(self, params, optimizer, optimizer_params=None, root_rank: int = 0,
                 compression_params=None):
        inner = _unwrap(optimizer)
        if inner is not None:
            warnings.warn("DistributedTrainer does not take a DistributedOptimizer: its "
                          "wrapped optimizer is used (the trainer averages the gradients)",
                          stacklevel=2)
            optimizer = inner
        self._bps_root = check_root(root_rank, "DistributedTrainer")
        self._bps_compression = _compressor(compression_params)
        if isinstance(params, (dict, mx.gluon.ParameterDict)):
            params = [params[k] for k in sorted(params.keys())]
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        if self._contains_sparse_weight or self._contains_sparse_grad:
            raise InvalidTypeError(
                "DistributedTrainer: sparse weights or gradients are not supported")
        if self._contexts is not None and len(self._contexts) > 1:
            raise InvalidArgumentError(
                f"DistributedTrainer: parameters live on {len(self._contexts)} "
                f"contexts ({self._contexts}); byteps.mxnet runs one context per "
                "process (start one worker process per device)")
        k = next(_trainer_count)
        prefix = "" if k == 0 else f"trainer{k}."
        self._bps_param_names = [f"{prefix}parameter_{i}" for i in range(len(self._params))]
        self._bps_grad_names = [f"{prefix}gradient_{i}" for i in range(len(self._params))]
        for i, param in enumerate(self._params):
            ops.byteps_declare_tensor(self._bps_param_names[i])
            if param.grad_req != "null":
                ops.byteps_declare_tensor(self._bps_grad_names[i])

    def _init_params(self):
        """Broadcast every initialised parameter from ``root_rank`` (deferred ones wait for a
        later step), then wait until all of them hold the root's values."""
        ready = [p for p in self._params_to_init if not p._deferred_init]
        broadcast_copies([(self._bps_param_names[self._param2idx[p.name]],
                           p._check_and_get(p._data, list)) for p in ready], self._bps_root)
        self._params_to_init = [p for p in self._params_to_init if p._deferred_init]

    def _allreduce_grads(self):
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = param.list_grad()[0]
            data = param.list_data()[0]
            if param.grad_req == "write" and not data._fresh_grad:
                grad[:] = 0  # no gradient on this rank: contribute zeros
            push_pull_compressed(grad, lambda _t, i=i: self._bps_grad_names[i],
                                 self._bps_compression)
            data._fresh_grad = True  # it now holds the average of every rank's gradient
