"""Gradient compression applied around push_pull (upstream ``byteps/tensorflow/compression.py``,
same interface as Horovod's).

A compressor is a pair of static functions::

    compressed, ctx = Compressor.compress(tensor)
    tensor_again = Compressor.decompress(compressed, ctx)

They are TensorFlow ops (``tf.cast``), so they work eagerly, inside ``tf.function`` and under a
gradient tape. The core's own compressors (upstream's onebit, topk, ... in two levels, worker
and server) are selected with ``compression_params`` of ``DistributedOptimizer`` and
``DistributedGradientTape`` (:mod:`byteps.sync.compression`); ``Compression.fp16`` may be combined
with them (``"fp16": True``).
"""

from __future__ import annotations

from typing import Any, Tuple

import tensorflow as tf
from byteps.sync.compressor_interface import Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (halves the bytes on the wire).

    ``compress`` casts float32/float64/bfloat16 tensors to float16 and keeps the original dtype
    as ``ctx``; float16 and integer tensors pass through unchanged (same object).
    ``decompress`` casts back. Values beyond the float16 range (|x| > 65504) become inf, as
    upstream. ``tf.cast`` is differentiable, so this works under a gradient tape.
    """

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        """Return ``(tensor as float16, original dtype)`` for floating tensors, else
        ``(tensor, original dtype)``."""
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """Cast ``tensor`` back to the dtype recorded in ``ctx`` (if it was floating)."""
        dtype = ctx
        if dtype is not None and dtype.is_floating and tensor.dtype != dtype:
            return tf.cast(tensor, dtype)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    #: No compression.
    none = NoneCompressor
    #: Cast floating-point tensors to float16 for the reduction.
    fp16 = FP16Compressor
