"""Model profiles: per-layer gradient bytes and forward / backward compute times.

A profile is a list of layers in **forward order** (the order a framework lists the
parameters); the backward pass produces their gradients in reverse order. JSON format (what
``load`` reads and ``save`` writes; write your own from a profiler's per-layer times)::

    {
      "name": "my-model",
      "source": "where the numbers come from",
      "layers": [
        {"name": "conv1.weight", "bytes": 37632, "fwd_ms": 0.12, "bwd_ms": 0.24},
        {"name": "fc.weight", "params": 2048000, "fwd_ms": 0.05, "bwd_ms": 0.10}
      ]
    }

Per layer: ``name``; ``bytes`` (gradient bytes) or ``params`` (elements, times
``dtype_bytes``, default 4: float32); ``fwd_ms`` and ``bwd_ms`` (milliseconds of compute per
iteration on one GPU; the backward time ends with this layer's gradient ready; default 0).
Top level: ``name``, ``source`` (free text), optional ``dtype_bytes``.

Shipped profiles (:func:`shipped`): the architectures of :mod:`byteps.sim.models` (exact
parameter counts), with compute **derived, not measured**: forward FLOPs x batch / a
sustained rate (default :data:`DEFAULT_TFLOPS`), backward = 2 x forward, except
``e2e_cnn``, whose compute is the step time measured by this repository's end-to-end
benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional

from . import models

#: Sustained training rate assumed for the shipped profiles' compute, TFLOP/s per GPU (an
#: assumption, not a measurement: set ``--tflops`` or write a profile with measured times).
DEFAULT_TFLOPS = 40.0
#: Per-GPU batch of the shipped profiles: samples (images, or sequences for the language
#: models; tokens = batch x sequence length 128).
DEFAULT_BATCH = {"resnet50": 64, "vgg16": 64, "transformer": 32, "bert_base": 32,
                 "bert_large": 32, "e2e_cnn": 16}
#: Tokens per sequence of the language models' FLOPs (models.py: seq = 128).
SEQ = {"transformer": 128, "bert_base": 128, "bert_large": 128}
#: The end-to-end benchmark's measured step alone (batch 16, one CPU core; docs/performance.md,
#: end-to-end table, "1 worker alone", commit 51a09b8): seconds.
E2E_CNN_STEP_S = 0.037


@dataclass
class Layer:
    """One gradient tensor and its compute.

    Attributes:
        name (str): tensor name.
        nbytes (int): gradient bytes.
        fwd_s (float): forward compute of the layer, seconds.
        bwd_s (float): backward compute that ends with this gradient ready, seconds.
    """

    name: str
    nbytes: int
    fwd_s: float = 0.0
    bwd_s: float = 0.0


@dataclass
class Profile:
    """A model profile.

    Attributes:
        name (str): model name.
        layers (list[Layer]): forward order.
        source (str): where sizes and times come from.
        params (int): parameter count (gradient elements), if known.
    """

    name: str
    layers: List[Layer]
    source: str = ""
    params: Optional[int] = None
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Gradient bytes per iteration."""
        return sum(x.nbytes for x in self.layers)

    @property
    def fwd_s(self) -> float:
        return sum(x.fwd_s for x in self.layers)

    @property
    def bwd_s(self) -> float:
        return sum(x.bwd_s for x in self.layers)

    @property
    def compute_s(self) -> float:
        """Forward + backward seconds per iteration on one GPU."""
        return self.fwd_s + self.bwd_s

    def scaled(self, compute_s: float) -> Profile:
        """The same profile with its compute scaled to ``compute_s`` seconds in all."""
        f = compute_s / self.compute_s if self.compute_s > 0 else 0.0
        return Profile(self.name, [Layer(x.name, x.nbytes, x.fwd_s * f, x.bwd_s * f)
                                   for x in self.layers], self.source, self.params, dict(self.meta))

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source,
                "layers": [{"name": x.name, "bytes": x.nbytes, "fwd_ms": x.fwd_s * 1e3,
                            "bwd_ms": x.bwd_s * 1e3} for x in self.layers]}


