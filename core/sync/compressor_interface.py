"""The framework-side compressor interface of the torch and TensorFlow adapters (upstream's
``byteps/{torch,tensorflow}/compression.py``, Horovod's interface): a pair of static functions
run around push_pull, ``compressed, ctx = C.compress(tensor)`` and
``tensor_again = C.decompress(compressed, ctx)``. Each adapter adds its ``FP16Compressor`` and
``Compression``; the core's own compressors are :mod:`byteps.sync.compression`."""

from __future__ import annotations

from typing import Any, Tuple

__all__ = ["Compressor", "NoneCompressor"]


class Compressor:
    """Interface for compressing and decompressing a tensor (a framework tensor: torch.Tensor,
    tf.Tensor) around push_pull."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        """Compress ``tensor``; returns ``(compressed_tensor, ctx)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Undo :meth:`compress` given the ``ctx`` it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: ``compress`` returns the tensor itself (same object) and ``None``."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        """Return ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Return ``tensor`` unchanged."""
        return tensor
