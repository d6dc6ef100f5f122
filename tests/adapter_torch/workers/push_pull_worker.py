"""push_pull conformance, run on every rank: python push_pull_worker.py [--no-big]

Checks sum and average for every supported dtype and shapes from (0,) to a 64 MiB float32
tensor; out-of-place, in-place, non-contiguous (both); async overlap (poll is False at least
once for the big tensor); many operations in flight; name reuse over rounds; unnamed tensors
of different sizes; autograd through push_pull; fp16 compression; error cases.
Prints ``TORCH_PUSHPULL_OK rank=.. size=..`` or ``TORCH_PUSHPULL_FAILED`` (exit 1).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from _common import DTYPES, Checker, check_result, expected, oracle, rank_data

import byteps.torch as bps

SHAPES = [(0,), (), (1,), (17,), (3, 5, 7), (1000,), (129, 67)]
MODES = ["out", "inplace", "nc_out", "nc_inplace"]
BIG = 16 * 1024 * 1024  # float32 elements = 64 MiB


def noncontig(t: torch.Tensor):
    """A non-contiguous view holding ``t``'s values, and its base (other half = sentinel)."""
    base = torch.full((*t.shape, 2), 7, dtype=t.dtype)
    base[..., 0] = t
    return base[..., 0], base


def matrix(ck: Checker, r: int, n: int) -> None:
    for dtype in DTYPES:
        ops = []
        for shape in SHAPES:
            for average in (False, True):
                for mode in MODES:
                    name = f"pp.{str(dtype)[6:]}.{'x'.join(map(str, shape))}.{int(average)}.{mode}"
                    x = rank_data(r, shape, dtype)
                    base = None
                    if mode.startswith("nc"):
                        x, base = noncontig(x)
                    orig = x.clone()
                    if mode.endswith("inplace"):
                        h = bps.push_pull_async_inplace(x, average=average, name=name)
                    else:
                        h = bps.push_pull_async(x, average=average, name=name)
                    ops.append((h, x, orig, base, shape, average, mode, name))
        for h, x, orig, base, shape, average, mode, name in ops:
            out = bps.synchronize(h)
            check_result(ck, out, shape, dtype, n, average, name)
            if mode.endswith("inplace"):
                ck.check(out is x, f"{name}: in-place synchronize must return the input")
            else:
                ck.check(torch.equal(x, orig), f"{name}: out-of-place modified its input")
                ck.check(out.is_contiguous(), f"{name}: output not contiguous")
            if base is not None and base.numel():
                ck.check(bool((base[..., 1] == 7).all()),
                         f"{name}: write-back touched elements outside the view")


def sync_push_pull(ck: Checker, r: int, n: int) -> None:
    for dtype in DTYPES:
        for average in (False, True):
            shape = (4, 6)
            name = f"sync.{str(dtype)[6:]}.{int(average)}"
            x = rank_data(r, shape, dtype)
            out = bps.push_pull(x, average=average, name=name)
            check_result(ck, out, shape, dtype, n, average, name)
            x2 = rank_data(r, shape, dtype)
            ck.check(bps.push_pull_inplace(x2, average=average, name=name + ".ip") is x2,
                     f"{name}: push_pull_inplace returns its input")
            check_result(ck, x2, shape, dtype, n, average, name + ".ip")


def autograd(ck: Checker, r: int, n: int) -> None:
    for dtype in (torch.float32, torch.float64):
        x = rank_data(r, (5,), dtype).requires_grad_()
        y = bps.push_pull(x, average=False, name=f"ag.{dtype}")
        ck.check(torch.equal(y.detach(), expected((5,), dtype, n).to(dtype)), "autograd fwd")
        w = torch.arange(1, 6, dtype=dtype) * (r + 1)
        (y * w).sum().backward()
        # the gradient is the push_pull of every rank's upstream gradient arange(1, 6) * (q + 1)
        want = torch.from_numpy(oracle.expected_sum(lambda q: np.arange(1, 6) * (q + 1), n)).to(
            dtype)
        ck.check(torch.equal(x.grad, want), f"autograd backward {dtype}: {x.grad} vs {want}")
    # average: backward averages as well
    x = rank_data(r, (3,), torch.float64).requires_grad_()
    y = bps.push_pull(x, average=True, name="ag.avg")
    y.sum().backward()
    ck.check(torch.allclose(x.grad, torch.ones(3, dtype=torch.float64)), "autograd avg grad")
    # fp16 compression, output back in float32
    x = rank_data(r, (33,), torch.float32)
    y = bps.push_pull(x, average=False, name="fp16c", compression=bps.Compression.fp16)
    ck.check(y.dtype == torch.float32 and torch.equal(y, expected((33,), x.dtype, n).float()),
             "fp16 compression sum")


