"""Gradient compression applied in Python before and after push_pull (upstream
``byteps/torch/compression.py``, same interface as Horovod's).

A compressor is a pair of static functions::

    compressed, ctx = Compressor.compress(tensor)
    tensor_again = Compressor.decompress(compressed, ctx)

``compress`` returns the tensor to reduce and a context that ``decompress`` needs to restore
the original dtype. They run framework-side, around the push_pull; the core's own
compressors (upstream's onebit, topk, ... in two levels, worker and server) are selected with
``DistributedOptimizer(compression_params=...)`` (:mod:`byteps.sync.compression`), and
``Compression.fp16`` may be combined with them (``"fp16": True``).
"""

from __future__ import annotations

from typing import Any, Tuple

import torch

from byteps.sync.compressor_interface import Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (halves the bytes on the wire).

    ``compress`` casts float32/float64/bfloat16 tensors to float16 (a new tensor; float16
    tensors are returned as they are) and keeps the original dtype as ``ctx``; integer tensors
    pass through unchanged. ``decompress`` casts back to the original floating dtype. Values
    beyond the float16 range (|x| > 65504) become inf, as upstream. The cast is differentiable,
    so this also works inside :func:`byteps.torch.push_pull`.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """Return ``(tensor as float16, original dtype)`` for floating tensors, else
        ``(tensor, original dtype)``."""
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Cast ``tensor`` back to the dtype recorded in ``ctx`` (if it was floating)."""
        dtype = ctx
        if dtype is not None and dtype.is_floating_point and tensor.dtype != dtype:
            return tensor.to(dtype)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    #: No compression.
    none = NoneCompressor
    #: Cast floating-point tensors to float16 for the reduction.
    fp16 = FP16Compressor
