"""Horovod's allreduce family in byteps.torch (``import byteps.torch as hvd``), checked on
every rank against references built from every rank's inputs: each op (Average, Sum, Min, Max,
Product) on each dtype, the four call forms, pre/post-scale factors, the average= flag,
gradients through ``allreduce`` with Sum and Average, the errors Horovod raises (op and
average together, Adasum), ``barrier``, the build queries and start/stop_timeline. Prints ``TORCH_ALLREDUCE_OK``
per rank."""

from __future__ import annotations

import json
import os
import tempfile

import torch
from _common import DTYPES, Checker

import byteps.torch as hvd
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.telemetry import timeline_file


def data(r: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Values in [-2, 2] ([0, 4] for uint8): sums and products of a few ranks stay exact."""
    v = (torch.arange(n, dtype=torch.int64) * 3 + r * 7) % 5
    return (v if dtype == torch.uint8 else v - 2).to(dtype)


def fold(op, n: int, dtype: torch.dtype, size: int) -> torch.Tensor:
    xs = [data(r, n, torch.float64) if dtype != torch.uint8 else data(r, n, torch.uint8).double()
          for r in range(size)]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in (hvd.Sum, hvd.Average):
            acc = acc + x
        elif op == hvd.Min:
            acc = torch.minimum(acc, x)
        elif op == hvd.Max:
            acc = torch.maximum(acc, x)
        else:
            acc = acc * x
    if op == hvd.Average:
        acc = acc / size if dtype.is_floating_point else torch.floor(acc / size)
    return acc


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got.double(), want, rtol=1e-2, atol=1e-2)


def ops_and_forms(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
        for dtype in DTYPES:
            n = 1031
            want = fold(op, n, dtype, size)
            label = f"{op.name} {dtype}"
            out = hvd.allreduce(data(r, n, dtype), name=f"ar.{label}", op=op)
            ck.check(out.dtype == dtype and close(out, want), f"allreduce {label}: "
                     f"{out[:6].tolist()} != {want[:6].tolist()}")
            t = data(r, n, dtype)
            got = hvd.allreduce_(t, name=f"ar_.{label}", op=op)
            ck.check(got is t and close(t, want), f"allreduce_ {label}")
            h = hvd.allreduce_async(data(r, n, dtype), name=f"ara.{label}", op=op)
            ck.check(close(hvd.synchronize(h), want), f"allreduce_async {label}")
            t = data(r, n, dtype)
            h = hvd.allreduce_async_(t, name=f"ara_.{label}", op=op)
            ck.check(hvd.synchronize(h) is t and close(t, want), f"allreduce_async_ {label}")


def flags_and_scales(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    x = data(r, 64, torch.float32)
    ck.check(close(hvd.allreduce(x, name="avg.default"), fold(hvd.Average, 64, torch.float32,
                                                              size)), "default op is Average")
    ck.check(close(hvd.allreduce(x, average=False, name="avg.false"),
                   fold(hvd.Sum, 64, torch.float32, size)), "average=False is Sum")
    got = hvd.allreduce(x, name="scaled", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    ck.check(close(got, 1.5 * fold(hvd.Sum, 64, torch.float32, size)), "pre/post-scale")
    ck.check(torch.equal(x, data(r, 64, torch.float32)), "prescale leaves the input alone")
    for what, fn, kind in (
        ("op and average", lambda: hvd.allreduce(x, average=True, op=hvd.Sum), InvalidArgumentError),
        ("Adasum", lambda: hvd.allreduce(x, op=hvd.Adasum), InvalidArgumentError),
        ("int prescale", lambda: hvd.allreduce(data(r, 4, torch.int32), prescale_factor=2.0),
         InvalidTypeError),
    ):
        try:
            fn()
            ck.check(False, f"{what}: no error")
        except kind as exc:
            ck.check(what.split()[0] in str(exc) or "prescale" in str(exc), f"{what}: {exc}")


def gradients(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    for op, scale in ((hvd.Sum, size), (hvd.Average, 1.0)):
        w = torch.full((8,), float(r + 1), requires_grad=True)
        out = hvd.allreduce(w * 2.0, name=f"grad.{op.name}", op=op)
        out.sum().backward()
        # d/dw of sum(allreduce(2w)): the gradient of ones allreduced with op, times 2
        ck.check(torch.allclose(w.grad, torch.full((8,), 2.0 * scale)),
                 f"gradient through {op.name}: {w.grad.tolist()}")


def grouped(ck: Checker) -> None:
    size, r = hvd.size(), hvd.rank()
    shapes = ((5, torch.float32), (37, torch.int32), (1031, torch.float64))
    for op in (hvd.Sum, hvd.Max, hvd.Average):
        ts = [data(r, n, dt) for n, dt in shapes]
        wants = [fold(op, n, dt, size) for n, dt in shapes]
        outs = hvd.grouped_allreduce(ts, name=f"g.{op.name}", op=op)
        ck.check(len(outs) == 3 and all(close(o, w) for o, w in zip(outs, wants)),
                 f"grouped_allreduce {op.name}")
        h = hvd.grouped_allreduce_async(ts, name=f"ga.{op.name}", op=op)
        while not hvd.poll(h):
            pass
        ck.check(all(close(o, w) for o, w in zip(hvd.synchronize(h), wants)),
                 f"grouped_allreduce_async {op.name}")
        got = hvd.grouped_allreduce_(ts, name=f"g_.{op.name}", op=op)
        ck.check(all(g is t and close(t, w) for g, t, w in zip(got, ts, wants)),
                 f"grouped_allreduce_ {op.name}")
    w = torch.ones(6, requires_grad=True)
    v = torch.ones(3, requires_grad=True)
    a, b = hvd.grouped_allreduce([w * 2.0, v * 3.0], name="g.grad", op=hvd.Sum)
    (a.sum() + b.sum()).backward()
    ck.check(torch.allclose(w.grad, torch.full((6,), 2.0 * size)) and
             torch.allclose(v.grad, torch.full((3,), 3.0 * size)), "grouped gradient")
    ck.check(hvd.grouped_allreduce([], name="g.empty") == [], "empty group")
    try:
        hvd.grouped_allreduce(w, name="g.bad")
        ck.check(False, "grouped_allreduce of a tensor: no error")
    except InvalidTypeError:
        ck.check(True, "grouped_allreduce of a tensor")


def timeline(ck: Checker) -> None:
    """start_timeline / stop_timeline: the operations between them, in the rank's own file."""
    path = os.path.join(tempfile.mkdtemp(), "sub", "timeline.json")  # sub/ does not exist yet
    hvd.start_timeline(path)
    for _ in range(3):
        hvd.allreduce(torch.ones(10), name="tl.allreduce")
    hvd.allgather(torch.ones(2), name="tl.allgather")
    hvd.stop_timeline()
    mine = timeline_file(path, hvd.rank())
    with open(mine) as f:
        events = json.load(f)["traceEvents"]
    text = json.dumps(events)
    ck.check("tl.allreduce" in text and "allgather.tl.allgather" in text,
             f"timeline names the operations: {text[:300]}")
    for what, fn in (("stop twice", hvd.stop_timeline),
                     ("mark_cycles", lambda: hvd.start_timeline(path, mark_cycles=True))):
        try:
            fn()
            ck.check(False, f"{what}: no error")
        except InvalidArgumentError:
            ck.check(True, what)


def horovod_extras(ck: Checker) -> None:
    hvd.barrier()
    ck.check(hvd.mpi_built() is False and hvd.gloo_built() is False, "build queries")
    ck.check(isinstance(hvd.nccl_built(), int) and isinstance(hvd.cuda_built(), bool),
             "nccl_built / cuda_built types")
    ck.check(hvd.is_initialized(), "is_initialized")
    ck.check(hvd.cross_size() * hvd.local_size() == hvd.size() and hvd.is_homogeneous() and
             hvd.cross_rank() == hvd.rank() // hvd.local_size(), "cross_rank / cross_size")


def main() -> None:
    hvd.init()
    ck = Checker("TORCH_ALLREDUCE")
    ck.run("horovod extras", horovod_extras, ck)
    ck.run("timeline", timeline, ck)
    ck.run("grouped", grouped, ck)
    ck.run("ops and forms", ops_and_forms, ck)
    ck.run("flags and scales", flags_and_scales, ck)
    ck.run("gradients", gradients, ck)
    ck.finish()
    hvd.shutdown()


if __name__ == "__main__":
    main()
