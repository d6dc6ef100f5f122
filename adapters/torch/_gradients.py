"""Helpers shared by the modules that reduce gradients (:mod:`byteps.torch.optimizer`'s
``DistributedOptimizer`` and :mod:`byteps.torch.parallel`'s ``DistributedDataParallel``):
parameter naming, compression resolution, and declaration of the gradient names.
"""

from __future__ import annotations

import collections
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

import byteps.sync.compression as core_compression
from byteps.errors import InvalidArgumentError, InvalidTypeError

from . import ops
from .compression import Compression

__all__ = ["name_parameters", "resolve_compression", "declare_gradients",
           "uncompressed_by_core"]


def name_parameters(named_parameters: Optional[Iterable], param_groups: List[dict]
                    ) -> Dict[torch.Tensor, str]:
    """Map every parameter of ``param_groups`` to its name; validates ``named_parameters``.

    Args:
        named_parameters: a sequence (or dict) of ``(name, tensor)`` pairs with unique names,
            or None (parameters are then named ``noname.<i>`` by position across all groups).
        param_groups: ``[{"params": [tensor, ...]}, ...]`` (an optimizer's groups).

    Returns:
        ``{parameter: name}`` in the order of ``param_groups``.

    Raises:
        InvalidArgumentError (a ValueError): not a sequence of ``(str, tensor)`` tuples,
            duplicate names, or a parameter of ``param_groups`` without a name.
    """
    all_params = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        # Upstream numbered within each group, so names collided across groups.
        return {p: f"noname.{i}" for i, p in enumerate(all_params)}
    if isinstance(named_parameters, dict):
        named = list(named_parameters.items())
    else:
        try:
            named = list(named_parameters)
        except TypeError:
            raise InvalidArgumentError(
                "named_parameters should be a sequence of (name, parameter) tuples, usually "
                f"model.named_parameters(); got {type(named_parameters).__name__}"
            ) from None
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise InvalidArgumentError(
                "named_parameters should be a sequence of (name, parameter) tuples, usually "
                f"model.named_parameters(); found an element of type {type(item).__name__}"
            )
    counts = collections.Counter(name for name, _ in named)
    dups = sorted(name for name, c in counts.items() if c > 1)
    if dups:
        raise InvalidArgumentError(
            f"parameter names in named_parameters must be unique; duplicates: {dups}")
    names: Dict[torch.Tensor, str] = {}
    for name, p in sorted(named, key=lambda item: item[0]):
        names.setdefault(p, name)  # a tensor listed twice keeps its first name in sorted order
    unnamed = [p for p in all_params if p not in names]
    if unnamed:
        shapes = [tuple(p.shape) for p in unnamed]
        raise InvalidArgumentError(
            "named_parameters was specified, but one or more parameters of the optimizer are "
            f"not named (shapes {shapes}); pass model.named_parameters() of the model they "
            "belong to"
        )
    return {p: names[p] for p in all_params}


def resolve_compression(compression, compression_params):
    """The intra (framework-side) compressor for ``compression`` and ``compression_params``:
    ``compression`` itself, or ``Compression.fp16`` when the dict asks for ``"fp16": True``.

    Raises:
        InvalidTypeError (a TypeError): ``compression`` lacks compress()/decompress().
        InvalidArgumentError (a ValueError): ``"fp16": True`` with another compressor.
    """
    if compression is None:
        compression = Compression.none
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise InvalidTypeError("compression must provide compress() and decompress() "
                               "(use byteps.torch.Compression.none or .fp16)")
    if core_compression.wants_fp16(compression_params):
        if compression is Compression.none:
            compression = Compression.fp16
        elif compression is not Compression.fp16:
            raise InvalidArgumentError(
                "compression_params {'fp16': True} selects Compression.fp16, but compression="
                f"{getattr(compression, '__name__', compression)!r} was given too")
    return compression


def declare_gradients(params: Sequence[torch.Tensor], names: Mapping[torch.Tensor, str],
                      prefix: str, compression, kwargs: Mapping[str, str], process_set=None
                      ) -> Tuple[Dict[torch.Tensor, str], Dict[str, Tuple[torch.dtype, int]]]:
    """Name and declare the reduction of every parameter's gradient, in sorted name order (so
    keys agree on every rank whatever order the hooks fire in).

    Args:
        params: the parameters.
        names: ``{parameter: name}`` (from :func:`name_parameters`).
        prefix: prepended to each name (e.g. ``"Gradient."``).
        compression: the intra compressor (its output dtype is the wire dtype).
        kwargs: core compressor kwargs (``{}``: none); floating gradients are declared with
            them.
        process_set: the ``ProcessSet`` they are reduced in (None: every rank).

    Returns:
        ``({parameter: tensor name}, {tensor name: (wire dtype, element count)})``; a name gets a
        ``~k`` suffix when it was used before with another dtype or shape.
    """
    wire_dtypes = {p: compression.compress(torch.zeros(0, dtype=p.dtype))[0].dtype
                   for p in params}
    grad_names: Dict[torch.Tensor, str] = {}
    for p in sorted(params, key=lambda q: names[q]):
        grad_names[p] = ops._name_for(prefix + names[p], wire_dtypes[p], p.shape, kwargs)
    wire = {grad_names[p]: (wire_dtypes[p], p.numel()) for p in params}
    for name in sorted(grad_names.values()):
        dtype = ops._DTYPE_NAMES.get(wire[name][0])
        if kwargs and dtype is not None:
            core_compression.declare(name, kwargs, dtype, process_set)
        else:
            ops.declare(name, process_set)
    return grad_names, wire


def uncompressed_by_core(grad_names: Mapping[torch.Tensor, str],
                         wire: Mapping[str, Tuple[torch.dtype, int]]) -> List[torch.Tensor]:
    """The parameters whose gradients the core does not compress (too small, not floating,
    or a job that is not distributed): with the core's Nesterov momentum, the adapter applies
    it to these itself after the reduction."""
    out = []
    for p, name in grad_names.items():
        dtype, count = wire[name]
        nbytes = count * torch.empty(0, dtype=dtype).element_size()
        if not core_compression.core_compresses(ops._DTYPE_NAMES.get(dtype, ""), nbytes):
            out.append(p)
    return out
