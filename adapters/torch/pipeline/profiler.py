"""The profiler of byteps.torch.pipeline: each layer's forward and backward time, activation
size and parameter size, measured on the real model with a sample minibatch (PipeDream §3.1's
profile). The partitioner (:mod:`.partitioner`) plans from it."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import List, Sequence, Union

import torch
from torch import nn

from byteps.errors import InvalidArgumentError, InvalidTypeError


@dataclass
class LayerProfile:
    """One layer, for one minibatch of the sample's size.

    ``forward_s`` / ``backward_s``: median seconds of its forward / its backward (gradients of
    its input and parameters); ``activation_bytes``: bytes of its output (sent to the next stage
    when a stage ends here); ``param_bytes``: bytes of its parameters (synchronised among a
    stage's replicas)."""

    name: str
    forward_s: float
    backward_s: float
    activation_bytes: int
    param_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def layers_of(model: Union[nn.Module, Sequence[nn.Module]]) -> List[nn.Module]:
    """The layer list of an ``nn.Sequential`` (its children) or a list of modules."""
    if isinstance(model, nn.Sequential):
        layers = list(model.children())
    elif isinstance(model, (list, tuple, nn.ModuleList)):
        layers = list(model)
    else:
        raise InvalidTypeError(f"pipeline: a model must be an nn.Sequential or a list of "
                               f"modules, got {type(model).__name__}")
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise InvalidTypeError(f"pipeline: layer {i} is a {type(layer).__name__}, "
                                   f"not an nn.Module")
    if not layers:
        raise InvalidArgumentError("pipeline: a model without layers")
    return layers


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile(model: Union[nn.Module, Sequence[nn.Module]], sample: torch.Tensor,
            repeats: int = 5, warmup: int = 1) -> List[LayerProfile]:
    """Measures every layer of ``model`` on the minibatch ``sample`` (a CPU tensor, the
    first layer's input: e.g. ``[batch, features]``).

    Each layer runs on the previous layer's output: its forward is timed alone, then its
    backward alone (``torch.autograd.backward`` of its output with a gradient of ones, into
    its input, which requires grad from layer 1 on, and into fresh parameter gradients, as
    the runtime computes them: accumulating into existing ones costs far more); the median of
    ``repeats`` runs after ``warmup`` untimed ones. The model is left as it was (gradients
    cleared). Returns one :class:`LayerProfile` per layer, in order.

    Raises:
        byteps.errors.InvalidTypeError: not a Sequential / list of modules, or a non-tensor
            sample or layer output.
    """
    layers = layers_of(model)
    if not isinstance(sample, torch.Tensor):
        raise InvalidTypeError(f"pipeline.profile: the sample must be a tensor, got "
                               f"{type(sample).__name__}")
    repeats, warmup = max(1, int(repeats)), max(0, int(warmup))
    out: List[LayerProfile] = []
    x = sample.detach()
    for i, layer in enumerate(layers):
        params = [p for p in layer.parameters() if p.requires_grad]
        needs_input_grad = i > 0 and x.is_floating_point()

        def forward(layer=layer, x=x, grad=needs_input_grad):
            inp = x.detach().requires_grad_(grad)
            return inp, layer(inp)

        with torch.no_grad():
            for _ in range(warmup):
                layer(x)
            fwd = _median_time(lambda layer=layer, x=x: layer(x), repeats)
        _, y = forward()
        if not isinstance(y, torch.Tensor):
            raise InvalidTypeError(f"pipeline.profile: layer {i} returned a "
                                   f"{type(y).__name__}, not a tensor")
        bwd = 0.0
        if y.requires_grad:
            grad = torch.ones_like(y)
            times = []
            for k in range(warmup + repeats):
                for p in params:  # fresh gradients, as the runtime's (no accumulation)
                    p.grad = None
                _, yk = forward()
                t0 = time.perf_counter()
                torch.autograd.backward(yk, grad)
                if k >= warmup:
                    times.append(time.perf_counter() - t0)
            bwd = statistics.median(times)
            for p in params:
                p.grad = None
        out.append(LayerProfile(
            name=f"{i}:{type(layer).__name__}", forward_s=fwd, backward_s=bwd,
            activation_bytes=y.numel() * y.element_size(),
            param_bytes=sum(p.numel() * p.element_size() for p in params)))
        x = y.detach()
    return out
