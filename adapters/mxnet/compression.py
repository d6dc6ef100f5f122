"""Gradient compression applied around push_pull, for MXNet NDArrays (upstream
``byteps/mxnet/compression.py``; the interface of ``byteps.torch.Compression``).

A compressor is a pair of static functions::

    compressed, ctx = Compressor.compress(tensor)
    tensor_again = Compressor.decompress(compressed, ctx)

Both are MXNet engine operations (``astype``), so they are ordered with the push_pull between
them like any other NDArray operation. Upstream's ``nag``/``wdmom`` adapters belong to its
server-side compressors (onebit, top-k...), which this build does not have.
"""

from __future__ import annotations

from typing import Any, Tuple

import mxnet as mx
import numpy as np

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]

_FLOATS = (np.float32, np.float64)


class Compressor:
    """Interface for compressing and decompressing an NDArray around push_pull."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        """Compress ``tensor``; returns ``(compressed_tensor, ctx)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        """Undo :meth:`compress` given the ``ctx`` it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: ``compress`` returns the tensor itself and ``None``."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        """Return ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
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
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        """Cast ``tensor`` back to the dtype recorded in ``ctx`` (if it was float32/64)."""
        if ctx in _FLOATS and np.dtype(tensor.dtype).type != ctx:
            return tensor.astype(ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    #: No compression.
    none = NoneCompressor
    #: Cast float32/float64 NDArrays to float16 for the reduction.
    fp16 = FP16Compressor
