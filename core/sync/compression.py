"""Gradient compression settings shared by every adapter (``byteps.sync.compression``).

Upstream BytePS let its MXNet ``DistributedTrainer`` take a ``compression_params`` dict
(``{"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "scaling": True}``) and
turned it into keyword arguments of the C++ compressors. Here every adapter's distributed
optimizer takes the same dict; :func:`compression_kwargs` translates and checks it, and the
adapters declare each gradient with the result (``byteps.basics.declare(name,
compression=kwargs)``) before its first push_pull.

What a step applies (two-level compression, upstream's scheme). With ``n`` workers and
gradient ``g_i`` on worker ``i``, each worker compresses ``g_i / n`` (the 1/n of averaging is
applied *before* compressing), the server decompresses every push, sums, and compresses the
sum once more; every worker decompresses what it pulls. An SGD step therefore applies
``C_s(sum_i C_w(g_i / n))``, where ``C_w`` and ``C_s`` are the worker's and the server's
compress-then-decompress round trips; each keeps its own state (error-feedback residual,
momentum, random numbers) from step to step. Compression runs only in a distributed job
(``DMLC_NUM_WORKER > 1`` or ``BYTEPS_FORCE_DISTRIBUTED=1``) and only for float16, float32 and
float64 tensors of at least ``BYTEPS_MIN_COMPRESS_BYTES`` bytes (default 65536, upstream's);
other tensors are summed exactly. It runs per partition of a tensor (``BYTEPS_PARTITION_BYTES``),
so e.g. onebit's scale is the mean of ``|x|`` over one partition.

Also here, for the adapters: whether the core compresses a given tensor
(:func:`core_compresses`), the Nesterov momentum that adapters apply themselves to the
gradients the core does not compress (:class:`NesterovMomentum`, upstream's MXNet
``Compression.nag``), and :func:`declare`.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Dict, Mapping, Optional

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "COMPRESSORS",
    "compression_kwargs",
    "wants_fp16",
    "nesterov_mu",
    "min_compress_bytes",
    "core_compresses",
    "declare",
    "NesterovMomentum",
]

#: Values of the ``compressor`` key.
COMPRESSORS = ("onebit", "topk", "randomk", "dithering", "fp16")
#: dtype names the core's compressors take (others are summed exactly).
COMPRESSIBLE_DTYPES = ("float16", "float32", "float64")

_EF_TYPES = ("vanilla",)
_MOMENTUM_TYPES = ("nesterov",)
_PARTITIONS = {"linear": "0", "natural": "1"}
_NORMALIZES = {"max": "0", "l2": "1"}
# key -> the compressors it applies to (None: every compressor)
_APPLIES_TO: Dict[str, Optional[tuple]] = {
    "compressor": None,
    "ef": None,
    "momentum": None,
    "momentum_mu": None,
    "fp16": None,
    "scaling": ("onebit",),
    "k": ("topk", "randomk", "dithering"),
    "seed": ("randomk", "dithering"),
    "partition": ("dithering",),
    "normalize": ("dithering",),
}
_FN = "compression_params"


def _str_value(params: Mapping, key: str, allowed) -> str:
    value = params[key]
    if not isinstance(value, str):
        raise InvalidTypeError(f"{_FN}[{key!r}] must be a str (one of {', '.join(allowed)}), "
                               f"got {type(value).__name__} {value!r}")
    low = value.lower()  # upstream lower-cased every string value
    if low not in allowed:
        raise InvalidArgumentError(f"{_FN}[{key!r}]: unknown value {value!r}; expected one of "
                                   f"{', '.join(allowed)}")
    return low


def _bool_value(params: Mapping, key: str) -> bool:
    value = params[key]
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{_FN}[{key!r}] must be a bool, got {type(value).__name__} "
                               f"{value!r}")
    return bool(value)


def _number(params: Mapping, key: str) -> float:
    value = params[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"{_FN}[{key!r}] must be a number, got {type(value).__name__} "
                               f"{value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{_FN}[{key!r}] must be finite, got {value}")
    return value


def _k_text(params: Mapping, compressor: str) -> str:
    if "k" not in params:
        raise InvalidArgumentError(f"{_FN}: compressor {compressor!r} needs 'k' ("
                                   + ("the number of quantisation levels s" if compressor ==
                                      "dithering" else "elements kept: a count >= 1, or a "
                                      "fraction in (0, 1) of the elements") + ")")
    k = _number(params, "k")
    if compressor == "dithering":
        if k < 1 or not k.is_integer():
            raise InvalidArgumentError(f"{_FN}['k']: dithering needs an integer number of "
                                       f"levels >= 1, got {params['k']!r}")
        return str(int(k))
    if k <= 0:
        raise InvalidArgumentError(f"{_FN}['k'] must be > 0, got {params['k']!r}")
    if k < 1:
        return repr(k)  # a fraction of the partition's elements (at least one is kept)
    if not k.is_integer():
        raise InvalidArgumentError(f"{_FN}['k']: a count of elements must be an integer "
                                   f"(or a fraction < 1), got {params['k']!r}")
    return str(int(k))


def _mu_text(value: Any, where: str) -> str:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"{where} must be a number, got {type(value).__name__} {value!r}")
    mu = float(value)
    if not (0.0 <= mu < 1.0):
        raise InvalidArgumentError(f"{where} must be in [0, 1), got {value!r}")
    return repr(mu)


def compression_kwargs(params: Optional[Mapping[str, Any]],
                       momentum_mu: Optional[float] = None) -> Dict[str, str]:
    """Translate a user's ``compression_params`` dict into the core's compressor kwargs.

    Keys of ``params`` (upstream's MXNet ``DistributedTrainer`` keys; string values are
    case-insensitive, as upstream lower-cased them):

    * ``compressor``: ``"onebit"`` (sign bits and one scale per partition), ``"topk"`` (the
      k largest magnitudes), ``"randomk"`` (k random elements), ``"dithering"`` (stochastic
      quantisation to k levels) or ``"fp16"`` (float16 on the wire, done by the core) ->
      ``compressor_type``. Without it nothing is compressed by the core (only ``fp16`` may be
      given then).
    * ``ef``: ``"vanilla"`` error feedback (the residual of each compression is added to the
      next gradient, scaled by previous_lr / lr) -> ``ef_type``.
    * ``momentum``: ``"nesterov"`` momentum applied by the core on each worker before
      compressing -> ``momentum_type``; needs mu (``momentum_mu`` below). The framework's own
      momentum must then be 0: the adapters take it from the optimizer and set it to 0.
    * ``momentum_mu``: mu in [0, 1) (default: the ``momentum_mu`` argument, which adapters
      take from the optimizer) -> ``momentum_mu``; only with ``momentum``.
    * ``scaling`` (onebit): bool, default False: decode to ``±mean(|x|)`` instead of ``±1``
      -> ``compressor_onebit_scaling`` ("true"/"false", always set for onebit).
    * ``k`` (topk, randomk: required; a count >= 1 or a fraction in (0, 1) of each partition's
      elements; dithering: required, integer levels >= 1) -> ``compressor_k``.
    * ``seed`` (randomk, dithering): int >= 1, default: the core's -> ``seed``.
    * ``partition`` (dithering): ``"linear"`` -> ``"0"``, ``"natural"`` -> ``"1"`` ->
      ``dithering_partition``.
    * ``normalize`` (dithering): ``"max"`` -> ``"0"``, ``"l2"`` -> ``"1"`` ->
      ``dithering_normalize``.
    * ``fp16``: bool: the adapter's own float16 cast around the push_pull
      (``Compression.fp16``, upstream's "intra" compression), in addition to the above; it is
      not a core kwarg (see :func:`wants_fp16`).

    Args:
        params: the dict, or None / empty for no compression.
        momentum_mu: mu to use for ``momentum`` when ``params`` has no ``momentum_mu``.

    Returns:
        ``{kwarg: str}`` with the keys ``compressor_type``, ``compressor_k``,
        ``compressor_onebit_scaling``, ``seed``, ``dithering_partition``,
        ``dithering_normalize``, ``ef_type``, ``momentum_type``, ``momentum_mu`` as set; ``{}``
        when the core is not to compress.

    Raises:
        byteps.errors.InvalidArgumentError (a ValueError): an unknown key; an unknown
            ``compressor``/``ef``/``momentum``/``partition``/``normalize`` value (upstream: a
            ValueError for partition/normalize, silently ignored otherwise); a key that does
            not apply to the compressor (e.g. ``k`` with onebit) or given without
            ``compressor``; ``k`` missing (upstream: KeyError) or out of range; ``seed`` < 1;
            ``momentum`` without a mu, or mu outside [0, 1).
        byteps.errors.InvalidTypeError (a TypeError): ``params`` is not a mapping; a value of
            the wrong type (a non-str ``compressor``, as upstream, a non-bool ``scaling`` or
            ``fp16``, a non-number ``k``, a non-int ``seed``).
    """
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InvalidTypeError(f"{_FN} must be a dict or None, got {type(params).__name__}")
    unknown = sorted(str(k) for k in params if k not in _APPLIES_TO)
    if unknown:
        raise InvalidArgumentError(f"{_FN}: unknown key(s) {unknown}; known keys: "
                                   f"{', '.join(_APPLIES_TO)}")
    if "fp16" in params:
        _bool_value(params, "fp16")
    if "compressor" not in params:
        extra = sorted(k for k in params if k != "fp16")
        if extra:
            raise InvalidArgumentError(f"{_FN}: {extra} given without 'compressor' (one of "
                                       f"{', '.join(COMPRESSORS)})")
        return {}
    compressor = _str_value(params, "compressor", COMPRESSORS)
    for key, only in _APPLIES_TO.items():
        if key in params and only is not None and compressor not in only:
            raise InvalidArgumentError(f"{_FN}[{key!r}] applies to {', '.join(only)} only, not "
                                       f"to compressor {compressor!r}")
    out: Dict[str, str] = {"compressor_type": compressor}
    if compressor == "onebit":
        scaling = _bool_value(params, "scaling") if "scaling" in params else False
        out["compressor_onebit_scaling"] = "true" if scaling else "false"
    if compressor in ("topk", "randomk", "dithering"):
        out["compressor_k"] = _k_text(params, compressor)
    if "seed" in params:
        seed = params["seed"]
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
            raise InvalidTypeError(f"{_FN}['seed'] must be an int, got {type(seed).__name__} "
                                   f"{seed!r}")
        if not 1 <= int(seed) < 1 << 64:
            raise InvalidArgumentError(f"{_FN}['seed'] must be in [1, 2**64), got {seed!r}")
        out["seed"] = str(int(seed))
    if "partition" in params:
        out["dithering_partition"] = _PARTITIONS[_str_value(params, "partition",
                                                            tuple(_PARTITIONS))]
    if "normalize" in params:
        out["dithering_normalize"] = _NORMALIZES[_str_value(params, "normalize",
                                                            tuple(_NORMALIZES))]
    if "ef" in params:
        out["ef_type"] = _str_value(params, "ef", _EF_TYPES)
    if "momentum" in params:
        out["momentum_type"] = _str_value(params, "momentum", _MOMENTUM_TYPES)
        if "momentum_mu" in params:
            out["momentum_mu"] = _mu_text(params["momentum_mu"], f"{_FN}['momentum_mu']")
        elif momentum_mu is not None:
            out["momentum_mu"] = _mu_text(momentum_mu, "the optimizer's momentum")
        else:
            raise InvalidArgumentError(
                f"{_FN}: momentum {out['momentum_type']!r} needs mu: give 'momentum_mu' or "
                "use an optimizer with a momentum")
    elif "momentum_mu" in params:
        raise InvalidArgumentError(f"{_FN}: 'momentum_mu' given without 'momentum'")
    return out


def wants_fp16(params: Optional[Mapping[str, Any]]) -> bool:
    """True if ``params`` asks for the adapters' float16 cast (``"fp16": True``).

    Raises:
        byteps.errors.InvalidTypeError: ``params`` is not a mapping, or ``fp16`` not a bool.
    """
    if params is None:
        return False
    if not isinstance(params, Mapping):
        raise InvalidTypeError(f"{_FN} must be a dict or None, got {type(params).__name__}")
    return _bool_value(params, "fp16") if "fp16" in params else False


def nesterov_mu(kwargs: Mapping[str, str]) -> Optional[float]:
    """mu of the core's Nesterov momentum in ``kwargs`` (from :func:`compression_kwargs`), or
    None when ``kwargs`` has no momentum."""
    if kwargs.get("momentum_type") != "nesterov":
        return None
    return float(kwargs["momentum_mu"])


def min_compress_bytes() -> int:
    """``BYTEPS_MIN_COMPRESS_BYTES`` as the core reads it (default 65536): tensors with fewer
    bytes are not compressed.

    Raises:
        byteps.errors.ConfigError: the variable is malformed (where the core validates it).
    """
    from .. import _core

    return int(_core.knob_values(dict(os.environ))["BYTEPS_MIN_COMPRESS_BYTES"])


def _distributed() -> bool:
    from .. import _core

    if _core.is_initialized() and hasattr(_core, "is_distributed"):
        return bool(_core.is_distributed())
    knobs = _core.knob_values(dict(os.environ))
    return int(knobs["DMLC_NUM_WORKER"]) > 1 or knobs["BYTEPS_FORCE_DISTRIBUTED"] not in ("", "0")


def core_compresses(dtype: str, nbytes: int) -> bool:
    """Whether the core compresses a tensor of ``dtype`` (a core dtype name) and ``nbytes``
    bytes that was declared with compressor kwargs: in a distributed job, for float16/32/64
    tensors of at least :func:`min_compress_bytes` bytes (upstream: ``size >=
    BYTEPS_MIN_COMPRESS_BYTES``)."""
    return (dtype in COMPRESSIBLE_DTYPES and int(nbytes) >= min_compress_bytes()
            and _distributed())


def declare(name: str, kwargs: Optional[Mapping[str, str]], dtype: str,
            process_set=None) -> int:
    """Declare ``name`` with compressor ``kwargs`` when they are non-empty and ``dtype`` is one
    the compressors take (float16/32/64), else plainly; returns the key. Must run before the
    name's first push_pull (the kwargs are part of the declaration, compared across workers:
    a mismatch raises MismatchError on every rank at the first push_pull). ``process_set``:
    declared among a ``ProcessSet``'s ranks (None: every rank).

    Raises:
        byteps.errors.InvalidArgumentError: the core refuses the kwargs.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    from .. import basics  # looked up per call (tests may stand in for the core)

    if kwargs and dtype in COMPRESSIBLE_DTYPES:
        return basics.declare(name, compression=dict(kwargs), process_set=process_set)
    return basics.declare(name, process_set=process_set)


