"""What the TensorFlow/Keras distributed optimizers and tape do with ``compression_params``
(upstream MXNet's dict, :func:`byteps.sync.compression.compression_kwargs`): one
:class:`CompressionPlan` per optimizer or tape, consulted by :func:`byteps.tensorflow.ops.
push_pull_gradients` where gradient names are declared, before a step's push_pulls start (the
learning rate) and after they finish (Nesterov momentum of the gradients the core does not
compress). Everything here runs in Python, eagerly or inside the one ``tf.numpy_function`` of a
step, so it works in ``tf.function`` and ``model.fit`` alike.
"""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any, Dict, Mapping, Optional

import numpy as np

import byteps.sync.compression as core_compression
from byteps import basics as _b
from byteps.errors import InvalidArgumentError

from .compression import Compression

__all__ = ["CompressionPlan", "make_plan", "resolve_intra"]

# Nesterov momentum buffers of uncompressed gradients, by tensor name: process-wide, since a
# DistributedGradientTape (and so its plan) usually lives for one step only.
_MOMENTA: Dict[str, np.ndarray] = {}
_LOCK = threading.Lock()


def resolve_intra(compression, params: Optional[Mapping[str, Any]]):
    """The framework-side compressor: ``compression``, or ``Compression.fp16`` when ``params``
    says ``"fp16": True``.

    Raises:
        byteps.errors.InvalidArgumentError: ``"fp16": True`` with another compressor than
            none/fp16.
        byteps.errors.InvalidTypeError: ``params`` not a mapping or ``fp16`` not a bool.
    """
    if compression is None:
        compression = Compression.none
    if core_compression.wants_fp16(params):
        if compression is Compression.none:
            return Compression.fp16
        if compression is not Compression.fp16:
            raise InvalidArgumentError(
                "compression_params {'fp16': True} selects Compression.fp16, but compression="
                f"{getattr(compression, '__name__', compression)!r} was given too")
    return compression


class CompressionPlan:
    """The core's compressor kwargs of one optimizer's (or tape's) gradients, and the state
    that goes with them.

    Args:
        kwargs: from :func:`byteps.sync.compression.compression_kwargs` (non-empty).
    """

    def __init__(self, kwargs: Dict[str, str]):
        self.kwargs = dict(kwargs)
        self.mu = core_compression.nesterov_mu(self.kwargs)
        self._nag = (core_compression.NesterovMomentum(self.mu, _MOMENTA)
                     if self.mu is not None else None)
        self._adapter_nag: Dict[str, bool] = {}  # name -> Nesterov applied here
        self._lock = threading.Lock()

    def declare(self, name: str, dtype: str, nbytes: int) -> None:
        """Declare ``name`` (core dtype ``dtype``, ``nbytes`` bytes) with the kwargs (float
        dtypes) before its first push_pull, and note whether its momentum is applied here."""
        core_compression.declare(name, self.kwargs, dtype)
        if self._nag is not None:
            with self._lock:
                self._adapter_nag[name] = not core_compression.core_compresses(dtype, nbytes)

    @staticmethod
    def set_learning_rate(lr: Optional[float]) -> None:
        """Hand the step's learning rate to the core (error feedback); ``None``/non-positive:
        unknown, nothing is sent."""
        if lr is not None and math.isfinite(lr) and lr > 0:
            _b.set_learning_rate(float(lr))

    def finish(self, name: str, out: np.ndarray) -> None:
        """Nesterov momentum of a reduced gradient the core did not compress (in place)."""
        if self._nag is not None and self._adapter_nag.get(name):
            with _LOCK:
                self._nag.apply(name, out)


def make_plan(params: Optional[Mapping[str, Any]],
              momentum_mu: Optional[float] = None) -> Optional[CompressionPlan]:
    """A :class:`CompressionPlan` for ``params``, or None when the core is not to compress.

    Raises:
        as :func:`byteps.sync.compression.compression_kwargs`.
    """
    kwargs = core_compression.compression_kwargs(params, momentum_mu)
    return CompressionPlan(kwargs) if kwargs else None


def needs_optimizer_mu(params: Optional[Mapping[str, Any]]) -> bool:
    """True if ``params`` asks for the core's momentum without giving its mu."""
    return isinstance(params, Mapping) and "momentum" in params and "momentum_mu" not in params


def warn_momentum_moved(old: float, mu: float) -> None:
    warnings.warn(
        f"compression_params momentum 'nesterov' (mu={mu}): the optimizer's momentum {old} is "
        "set to 0; byteps applies Nesterov momentum to the gradients instead (in the core "
        "before compressing, or after the reduction for gradients the core does not "
        "compress)", stacklevel=4)