def big(ck: Checker, r: int, n: int) -> None:
    base = (torch.arange(BIG, dtype=torch.int64) % 1021).to(torch.float32)
    x = base + r
    t0 = time.time()
    h = bps.push_pull_async_inplace(x, average=False, name="big.sum")
    false_polls = 0
    while not bps.poll(h):
        false_polls += 1
        time.sleep(0.0005)
    out = bps.synchronize(h)
    dt = time.time() - t0
    # rank q's input is base + q: the sum is base * n + the oracle's sum of the offsets q
    offsets = float(oracle.expected_sum(lambda q: q, n))
    want = base * n + offsets
    ck.check(torch.equal(out, want), "big 64 MiB sum mismatch")
    ck.check(false_polls >= 1, "poll never returned False for a 64 MiB tensor (no overlap?)")
    del want
    y = base + r
    out = bps.synchronize(bps.push_pull_async(y, average=True, name="big.avg"))
    want = (base * n + offsets) / n
    ck.check(torch.allclose(out, want, rtol=2e-6, atol=0), "big 64 MiB average mismatch")
    print(f"rank {r}: 64 MiB push_pull {dt:.2f}s ({false_polls} false polls)", flush=True)


def many_in_flight(ck: Checker, r: int, n: int) -> None:
    ops = []
    for i in range(300):
        shape = (1 + (i * 37) % 500,)
        x = rank_data(r + i, shape, torch.float32)
        ops.append((bps.push_pull_async(x, average=False, name=f"many.{i}"), shape, i))
    pending = sum(1 for h, _, _ in ops if not bps.poll(h))
    for h, shape, i in reversed(ops):  # synchronise in reverse order of issue
        out = bps.synchronize(h)
        want = expected(shape, torch.int64, n, shift=i).float()
        ck.check(torch.equal(out, want), f"many.{i} mismatch")
    print(f"rank {r}: 300 ops in flight ({pending} pending right after issue)", flush=True)


def reuse_and_unnamed(ck: Checker, r: int, n: int) -> None:
    for it in range(20):
        x = torch.full((1000,), float(it * 10 + r))
        out = bps.push_pull(x, average=False, name="reuse")
        want = float(oracle.expected_sum(lambda q, it=it: it * 10 + q, n))
        ck.check(bool((out == want).all()), f"reuse round {it}: {out[0].item()} != {want}")
    # unnamed tensors of different sizes (upstream shared one "noname" context and crashed)
    for k, size in enumerate([3, 300, 1, 30000]):
        x = torch.full((size,), float(r + k))
        out = bps.push_pull(x, average=False)
        want = float(oracle.expected_sum(lambda q, k=k: q + k, n))
        ck.check(bool((out == want).all()), f"unnamed {size}")
    h1 = bps.push_pull_async(torch.ones(10) * r, average=False)
    h2 = bps.push_pull_async(torch.ones(20) * r, average=False)
    s = float(oracle.expected_sum(lambda q: q, n))
    ck.check(bool((bps.synchronize(h2) == s).all() and (bps.synchronize(h1) == s).all()),
             "unnamed async")


def errors(ck: Checker, r: int, n: int) -> None:
    for dtype in (torch.bool, torch.int16, torch.complex64):
        try:
            bps.push_pull(torch.zeros(3, dtype=dtype), name=f"bad.{dtype}")
            ck.check(False, f"{dtype}: no TypeError")
        except TypeError as e:
            ck.check("torch.float32" in str(e) and "torch.int64" in str(e),
                     f"{dtype}: TypeError does not name the supported dtypes: {e}")
    # a duplicate in-flight name raises ValueError; the first operation still completes
    x = torch.ones(4 * 1024 * 1024)
    h = bps.push_pull_async_inplace(x, average=False, name="dup")
    try:
        h2 = bps.push_pull_async(torch.ones(3), name="dup")
        ck.check(False, "duplicate in-flight name: no ValueError")
        bps.synchronize(h2)
    except ValueError:
        ck.check(True, "")
    bps.synchronize(h)
    ck.check(bool((x == n).all()), "dup: first op result")


def main() -> None:
    bps.init()
    bps.init()  # idempotent
    r, n = bps.rank(), bps.size()
    ck = Checker("TORCH_PUSHPULL")
    ck.check(0 <= bps.local_rank() < bps.local_size() and 0 <= r < n, "ranks")
    ck.run("matrix", matrix, ck, r, n)
    ck.run("sync_push_pull", sync_push_pull, ck, r, n)
    ck.run("autograd", autograd, ck, r, n)
    ck.run("many_in_flight", many_in_flight, ck, r, n)
    ck.run("reuse_and_unnamed", reuse_and_unnamed, ck, r, n)
    ck.run("errors", errors, ck, r, n)
    if "--no-big" not in sys.argv:
        ck.run("big", big, ck, r, n)
    ck.finish()
    bps.shutdown()


if __name__ == "__main__":
    main()