def from_json(doc: dict) -> Profile:
    """A profile from its JSON document (format above).

    Raises:
        byteps.errors.InvalidArgumentError: a missing or negative field.
    """
    from ..errors import InvalidArgumentError

    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list) or not doc["layers"]:
        raise InvalidArgumentError("profile: expected an object with a non-empty 'layers' list")
    dtype = int(doc.get("dtype_bytes", 4))
    layers = []
    for i, x in enumerate(doc["layers"]):
        if "bytes" in x:
            nbytes = int(x["bytes"])
        elif "params" in x:
            nbytes = int(x["params"]) * dtype
        else:
            raise InvalidArgumentError(f"profile layer {i}: needs 'bytes' or 'params'")
        fwd, bwd = float(x.get("fwd_ms", 0.0)) / 1e3, float(x.get("bwd_ms", 0.0)) / 1e3
        if nbytes < 0 or fwd < 0 or bwd < 0:
            raise InvalidArgumentError(f"profile layer {i}: bytes and times must be >= 0")
        layers.append(Layer(str(x.get("name", f"layer{i}")), nbytes, fwd, bwd))
    return Profile(str(doc.get("name", "profile")), layers, str(doc.get("source", "")))


def load(path: str) -> Profile:
    """Read a profile JSON file (format above)."""
    with open(path) as f:
        return from_json(json.load(f))


def save(profile: Profile, path: str) -> None:
    """Write ``profile`` as JSON (format above)."""
    with open(path, "w") as f:
        json.dump(profile.to_json(), f, indent=1)


def from_architecture(name: str, compute_s: Optional[float] = None,
                      tflops: float = DEFAULT_TFLOPS, batch: Optional[int] = None,
                      bwd_over_fwd: float = 2.0) -> Profile:
    """A shipped profile: the tensors of :data:`byteps.sim.models.ARCHITECTURES` (float32),
    compute split over the layers in proportion to their forward FLOPs (backward =
    ``bwd_over_fwd`` x forward). Compute per iteration: ``compute_s`` seconds if given, else
    FLOPs x batch / ``tflops`` (x 3 for forward + backward), except ``e2e_cnn``
    (:data:`E2E_CNN_STEP_S`, measured).

    Raises:
        byteps.errors.InvalidArgumentError: unknown model.
    """
    from ..errors import InvalidArgumentError

    if name not in models.ARCHITECTURES:
        raise InvalidArgumentError(f"unknown model {name!r}; shipped: "
                                   f"{', '.join(models.ARCHITECTURES)}")
    tensors = models.ARCHITECTURES[name]()
    flops = sum(t.fwd_flops for t in tensors) or 1.0
    b = batch or DEFAULT_BATCH[name]
    samples = b * SEQ.get(name, 1)
    if compute_s is None:
        if name == "e2e_cnn" and batch is None:
            compute_s = E2E_CNN_STEP_S
            src = (f"{models.__name__} architecture; compute: measured step of the end-to-end "
                   f"benchmark (batch 16, one CPU core, {E2E_CNN_STEP_S * 1e3:.0f} ms)")
        else:
            compute_s = (1.0 + bwd_over_fwd) * flops * samples / (tflops * 1e12)
            src = (f"{models.__name__} architecture; compute derived: {flops / 1e9:.3g} GFLOP "
                   f"forward per {'token' if name in SEQ else 'sample'} x {samples} / "
                   f"{tflops:g} TFLOP/s, backward = {bwd_over_fwd:g} x forward")
    else:
        src = f"{models.__name__} architecture; compute {compute_s:.4g} s per iteration (given)"
    fwd_total = compute_s / (1.0 + bwd_over_fwd)
    layers = [Layer(t.name, 4 * t.numel, fwd_total * t.fwd_flops / flops,
                    bwd_over_fwd * fwd_total * t.fwd_flops / flops) for t in tensors]
    return Profile(name, layers, src, sum(t.numel for t in tensors),
                   {"batch": b, "fwd_gflop": flops / 1e9})


def shipped() -> List[str]:
    """Names of the shipped profiles."""
    return list(models.ARCHITECTURES)


def get(name_or_path: str, **kw) -> Profile:
    """A shipped profile by name, else a JSON file by path."""
    if name_or_path in models.ARCHITECTURES:
        return from_architecture(name_or_path, **kw)
    return load(name_or_path)
