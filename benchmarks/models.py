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

Nothing is hard-coded but the architecture: the counts come out of the layer arithmetic (and
the tests check the published totals).
"""

from __future__ import annotations

from typing import NamedTuple


class Tensor(NamedTuple):
    """One gradient tensor.

    Attributes:
        name (str): torchvision-style parameter name, e.g. ``features.0.weight``.
        numel (int): number of elements (float32 gradient = 4 * numel bytes).
        fwd_flops (float): forward FLOPs per sample of the layer it belongs to (0 for biases).
    """

    name: str
    numel: int
    fwd_flops: float


#: VGG-16 (configuration D): conv output channels, "M" = 2x2 max-pool.
_VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M")


def vgg16(num_classes: int = 1000, image: int = 224) -> list[Tensor]:
    """VGG-16's 32 gradient tensors (13 conv + 3 fc layers, each weight and bias)."""
    out: list[Tensor] = []
    cin, hw, idx = 3, image, 0
    for v in _VGG16_CFG:
        if v == "M":
            hw //= 2
            idx += 1
            continue
        flops = 2.0 * 9 * cin * v * hw * hw
        out += [Tensor(f"features.{idx}.weight", 9 * cin * v, flops),
                Tensor(f"features.{idx}.bias", v, 0.0)]
        cin, idx = v, idx + 2  # conv, relu
    dims = (cin * 7 * 7, 4096, 4096, num_classes)
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        out += [Tensor(f"classifier.{3 * i}.weight", a * b, 2.0 * a * b),
                Tensor(f"classifier.{3 * i}.bias", b, 0.0)]
    return out


def _conv_bn(prefix: str, bn: str, cin: int, cout: int, k: int, hw_out: int) -> list[Tensor]:
    """A bias-free k x k convolution and its BatchNorm (scale, shift)."""
    return [Tensor(f"{prefix}.weight", k * k * cin * cout, 2.0 * k * k * cin * cout * hw_out**2),
            Tensor(f"{bn}.weight", cout, 4.0 * cout * hw_out**2),
            Tensor(f"{bn}.bias", cout, 0.0)]


def resnet50(num_classes: int = 1000, image: int = 224) -> list[Tensor]:
    """ResNet-50's 161 gradient tensors (53 conv + 53 BatchNorm x 2 + fc weight and bias)."""
    hw = image // 2
    out = _conv_bn("conv1", "bn1", 3, 64, 7, hw)
    hw //= 2  # 3x3 max-pool, stride 2
    cin = 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            stride = 2 if b == 0 and stage > 1 else 1
            hw_out = hw // stride
            out += _conv_bn(f"{p}.conv1", f"{p}.bn1", cin, width, 1, hw)
            out += _conv_bn(f"{p}.conv2", f"{p}.bn2", width, width, 3, hw_out)
            out += _conv_bn(f"{p}.conv3", f"{p}.bn3", width, 4 * width, 1, hw_out)
            if b == 0:
                out += _conv_bn(f"{p}.downsample.0", f"{p}.downsample.1", cin, 4 * width, 1,
                                hw_out)
            cin, hw = 4 * width, hw_out
    out += [Tensor("fc.weight", cin * num_classes, 2.0 * cin * num_classes),
            Tensor("fc.bias", num_classes, 0.0)]
    return out


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
