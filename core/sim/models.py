"""Gradient tensors of the shipped model profiles, derived from their published architectures.

Every trainable tensor in the order a framework lists it (forward order), with its element
count and the forward FLOPs per sample of the layer it belongs to (multiply-add = 2 FLOPs,
attributed to the layer's weight, 0 for biases and normalisation shifts). Nothing is
hard-coded but the architecture: the counts come out of the layer arithmetic, and
``tests/test_sim.py`` checks the published totals.

* **resnet50**: He et al., CVPR 2016, Table 1 (bottlenecks [3, 4, 6, 3], torchvision "v1.5":
  stride on the 3x3 convolution), 224 x 224: 25 557 032 parameters.
* **vgg16**: Simonyan & Zisserman, ICLR 2015, configuration D, 224 x 224: 138 357 544.
* **transformer**: Vaswani et al., NeurIPS 2017, the base model (6 + 6 layers, d_model 512,
  8 heads, d_ff 2048) with the WMT'14 en-de shared source-target vocabulary of 37 000 tokens,
  embeddings shared with the pre-softmax projection (their §3.4, §5.1); FLOPs per token at a
  sequence length of 128 (self- and cross-attention scores included).
* **bert_base**, **bert_large**: Devlin et al., NAACL 2019 (L=12, H=768 / L=24, H=1024;
  WordPiece vocabulary 30 522, 512 positions, 2 segment types, pooler; Hugging Face
  ``BertModel`` layout): 109 482 240 and 335 141 888 parameters; FLOPs per token at a
  sequence length of 128.
* **e2e_cnn**: the end-to-end benchmark's CNN of this repository
  (``benchmarks/e2e_worker.py``, ``make_model``): 2 598 746 parameters, 3 x 32 x 32 images.

The scheduling benchmark (``benchmarks/sched.py``) runs ``vgg16`` and ``resnet50`` from here
(``benchmarks/models.py`` imports them).
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple


class Tensor(NamedTuple):
    """One gradient tensor.

    Attributes:
        name (str): framework-style parameter name, e.g. ``features.0.weight``.
        numel (int): number of elements.
        fwd_flops (float): forward FLOPs per sample (per token for the language models) of
            the layer it belongs to; 0 for biases and shifts.
    """

    name: str
    numel: int
    fwd_flops: float


_VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M")


def vgg16(num_classes: int = 1000, image: int = 224) -> List[Tensor]:
    """VGG-16's 32 gradient tensors (13 conv + 3 fc layers, each weight and bias)."""
    out: List[Tensor] = []
    cin, hw, idx = 3, image, 0
    for v in _VGG16_CFG:
        if v == "M":
            hw //= 2
            idx += 1
            continue
        out += [Tensor(f"features.{idx}.weight", 9 * cin * v, 2.0 * 9 * cin * v * hw * hw),
                Tensor(f"features.{idx}.bias", v, 0.0)]
        cin, idx = v, idx + 2
    dims = (cin * 7 * 7, 4096, 4096, num_classes)
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        out += [Tensor(f"classifier.{3 * i}.weight", a * b, 2.0 * a * b),
                Tensor(f"classifier.{3 * i}.bias", b, 0.0)]
    return out


def _conv_bn(prefix: str, bn: str, cin: int, cout: int, k: int, hw: int) -> List[Tensor]:
    return [Tensor(f"{prefix}.weight", k * k * cin * cout, 2.0 * k * k * cin * cout * hw * hw),
            Tensor(f"{bn}.weight", cout, 4.0 * cout * hw * hw),
            Tensor(f"{bn}.bias", cout, 0.0)]


def resnet50(num_classes: int = 1000, image: int = 224) -> List[Tensor]:
    """ResNet-50's 161 gradient tensors (53 conv, 53 BatchNorm x 2, fc weight and bias)."""
    hw = image // 2
    out = _conv_bn("conv1", "bn1", 3, 64, 7, hw)
    hw //= 2
    cin = 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            hw_out = hw // (2 if b == 0 and stage > 1 else 1)
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


def _linear(name: str, din: int, dout: int, bias: bool = True) -> List[Tensor]:
    out = [Tensor(f"{name}.weight", din * dout, 2.0 * din * dout)]
    return out + [Tensor(f"{name}.bias", dout, 0.0)] if bias else out


def _norm(name: str, d: int) -> List[Tensor]:
    return [Tensor(f"{name}.weight", d, 0.0), Tensor(f"{name}.bias", d, 0.0)]


