"""Gradient tensors of VGG-16 and ResNet-50, derived from their published architectures.

Every trainable tensor (weights and biases, BatchNorm scale and shift) in the order a framework
lists them (``model.parameters()`` of torchvision's definitions: forward order), with its
element count and the forward FLOPs of the layer it belongs to (per 224 x 224 sample;
multiply-add = 2 FLOPs; attributed to the layer's weight, 0 for its bias / shift).

* VGG-16: Simonyan & Zisserman, ICLR 2015, configuration D (13 3x3 convolutions with biases,
  then 25088 -> 4096 -> 4096 -> 1000 fully connected): 138 357 544 parameters.
* ResNet-50: He et al., CVPR 2016, Table 1 (bottleneck blocks [3, 4, 6, 3], stride on the 3x3
  convolution as in torchvision "v1.5", convolutions without biases, BatchNorm after each):
  25 557 032 parameters.

Nothing is hard-coded but the architecture: the counts come out of the layer arithmetic of
``byteps.sim.models`` (the simulator's profiles; its tests check the published totals).
"""

from __future__ import annotations

from typing import NamedTuple

# One derivation of the architectures: the what-if simulator's (byteps.sim.models), which the
# scheduling benchmark runs tensor for tensor.
from byteps.sim.models import Tensor, resnet50, vgg16  # noqa: F401  (Tensor: re-exported)

MODELS = {"vgg16": vgg16, "resnet50": resnet50}


class Layer(NamedTuple):
    """One gradient of the training-shaped workload.

    Attributes:
        name (str): tensor name.
        nbytes (int): float32 gradient size, bytes.
        fwd_s (float): forward compute attributed to it, seconds.
        bwd_s (float): backward compute that ends with this gradient ready, seconds.
    """

    name: str
    nbytes: int
    fwd_s: float
    bwd_s: float


def profile(model: str, compute_s: float, bwd_over_fwd: float = 2.0) -> list[Layer]:
    """A compute profile: ``compute_s`` seconds of forward + backward per iteration, split over
    the layers in proportion to their forward FLOPs, backward = ``bwd_over_fwd`` x forward
    (gradients w.r.t. weights and inputs: the usual 2x).

    Raises:
        KeyError: unknown model (see :data:`MODELS`).
        ValueError: ``compute_s`` < 0.
    """
    if compute_s < 0:
        raise ValueError(f"compute_s must be >= 0 seconds, got {compute_s}")
    tensors = MODELS[model]()
    total = sum(t.fwd_flops for t in tensors) or 1.0
    fwd_total = compute_s / (1.0 + bwd_over_fwd)
    return [Layer(t.name, 4 * t.numel, fwd_total * t.fwd_flops / total,
                  bwd_over_fwd * fwd_total * t.fwd_flops / total) for t in tensors]
