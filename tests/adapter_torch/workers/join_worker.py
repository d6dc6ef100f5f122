"""Horovod's join in byteps.torch (``import byteps.torch as hvd``), after Horovod's
``test_horovod_join_allreduce``, ``_allgather`` and ``_broadcast``: for each first rank to join
(0, then 1) and dtype, the others allreduce with Average (the joined rank counts as zeros: the
result is ``tensor * (size - 1) / size`` when every other rank holds ``tensor``), allgather
(the joined rank gives no rows) and broadcast from a rank that has not joined; join() returns
the same rank everywhere, not the first to join. Then uneven data through
DistributedOptimizer: rank r trains r + 2 batches and joins, and every rank ends with the
parameters of SGD on the averaged gradients of the ranks still training at each step. Prints
``TORCH_JOIN_OK`` per rank."""

from __future__ import annotations

import torch
from _common import Checker

import byteps.torch as hvd


def collectives(ck: Checker) -> None:
    rank, size = hvd.rank(), hvd.size()
    for first in (0, 1):
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
            torch.manual_seed(1234)
            tensor = torch.randint(-100, 100, (5, 5)).to(dtype)
            if rank == first:
                last = hvd.join()
            else:
                got = hvd.allreduce(tensor, name=f"join.ar.{first}.{dtype}")
                want = tensor * (size - 1)
                want = want // size if not dtype.is_floating_point else want / size
                ck.check(torch.allclose(got, want), f"allreduce Average with rank {first} joined")
                got = hvd.allgather(torch.full((rank + 1, 2), rank, dtype=dtype),
                                    name=f"join.ag.{first}.{dtype}")
                want = torch.cat([torch.full((r + 1, 2), r, dtype=dtype)
                                  for r in range(size) if r != first])
                ck.check(torch.equal(got, want), f"allgather with rank {first} joined")
                root = next(r for r in range(size) if r != first)
                got = hvd.broadcast(torch.full((3,), rank, dtype=dtype), root,
                                    name=f"join.bc.{first}.{dtype}")
                ck.check(torch.equal(got, torch.full((3,), root, dtype=dtype)),
                         f"broadcast from {root} with rank {first} joined")
                last = hvd.join()
            ck.check(last != first, f"join() returned {last}, the first to join")
            ck.check(hvd.allgather_object(last, name="join.last") == [last] * size,
                     "join() returns the same rank on every rank")


def uneven(ck: Checker) -> None:
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    start = model.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())

    def batch(r, step):
        return torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1) + step

    for step in range(rank + 2):
        opt.zero_grad()
        model(batch(rank, step)).sum().backward()
        opt.step()
    hvd.join()
    w = start.clone()  # the reference: each step, the gradients of those still training
    for step in range(rank + 2):
        grads = [batch(r, step).sum(0, keepdim=True) for r in range(size) if step < r + 2]
        w = w - 0.1 * sum(grads) / size
    ck.check(torch.allclose(model.weight.detach(), w, atol=1e-5),
             f"uneven data: {model.weight.tolist()} vs {w.tolist()}")


def main() -> None:
    hvd.init()
    ck = Checker("TORCH_JOIN")
    ck.run("collectives with a joined rank", collectives, ck)
    ck.run("uneven data", uneven, ck)
    ck.finish()


if __name__ == "__main__":
    main()