def _attention(name: str, d: int, seq: int, fused: bool) -> List[Tensor]:
    """Multi-head attention: q, k, v, output projections; the scores (QK^T and the weighted
    sum, 4 * seq * d FLOPs per token) are attributed to the output projection."""
    if fused:
        proj = [Tensor(f"{name}.in_proj_weight", 3 * d * d, 6.0 * d * d),
                Tensor(f"{name}.in_proj_bias", 3 * d, 0.0)]
    else:
        proj = [t for p in ("query", "key", "value") for t in _linear(f"{name}.{p}", d, d)]
    o = _linear(f"{name}.out_proj" if fused else f"{name}.output.dense", d, d)
    o[0] = o[0]._replace(fwd_flops=o[0].fwd_flops + 4.0 * seq * d)
    return proj + o


def transformer(vocab: int = 37000, d: int = 512, d_ff: int = 2048, layers: int = 6,
                seq: int = 128) -> List[Tensor]:
    """Transformer base (encoder-decoder, post-norm): shared embedding (its FLOPs are the
    pre-softmax projection's, so it is also the last gradient of the backward pass), then the
    encoder and decoder layers in order."""
    out = [Tensor("embed_tokens.weight", vocab * d, 2.0 * d * vocab)]
    for i in range(layers):
        p = f"encoder.layers.{i}"
        out += _attention(f"{p}.self_attn", d, seq, True) + _norm(f"{p}.self_attn_layer_norm", d)
        out += _linear(f"{p}.fc1", d, d_ff) + _linear(f"{p}.fc2", d_ff, d)
        out += _norm(f"{p}.final_layer_norm", d)
    for i in range(layers):
        p = f"decoder.layers.{i}"
        out += _attention(f"{p}.self_attn", d, seq, True) + _norm(f"{p}.self_attn_layer_norm", d)
        out += _attention(f"{p}.encoder_attn", d, seq, True)
        out += _norm(f"{p}.encoder_attn_layer_norm", d)
        out += _linear(f"{p}.fc1", d, d_ff) + _linear(f"{p}.fc2", d_ff, d)
        out += _norm(f"{p}.final_layer_norm", d)
    return out


def bert(layers: int = 12, d: int = 768, vocab: int = 30522, positions: int = 512,
         seq: int = 128) -> List[Tensor]:
    """BERT encoder (Hugging Face ``BertModel``): embeddings, ``layers`` encoder layers of
    d_ff = 4 d, the pooler."""
    out = [Tensor("embeddings.word_embeddings.weight", vocab * d, 0.0),
           Tensor("embeddings.position_embeddings.weight", positions * d, 0.0),
           Tensor("embeddings.token_type_embeddings.weight", 2 * d, 0.0)]
    out += _norm("embeddings.LayerNorm", d)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        out += _attention(f"{p}.attention.self", d, seq, False)
        out += _norm(f"{p}.attention.output.LayerNorm", d)
        out += _linear(f"{p}.intermediate.dense", d, 4 * d)
        out += _linear(f"{p}.output.dense", 4 * d, d) + _norm(f"{p}.output.LayerNorm", d)
    return out + _linear("pooler.dense", d, d)


def bert_base() -> List[Tensor]:
    """BERT-base: L = 12, H = 768."""
    return bert(12, 768)


def bert_large() -> List[Tensor]:
    """BERT-large: L = 24, H = 1024."""
    return bert(24, 1024)


def e2e_cnn(widths=(16, 32, 64, 128), hidden: int = 1024, classes: int = 10) -> List[Tensor]:
    """The end-to-end benchmark's CNN on 3 x 32 x 32 images (``benchmarks/e2e_worker.py``)."""
    hw, idx = 32, 0
    out = _conv_bn(f"{idx}", f"{idx + 1}", 3, widths[0], 3, hw)

    def block(i: int, c: int, hw: int) -> List[Tensor]:
        return (_conv_bn(f"{i}.conv1", f"{i}.bn1", c, c, 3, hw)
                + _conv_bn(f"{i}.conv2", f"{i}.bn2", c, c, 3, hw))

    out += block(3, widths[0], hw)
    idx = 4
    for ci, co in zip(widths, widths[1:]):
        hw //= 2
        out += _conv_bn(f"{idx}.0", f"{idx}.1", ci, co, 3, hw)
        out += block(idx + 1, co, hw)
        idx += 2
    out += _linear(f"{idx + 1}", widths[-1] * hw * hw, hidden)
    out += _linear(f"{idx + 3}", hidden, classes)
    return out


#: name -> architecture function
ARCHITECTURES: Dict[str, Callable[[], List[Tensor]]] = {
    "resnet50": resnet50, "vgg16": vgg16, "transformer": transformer,
    "bert_base": bert_base, "bert_large": bert_large, "e2e_cnn": e2e_cnn,
}
