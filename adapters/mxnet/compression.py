"""Gradient compression applied around push_pull, for MXNet NDArrays (upstream
``byteps/mxnet/compression.py``; the interface of ``byteps.torch.Compression``).

A compressor is a pair of static functions::

    compressed, ctx = Compressor.compress(tensor)
    tensor_again = Compressor.decompress(compressed, ctx)

Both are MXNet engine operations (``astype``), so they are ordered with the push_pull between
them like any other NDArray operation. ``Compression.nag`` and ``Compression.wdmom`` are
upstream's adapters that :class:`~byteps.mxnet.DistributedTrainer` wraps around them when
``compression_params`` moves the optimizer's momentum into the core (``momentum:
nesterov``): Nesterov momentum for the gradients the core does not compress, and momentum on
the weight decay (onebit). They keep per-tensor state: one instance per parameter.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import mxnet as mx
import numpy as np

from byteps.errors import InvalidArgumentError

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "NagAdapter",
           "WeightDecayMomentumAdapter", "Compression"]

_FLOATS = (np.float32, np.float64)
_COMPRESSIBLE = (np.float16, np.float32, np.float64)


class Compressor:
    """Interface for compressing and decompressing an NDArray around push_pull."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        """Compress ``tensor``; returns ``(compressed_tensor, ctx)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any, **kwargs) -> mx.nd.NDArray:
        """Undo :meth:`compress` given the ``ctx`` it returned (``kwargs``: e.g. ``x``, the
        parameter, for :class:`WeightDecayMomentumAdapter`)."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: ``compress`` returns the tensor itself and ``None``."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        """Return ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any, **kwargs) -> mx.nd.NDArray:
        """Return ``tensor`` unchanged."""
        return tensor


class FP16Compressor(Compressor):
    """Send float32/float64 NDArrays as float16 (half the bytes on the wire).

    ``compress`` returns a new float16 NDArray for float32/float64 input (float16 and integer
    NDArrays pass through unchanged) and the original dtype as ``ctx``; ``decompress`` casts
    back. Values beyond the float16 range (|x| > 65504) become inf, as upstream.
    """

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        """Return ``(tensor as float16, original dtype)`` for float32/float64, else
        ``(tensor, original dtype)``."""
        dtype = np.dtype(tensor.dtype).type
        if dtype in _FLOATS:
            return tensor.astype(np.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any, **kwargs) -> mx.nd.NDArray:
        """Cast ``tensor`` back to the dtype recorded in ``ctx`` (if it was float32/64)."""
        if ctx in _FLOATS and np.dtype(tensor.dtype).type != ctx:
            return tensor.astype(ctx)
        return tensor


class _Adapter(Compressor):
    """Wraps another compressor; decides on the first :meth:`compress` whether the core
    compresses this tensor: a float16/32/64 push of at least ``threshold`` bytes (upstream's
    ``BYTEPS_MIN_COMPRESS_BYTES`` rule, on the bytes actually pushed, i.e. after the inner
    compressor; ``threshold=math.inf``: never, as in a job that is not distributed)."""

    def __init__(self, compressor, threshold: float):
        self.compressor = compressor
        self.threshold = threshold
        self.core_compressed: Optional[bool] = None

    def compress(self, tensor: mx.nd.NDArray, *args, **kwargs) -> Tuple[mx.nd.NDArray, Any]:
        """The inner compressor's ``compress`` (notes whether the core compresses the result)."""
        out, ctx = self.compressor.compress(tensor)
        if self.core_compressed is None:
            dtype = np.dtype(out.dtype)
            self.core_compressed = (dtype.type in _COMPRESSIBLE
                                    and out.size * dtype.itemsize >= self.threshold)
        return out, ctx


class NagAdapter(_Adapter):
    """Nesterov momentum for gradients the core does not compress (upstream MXNet's
    ``Compression.nag``): with ``momentum: nesterov`` the core applies the momentum before
    compressing, and the optimizer's own momentum is removed, so the tensors the core leaves
    uncompressed (below ``threshold`` bytes) get it here, after the reduction:
    ``m = mu*m + g; g += mu*m`` (upstream's ``m' = mu*(m + g); g += m'``, the same update).

    Args:
        compressor: the inner compressor (e.g. ``Compression.fp16``).
        mu: the momentum.
        threshold: the core compresses pushes of at least this many bytes.
    """

    def __init__(self, compressor, mu: float, threshold: float, *args, **kwargs):
        super().__init__(compressor, threshold)
        self.mu = float(mu)
        self.mom: Optional[mx.nd.NDArray] = None

    def decompress(self, tensor: mx.nd.NDArray, ctx: Any, *args, **kwargs) -> mx.nd.NDArray:
        """The inner ``decompress``, then the momentum step if the core did not compress."""
        tensor = self.compressor.decompress(tensor, ctx, **kwargs)
        if self.core_compressed is False:
            if self.mom is None:
                self.mom = mx.nd.zeros_like(tensor)
            self.mom *= self.mu
            self.mom += tensor
            tensor += self.mu * self.mom
        return tensor


class WeightDecayMomentumAdapter(_Adapter):
    """Weight decay applied to the reduced gradient, with momentum for the tensors the core
    compresses (upstream MXNet's ``Compression.wdmom``, used with onebit: the optimizer's
    ``wd`` is removed). ``decompress(tensor, ctx, x=weight)`` adds ``wd * x`` to every tensor
    and, for compressed ones, ``mom = mu * (mom + wd * x)``, ``tensor += mom`` first; then the
    inner ``decompress``.

    Args:
        compressor: the inner compressor.
        mu: the momentum.
        wd: the weight decay.
        threshold: the core compresses pushes of at least this many bytes.

    Raises:
        byteps.errors.InvalidArgumentError: ``decompress`` without ``x`` (upstream: ValueError).
    """

    def __init__(self, compressor, mu: float, wd: float, threshold: float, *args, **kwargs):
        super().__init__(compressor, threshold)
        self.mu = float(mu)
        self.wd = float(wd)
        self.mom: Optional[mx.nd.NDArray] = None

    def decompress(self, tensor: mx.nd.NDArray, ctx: Any, *args, **kwargs) -> mx.nd.NDArray:
        """Add the (momentum of the) weight decay, then the inner ``decompress``."""
        if "x" not in kwargs:
            raise InvalidArgumentError("WeightDecayMomentumAdapter.decompress: x (the "
                                       "parameter) is missing")
        cache = kwargs["x"].astype(tensor.dtype, copy=False) * self.wd
        if self.core_compressed:
            if self.mom is None:
                self.mom = mx.nd.zeros_like(tensor)
            self.mom += cache
            self.mom *= self.mu
            tensor += self.mom
        tensor += cache
        return self.compressor.decompress(tensor, ctx, **kwargs)


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``, and upstream's
    adapters ``Compression.nag(compressor, mu, threshold)`` and ``Compression.wdmom(
    compressor, mu, wd, threshold)`` (classes: one instance per tensor)."""

    #: No compression.
    none = NoneCompressor
    #: Cast float32/float64 NDArrays to float16 for the reduction.
    fp16 = FP16Compressor
    #: Nesterov momentum for tensors the core does not compress (a class).
    nag = NagAdapter
    #: Momentum on the weight decay for tensors the core compresses (a class, onebit).
    wdmom = WeightDecayMomentumAdapter


#: ``threshold`` of the adapters in a job where the core compresses nothing.
NEVER = math.inf
