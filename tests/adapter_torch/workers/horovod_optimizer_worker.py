"""Horovod's DistributedOptimizer options in byteps.torch, checked on every rank against the
gradients every rank computes locally: ``op=Sum``, ``gradient_predivide_factor``, ``num_groups``
and ``groups`` (the same gradients, grouped), a sparse embedding's gradient allgathered as
Horovod does and with ``sparse_as_dense``, and Horovod's errors. Prints ``TORCH_HVD_OPT_OK`` per
rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import Checker

import byteps.torch as hvd
from byteps.errors import InvalidArgumentError


def model(sparse: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=sparse), torch.nn.Flatten(),
                               torch.nn.Linear(12, 2))


def batch(r: int):
    g = torch.Generator().manual_seed(100 + r)
    return torch.randint(0, 10, (5, 3), generator=g), torch.randn(5, 2, generator=g)


def local_grads(r: int) -> list:
    m = model(False)
    x, y = batch(r)
    F.mse_loss(m(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]


def reduced(ck: Checker, tag: str, want: list, sparse: bool = False, **kwargs) -> None:
    m = model(sparse)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=[(f"{tag}.{n}", p)
                                                     for n, p in m.named_parameters()], **kwargs)
    x, y = batch(hvd.rank())
    F.mse_loss(m(x), y).backward()
    opt.synchronize()
    got = [p.grad for p in m.parameters()]
    if sparse and not kwargs.get("sparse_as_dense"):
        ck.check(got[0].is_sparse, f"{tag}: the embedding's gradient stays sparse")
    got = [g.to_dense() if g.is_sparse else g for g in got]
    ck.check(all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want)),
             f"{tag}: {[float((g - w).abs().max()) for g, w in zip(got, want)]}")
    with opt.skip_synchronize():
        opt.step()


def main() -> None:
    hvd.init()
    ck = Checker("TORCH_HVD_OPT")
    size = hvd.size()
    per_rank = [local_grads(r) for r in range(size)]
    total = [sum(gs) for gs in zip(*per_rank)]
    mean = [t / size for t in total]
    ck.run("sum", reduced, ck, "sum", total, op=hvd.Sum)
    ck.run("predivide", reduced, ck, "predivide", mean, gradient_predivide_factor=4.0)
    ck.run("num_groups", reduced, ck, "num_groups", mean, num_groups=2)
    ck.run("groups int", reduced, ck, "groups_int", mean, groups=3)
    m = model(False)
    ck.run("groups lists", lambda: ck.check(hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
        groups=[[m[0].weight, m[2].bias]]) is not None, "groups of parameters accepted"))
    ck.run("sparse", reduced, ck, "sparse", mean, sparse=True)
    ck.run("sparse sum", reduced, ck, "sparse_sum", total, sparse=True, op=hvd.Sum)
    ck.run("sparse as dense", reduced, ck, "dense", mean, sparse=True, sparse_as_dense=True)
    for what, kwargs, word in (("predivide with Sum", {"op": hvd.Sum,
                                                        "gradient_predivide_factor": 2.0},
                                "op != Average"),
                               ("Adasum", {"op": hvd.Adasum}, "Adasum"),
                               ("foreign group", {"groups": [[torch.zeros(1)]]}, "groups")):
        m = model(False)
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                     named_parameters=m.named_parameters(), **kwargs)
            ck.check(False, f"{what}: no error")
        except InvalidArgumentError as e:
            ck.check(word in str(e), f"{what}: {e}")
    ck.finish()
    hvd.shutdown()


if __name__ == "__main__":
    main()
