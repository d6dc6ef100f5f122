"""``DistributedTrainer``: a Gluon ``Trainer`` whose gradients are averaged through byteps
(upstream ``byteps/mxnet/__init__.py``), optionally compressed by the core
(``compression_params``, upstream's semantics); in asynchronous training
(``BYTEPS_ENABLE_ASYNC=1``) each step's weight deltas are exchanged for the servers' parameters
instead (:mod:`byteps.mxnet._async`)."""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any, Dict, Mapping, Optional

import mxnet as mx
import numpy as np

import byteps.sync.compression as core_compression
from byteps import basics as _basics
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import check_root
from byteps.sync import async_train

from . import _async, ops
from .compression import Compression
from .optimizer import _unwrap, broadcast_copies, push_pull_compressed

__all__ = ["DistributedTrainer"]

_trainer_count = itertools.count()


def _hyper(optimizer, optimizer_params: Dict[str, Any], key: str) -> Optional[float]:
    """``optimizer_params[key]``, or the attribute of an optimizer instance; None when 0 or
    absent."""
    if isinstance(optimizer, str):
        value = optimizer_params.get(key)
    else:
        value = getattr(optimizer, key, None)
    return float(value) if value else None


def _remove_hyper(optimizer, optimizer_params: Dict[str, Any], key: str) -> None:
    if isinstance(optimizer, str):
        optimizer_params.pop(key, None)
    elif getattr(optimizer, key, None):
        setattr(optimizer, key, 0.0)


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
        compression_params: gradient compression, upstream's dict (default None: none), e.g.
            ``{"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "scaling":
            True}``; keys ``compressor`` (onebit | topk | randomk | dithering | fp16), ``ef``,
            ``momentum``, ``momentum_mu``, ``scaling``, ``k``, ``seed``, ``partition``,
            ``normalize``, ``fp16`` (see :func:`byteps.sync.compression.compression_kwargs`).
            ``"fp16": True`` casts gradients to float16 around the push_pull (as
            ``Compression.fp16``). With ``compressor``, every gradient is declared with the
            core's kwargs; in a distributed job the core compresses those of at least
            ``BYTEPS_MIN_COMPRESS_BYTES`` bytes. Then, as upstream: :meth:`step` scales each
            gradient by ``1/(batch_size * size())`` before a summing push_pull (not by the
            optimizer's ``rescale_grad``), so an update applies ``C(sum_i C(g_i /
            (batch_size * size)))``; the learning rate reaches the core before each step's
            push_pulls (error feedback; upstream wrote it to the file ``lr.s``);
            ``"momentum": "nesterov"`` takes mu from ``momentum_mu`` or
            ``optimizer_params["momentum"]`` (or the optimizer's ``momentum``), removes the
            optimizer's momentum, and applies Nesterov momentum in the core before compressing
            and, for the gradients the core does not compress, after the reduction
            (``Compression.nag``); with onebit, the optimizer's ``wd`` is removed too and
            applied after the reduction, with momentum for the compressed gradients
            (``Compression.wdmom``). ``optimizer_params`` itself is not modified (upstream
            deleted the keys from the caller's dict).

    Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``, docs/async.md): no gradient is reduced;
    :meth:`step` runs the update locally and exchanges each trainable weight's delta for the
    servers' parameters under ``"AsyncParam.parameter_<i>"`` (the first step starts from the
    servers' initial value, rank 0's); ``compression_params`` must be None.
    :func:`byteps.mxnet.pull_parameters` reads the servers' parameters.

    Tensor names: ``"parameter_<i>"`` and ``"gradient_<i>"`` for the first trainer of the
    process, ``"trainer<k>.parameter_<i>"``... for the k-th, declared when the trainer is created
    (create trainers in the same order on every rank).

    Raises:
        InvalidTypeError (a TypeError): sparse weights or gradients; a ``compression_params``
            that is not a dict, or a value of the wrong type.
        InvalidArgumentError (a ValueError): parameters on more than one context (one context per
            process), a bad ``root_rank``; an unknown ``compression_params`` key or value, a
            missing ``k`` or mu (upstream: KeyError/ValueError).
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
        self._bps_async = async_train.enabled()
        if self._bps_async and compression_params:
            raise InvalidArgumentError(
                "DistributedTrainer in asynchronous training (BYTEPS_ENABLE_ASYNC=1) pushes "
                "weight deltas uncompressed: compression_params is not supported")
        optimizer_params = dict(optimizer_params or {})
        intra = (Compression.fp16 if core_compression.wants_fp16(compression_params)
                 else Compression.none)
        mu = None
        if isinstance(compression_params, Mapping) and "momentum" in compression_params \
                and "momentum_mu" not in compression_params:
            mu = _hyper(optimizer, optimizer_params, "momentum")
        self._bps_kwargs = core_compression.compression_kwargs(compression_params, mu)
        self._bps_mu = core_compression.nesterov_mu(self._bps_kwargs)
        self._bps_wd = None
        if self._bps_mu is not None:
            if self._bps_kwargs["compressor_type"] == "onebit":
                self._bps_wd = _hyper(optimizer, optimizer_params, "wd")
                _remove_hyper(optimizer, optimizer_params, "wd")
            _remove_hyper(optimizer, optimizer_params, "momentum")
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
        # what the core compresses (a push of at least this many bytes, in this job)
        threshold = (core_compression.min_compress_bytes()
                     if core_compression.core_compresses("float32", 1 << 62) else math.inf)
        self._bps_compressors = []
        for i, param in enumerate(self._params):
            ops.byteps_declare_tensor(self._bps_param_names[i])
            comp = intra
            if param.grad_req != "null":
                wire = np.dtype(np.float16 if intra is Compression.fp16
                                and np.dtype(param.dtype).type in (np.float32, np.float64)
                                else param.dtype)
                core_compression.declare(self._bps_grad_names[i], self._bps_kwargs,
                                         ops._DTYPE_NAMES.get(wire.type, ""))
                if self._bps_wd is not None:
                    comp = Compression.wdmom(comp, self._bps_mu, self._bps_wd, threshold)
                if self._bps_mu is not None:
                    comp = Compression.nag(comp, self._bps_mu, threshold)
            self._bps_compressors.append(comp)

    def step(self, batch_size, ignore_stale_grad=False):
        """As ``gluon.Trainer.step``. With core compression (upstream): the gradients are
        scaled by ``1/(batch_size * size())`` before the push_pull instead of by the
        optimizer's ``rescale_grad``. Asynchronous training: the local update, then the
        exchange of its deltas for the servers' parameters."""
        if self._bps_async:
            if self._params_to_init:
                self._init_params()
            self._bps_async_weights().step(
                lambda: mx.gluon.Trainer.step(self, batch_size, ignore_stale_grad))
            return
        if self._bps_kwargs:
            self._scale = batch_size
        super().step(batch_size, ignore_stale_grad)

    def _bps_async_weights(self) -> _async.AsyncWeights:
        """The trainable, initialised weights under their asynchronous names."""
        named = [(self._bps_param_names[i], p.list_data()[0])
                 for i, p in enumerate(self._params)
                 if p.grad_req != "null" and not p._deferred_init and p._data is not None]
        return _async.AsyncWeights(named)

    def _init_params(self):
        """Broadcast every initialised parameter from ``root_rank`` (deferred ones wait for a
        later step), then wait until all of them hold the root's values."""
        ready = [p for p in self._params_to_init if not p._deferred_init]
        broadcast_copies([(self._bps_param_names[self._param2idx[p.name]],
                           p._check_and_get(p._data, list)) for p in ready], self._bps_root)
        self._params_to_init = [p for p in self._params_to_init if p._deferred_init]

    def _allreduce_grads(self):
        if self._bps_async:
            return  # asynchronous training: the gradients stay local
        if self._bps_kwargs and self.learning_rate and float(self.learning_rate) > 0:
            _basics.set_learning_rate(float(self.learning_rate))
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = param.list_grad()[0]
            data = param.list_data()[0]
            if param.grad_req == "write" and not data._fresh_grad:
                grad[:] = 0  # no gradient on this rank: contribute zeros
            comp = self._bps_compressors[i]
            if self._bps_kwargs:
                # upstream: normalised by batch size and worker count before the (summing)
                # push_pull, so the core compresses g / (batch_size * size)
                grad *= 1.0 / (self._scale * ops.size())
                compressed, ctx = comp.compress(grad)
                ops.byteps_push_pull(compressed, is_average=False, name=self._bps_grad_names[i])
                restored = comp.decompress(compressed, ctx, x=data)
                if restored is not grad:
                    restored.copyto(grad)
            else:
                push_pull_compressed(grad, lambda _t, i=i: self._bps_grad_names[i], comp)
            data._fresh_grad = True  # it now holds the average of every rank's gradient
