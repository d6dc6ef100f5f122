"""Horovod's process sets in byteps.torch (``import byteps.torch as hvd``), after Horovod's
``test_torch_process_sets.py``: two sets (one process per machine: ranks [0, 2] and [1];
two per machine: [0, 1] and [2, 3]); in its set every rank checks allreduce with each op,
grouped_allreduce, the allreduce gradient, allgather, broadcast from every rank of the set,
reducescatter, alltoall, allgather_object, broadcast_object, barrier and a
DistributedOptimizer(process_set=...) step against references built from the set's inputs;
then an operation of the other set (an error) and one over every rank. Prints
``TORCH_PROCESS_SETS_OK`` per rank."""

from __future__ import annotations

import torch
from _common import Checker

import byteps.torch as hvd
from byteps.errors import InvalidArgumentError


def data(r: int, shape, dtype=torch.float32) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n, dtype=torch.int64) * 3 + r * 7) % 11 - 5).to(dtype).reshape(shape)


def in_set(ck: Checker, ps: hvd.ProcessSet) -> None:
    ranks, me, r = ps.ranks, ps.rank(), hvd.rank()
    n = len(ranks)
    ins = [data(k, (5, 4)) for k in ranks]
    for op, want in [(hvd.Sum, sum(ins)), (hvd.Average, sum(ins) / n),
                     (hvd.Min, torch.stack(ins).min(0).values),
                     (hvd.Max, torch.stack(ins).max(0).values)]:
        got = hvd.allreduce(ins[me], op=op, name=f"ar.{op}", process_set=ps)
        ck.check(torch.allclose(got, want), f"allreduce {op} in {ps}")
    outs = hvd.grouped_allreduce([ins[me], ins[me] * 2], op=hvd.Sum, name="gar",
                                 process_set=ps)
    ck.check(torch.equal(outs[0], sum(ins)) and torch.equal(outs[1], 2 * sum(ins)),
             "grouped_allreduce")
    w = data(r, (3,)).requires_grad_()
    hvd.allreduce(w, op=hvd.Sum, name="ar.grad", process_set=ps).sum().backward()
    ck.check(torch.equal(w.grad, torch.full((3,), float(n))), f"allreduce gradient {w.grad}")
    got = hvd.allgather(data(r, (me + 1, 2)), name="ag", process_set=ps)
    ck.check(torch.equal(got, torch.cat([data(k, (i + 1, 2)) for i, k in enumerate(ranks)])),
             "allgather")
    for root in ranks:
        got = hvd.broadcast(data(r, (6,)), root, name="bc", process_set=ps)
        ck.check(torch.equal(got, data(root, (6,))), f"broadcast from {root}")
    rows = 2 * n + 1
    shard = hvd.reducescatter(data(r, (rows, 2)), op=hvd.Sum, name="rs", process_set=ps)
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    start = sum(counts[:me])
    want = sum(data(k, (rows, 2)) for k in ranks)[start:start + counts[me]]
    ck.check(torch.equal(shard, want), "reducescatter")
    splits = [i + 1 for i in range(n)]
    out, received = hvd.alltoall(data(r, (sum(splits), 3)), splits=splits, name="a2a",
                                 process_set=ps)
    want = torch.cat([data(k, (sum(splits), 3))[sum(splits[:me]):sum(splits[:me + 1])]
                      for k in ranks])
    ck.check(torch.equal(out, want) and received.tolist() == [me + 1] * n, "alltoall")
    objs = hvd.allgather_object({"rank": r}, name="obj", process_set=ps)
    ck.check([o["rank"] for o in objs] == ranks, f"allgather_object {objs}")
    got = hvd.broadcast_object({"from": r} if r == ranks[-1] else None, ranks[-1], name="bo",
                               process_set=ps)
    ck.check(got == {"from": ranks[-1]}, f"broadcast_object {got}")
    hvd.barrier(process_set=ps)
    # One SGD step on the gradient averaged over the set (Horovod's process_set= of the
    # optimizer): the same parameters on every rank of the set.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    start_w = model.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=ps)
    model(data(r, (8, 4))).pow(2).mean().backward()
    opt.step()
    grads = []
    for k in ranks:  # the reference: every rank's gradient, averaged over the set
        torch.manual_seed(0)
        ref = torch.nn.Linear(4, 1)  # the same initial parameters as `model`
        ref(data(k, (8, 4))).pow(2).mean().backward()
        grads.append(ref.weight.grad)
    want = start_w - 0.5 * sum(grads) / n
    ck.check(torch.allclose(model.weight.detach(), want, atol=1e-6),
             f"DistributedOptimizer(process_set) step {model.weight.tolist()} {want.tolist()}")


def main() -> None:
    hvd.init()
    ck = Checker("TORCH_PROCESS_SETS")
    size, local = hvd.size(), hvd.local_size()
    if local == 1:
        sets = [hvd.add_process_set([k for k in range(size) if k % 2 == 0]),
                hvd.add_process_set([k for k in range(size) if k % 2 == 1])]
    else:  # a set per machine
        sets = [hvd.add_process_set(list(range(m * local, (m + 1) * local)))
                for m in range(size // local)]
    mine = next(ps for ps in sets if ps.included())
    ck.run("in the set", in_set, ck, mine)
    other = next(ps for ps in sets if not ps.included())
    try:
        hvd.allreduce(torch.ones(2), name="other", process_set=other)
        ck.check(False, "an operation of a set this rank is not in: no error")
    except InvalidArgumentError:
        ck.check(True, "an operation of another set")
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="everyone",
                        process_set=hvd.global_process_set)
    ck.check(torch.equal(got, torch.full((2,), float(size))), "global_process_set")
    ck.finish()


if __name__ == "__main__":
    main()
