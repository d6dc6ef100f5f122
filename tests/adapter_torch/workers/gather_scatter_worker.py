"""Horovod's allgather, broadcast and reducescatter in byteps.torch (``import byteps.torch as
hvd``), checked on every rank against references built from every rank's inputs: every dtype
(bool and bfloat16 included), uneven allgather, every root and the in-place and async forms of
broadcast, reducescatter Sum and Average with scale factors and rows that do not divide, the
grouped forms, alltoall with uneven and even splits, and the gradients Horovod's autograd
functions give. Prints
``TORCH_GATHER_SCATTER_OK`` per rank."""

from __future__ import annotations

import torch
from _common import DTYPES, Checker

import byteps.torch as hvd
from byteps.errors import InvalidArgumentError

ALL = DTYPES + [torch.bool, torch.complex64]


def data(r: int, shape, dtype: torch.dtype) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    v = (torch.arange(n, dtype=torch.int64) * 3 + r * 7) % 5
    if dtype == torch.bool:
        return (v % 2 == 0).reshape(shape)
    return (v if dtype == torch.uint8 else v - 2).to(dtype).reshape(shape)


def allgathers(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    for dtype in ALL:
        rows = lambda k: k + 1  # noqa: E731
        got = hvd.allgather(data(r, (rows(r), 3), dtype), name=f"ag.{dtype}")
        want = torch.cat([data(k, (rows(k), 3), dtype) for k in range(size)])
        ck.check(got.dtype == dtype and torch.equal(got, want), f"allgather {dtype}")
    h = hvd.allgather_async(torch.full((r,), r), name="ag.async")  # rank 0 sends no rows
    ck.check(torch.equal(hvd.synchronize(h),
                         torch.cat([torch.full((k,), k) for k in range(size)])), "allgather_async")
    outs = hvd.grouped_allgather([torch.full((2,), r), torch.full((1, 2), float(r))], name="gag")
    ck.check(torch.equal(outs[0], torch.arange(size).repeat_interleave(2)) and
             outs[1].shape == (size, 2), "grouped_allgather")
    # Gradient (Horovod's HorovodAllgather): this rank's slice of the averaged gradient.
    w = torch.full((r + 1, 2), 1.0, requires_grad=True)
    out = hvd.allgather(w * (r + 1), name="ag.grad")
    (out * torch.arange(out.shape[0]).unsqueeze(1)).sum().backward()
    start = sum(k + 1 for k in range(r))
    want = torch.arange(start, start + r + 1).unsqueeze(1).expand(r + 1, 2) * float(r + 1)
    ck.check(torch.allclose(w.grad, want.float()), f"allgather gradient {w.grad.tolist()}")
    objs = hvd.allgather_object({"rank": r, "f": (lambda x, r=r: x + r)}, name="obj")
    ck.check([o["rank"] for o in objs] == list(range(size)) and
             [o["f"](1) for o in objs] == [1 + k for k in range(size)], "allgather_object")
    try:
        hvd.allgather(torch.tensor(1.0), name="ag.scalar")
        ck.check(False, "allgather of a 0-d tensor: no error")
    except InvalidArgumentError:
        ck.check(True, "allgather of a 0-d tensor")


def broadcasts(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    for root in range(size):
        for dtype in ALL:
            mine = data(r, (4, 5), dtype)
            got = hvd.broadcast(mine, root, name=f"bc.{dtype}")
            ck.check(torch.equal(got, data(root, (4, 5), dtype)) and
                     torch.equal(mine, data(r, (4, 5), dtype)), f"broadcast {dtype} from {root}")
        t = torch.full((3,), float(r))
        ck.check(hvd.broadcast_(t, root, name="bc_") is t and torch.equal(t, torch.full(
            (3,), float(root))), f"broadcast_ from {root}")
        h = hvd.broadcast_async(torch.full((2, 2), r), root, name="bca")
        ck.check(torch.equal(hvd.synchronize(h), torch.full((2, 2), root)), "broadcast_async")
        t = torch.full((5,), r, dtype=torch.int32)
        hvd.synchronize(hvd.broadcast_async_(t, root, name="bca_"))
        ck.check(torch.equal(t, torch.full((5,), root, dtype=torch.int32)), "broadcast_async_")
    # Gradient (Horovod's HorovodBroadcast): the averaged gradient on the root, zeros elsewhere.
    w = torch.full((3,), float(r + 1), requires_grad=True)
    (hvd.broadcast(w, 0, name="bc.grad") * (r + 1)).sum().backward()
    avg = sum(k + 1 for k in range(size)) / size
    ck.check(torch.allclose(w.grad, torch.full((3,), avg if r == 0 else 0.0)),
             f"broadcast gradient {w.grad.tolist()}")


def reducescatters(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    rows = 2 * size + 1
    counts = [rows // size + (1 if k < rows % size else 0) for k in range(size)]
    begin = sum(counts[:r])
    for dtype in DTYPES:
        ins = [data(k, (rows, 3), dtype) for k in range(size)]
        total = sum(x.double() for x in ins)
        got = hvd.reducescatter(ins[r], name=f"rs.{dtype}", op=hvd.Sum)
        ck.check(got.dtype == dtype and got.shape == (counts[r], 3) and
                 torch.allclose(got.double(), total[begin:begin + counts[r]]),
                 f"reducescatter Sum {dtype}")
        if dtype.is_floating_point:
            got = hvd.reducescatter(ins[r], name=f"rs.avg.{dtype}", prescale_factor=2.0,
                                    postscale_factor=0.5)  # Average, the default
            ck.check(torch.allclose(got.double(), total[begin:begin + counts[r]] / size,
                                    rtol=2e-2, atol=2e-2), f"reducescatter Average {dtype}")
    h = hvd.reducescatter_async(torch.ones(size, 2), name="rsa", op=hvd.Sum)
    ck.check(torch.equal(hvd.synchronize(h), torch.full((1, 2), float(size))), "reducescatter_async")
    outs = hvd.grouped_reducescatter([torch.ones(size), torch.ones(2 * size, 2)], name="grs",
                                     op=hvd.Sum)
    ck.check(torch.equal(outs[0], torch.full((1,), float(size))) and outs[1].shape == (2, 2),
             "grouped_reducescatter")
    # Gradient: the allgathered output gradient (divided by size for Average).
    w = torch.ones(rows, 2, requires_grad=True)
    out = hvd.reducescatter(w, name="rs.grad")
    (out * (r + 1)).sum().backward()
    want = torch.cat([torch.full((counts[k], 2), (k + 1) / size) for k in range(size)])
    ck.check(torch.allclose(w.grad, want), f"reducescatter gradient {w.grad.tolist()}")
    try:
        hvd.reducescatter(torch.ones(4), op=hvd.Max, name="rs.max")
        ck.check(False, "reducescatter Max: no error")
    except InvalidArgumentError as e:
        ck.check("Sum or Average" in str(e), f"reducescatter Max: {e}")


def alltoalls(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    for dtype in ALL:
        counts = [(r + j) % 3 for j in range(size)]  # rank i sends rank j (i + j) % 3 rows
        mine = torch.cat([data(r * 10 + j, ((r + j) % 3, 2), dtype) for j in range(size)])
        out, received = hvd.alltoall(mine, splits=counts, name=f"a2a.{dtype}")
        want = torch.cat([data(i * 10 + r, ((i + r) % 3, 2), dtype) for i in range(size)])
        ck.check(torch.equal(out, want) and received.tolist() ==
                 [(i + r) % 3 for i in range(size)], f"alltoall {dtype}")
    out = hvd.alltoall(torch.arange(2 * size) + 100 * r, name="a2a.even")  # no splits
    ck.check(torch.equal(out, torch.tensor([100 * i + 2 * r + k for i in range(size)
                                            for k in range(2)])), f"alltoall even {out}")
    h = hvd.alltoall_async(torch.full((size,), r), splits=torch.ones(size, dtype=torch.int32),
                           name="a2a.async")
    out, received = hvd.synchronize(h)
    ck.check(torch.equal(out, torch.arange(size)) and received.tolist() == [1] * size,
             "alltoall_async")
    # Gradient (Horovod's HorovodAlltoall): the output gradient sent back.
    w = torch.ones(size, 2, requires_grad=True)
    out, _ = hvd.alltoall(w, splits=[1] * size, name="a2a.grad")
    (out * torch.arange(1.0, size + 1).unsqueeze(1)).sum().backward()
    ck.check(torch.allclose(w.grad, torch.full((size, 2), float(r + 1))),
             f"alltoall gradient {w.grad.tolist()}")
    try:
        hvd.alltoall(torch.ones(2 * size + 1), name="a2a.uneven")
        ck.check(False, "alltoall of rows that do not split evenly: no error")
    except InvalidArgumentError:
        ck.check(True, "alltoall uneven without splits")


def main() -> None:
    hvd.init()
    ck = Checker("TORCH_GATHER_SCATTER")
    ck.run("allgather", allgathers, ck)
    ck.run("broadcast", broadcasts, ck)
    ck.run("reducescatter", reducescatters, ck)
    ck.run("alltoall", alltoalls, ck)
    ck.finish()
    hvd.shutdown()


if __name__ == "__main__":
    main()
