"""byteps.torch.SyncBatchNorm on every rank against torch.nn.BatchNorm on the concatenated
batch of all ranks: outputs, input gradients, the weight's and bias's gradients summed over the
ranks, and running statistics after each of three training steps, for (N, C), (N, C, L) and
(N, C, H, W) inputs (ranks with different batch sizes); then eval mode. Prints
``TORCH_SYNCBN_OK`` per rank."""

from __future__ import annotations

import torch
from _common import Checker

import byteps.torch as hvd


def batch(r: int, shape_tail, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn((2 + r, *shape_tail), generator=g) * (1 + r) + r


def upstream_grad(r: int, like: torch.Tensor, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5000 + 1000 * step + r)
    return torch.randn(like.shape, generator=g)


def check_shape(ck: Checker, tail, label: str) -> None:
    size, r = hvd.size(), hvd.rank()
    c = tail[0]
    ref = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm2d}[len(tail)](c)
    sync = hvd.SyncBatchNorm(c, name=f"syncbn.{label}")
    with torch.no_grad():
        w = torch.linspace(0.5, 1.5, c)
        ref.weight.copy_(w)
        sync.weight.copy_(w)
        ref.bias.fill_(0.25)
        sync.bias.fill_(0.25)
    for step in range(3):
        xs = [batch(q, tail, step) for q in range(size)]
        gs = [upstream_grad(q, x, step) for q, x in enumerate(xs)]
        whole = torch.cat(xs).requires_grad_(True)
        ref_out = ref(whole)
        (ref_out * torch.cat(gs)).sum().backward()
        mine = xs[r].clone().requires_grad_(True)
        out = sync(mine)
        (out * gs[r]).sum().backward()
        lo = sum(x.shape[0] for x in xs[:r])
        piece = slice(lo, lo + xs[r].shape[0])
        tag = f"{label} step {step}"
        ck.check(torch.allclose(out, ref_out[piece], atol=1e-5), f"{tag}: output")
        ck.check(torch.allclose(mine.grad, whole.grad[piece], atol=1e-5), f"{tag}: input grad")
        for p_name in ("weight", "bias"):
            total = hvd.allreduce(getattr(sync, p_name).grad, op=hvd.Sum,
                                  name=f"syncbn.{label}.{p_name}")
            ck.check(torch.allclose(total, getattr(ref, p_name).grad, atol=1e-4),
                     f"{tag}: {p_name} grad summed over ranks")
        ck.check(torch.allclose(sync.running_mean, ref.running_mean, atol=1e-6) and
                 torch.allclose(sync.running_var, ref.running_var, atol=1e-5),
                 f"{tag}: running statistics")
        for m in (ref, sync):
            m.weight.grad = m.bias.grad = None
    sync.eval()
    ref.eval()
    x = batch(r, tail, 9)
    ck.check(torch.allclose(sync(x), ref(x), atol=1e-6), f"{label}: eval mode")


def main() -> None:
    hvd.init()
    ck = Checker("TORCH_SYNCBN")
    for tail, label in (((3,), "nc"), ((3, 7), "ncl"), ((4, 5, 6), "nchw")):
        ck.run(label, check_shape, ck, tail, label)
    ck.finish()
    hvd.shutdown()


if __name__ == "__main__":
    main()