class NesterovMomentum:
    """Nesterov momentum on NumPy arrays, for the gradients the core does not compress when
    the core's ``momentum: nesterov`` replaced the optimizer's momentum (upstream MXNet's
    ``Compression.nag``): per key, ``m = mu * m + g``, then ``g += mu * m`` (in place; ``m``
    starts at zero and has ``g``'s dtype and shape).

    Args:
        mu: the momentum, in [0, 1).
        buffers: the dict (key -> momentum array) to keep the state in; default a new one.
            Adapters whose gradient wrappers live for one step (a TensorFlow tape) pass a
            process-wide dict keyed by tensor name.
    """

    def __init__(self, mu: float, buffers: Optional[Dict[Any, np.ndarray]] = None):
        self.mu = float(mu)
        self._m: Dict[Any, np.ndarray] = {} if buffers is None else buffers

    def apply(self, key: Any, grad: np.ndarray) -> None:
        """Apply one step to ``grad`` (a writable float array), in place.

        Raises:
            byteps.errors.InvalidArgumentError: ``grad``'s shape or dtype differs from the
                previous step's for ``key``.
        """
        m = self._m.get(key)
        if m is None:
            m = self._m[key] = np.zeros_like(grad)
        elif m.shape != grad.shape or m.dtype != grad.dtype:
            raise InvalidArgumentError(f"Nesterov momentum of {key!r}: the gradient changed "
                                       f"from {m.dtype}{m.shape} to {grad.dtype}{grad.shape}")
        m *= m.dtype.type(self.mu)
        m += grad
        grad += m.dtype.type(self.mu) * m
