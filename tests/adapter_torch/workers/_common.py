"""Helpers shared by the worker scripts (run under the byteps launcher, one per rank)."""

from __future__ import annotations

import sys
import time
import traceback

import torch

import byteps.torch as bps

torch.set_num_threads(1)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.int8, torch.uint8, torch.int32, torch.int64]

# relative tolerance of an average (sum / size rounded to the dtype)
AVG_RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6,
            torch.float64: 1e-13}


class Checker:
    """Counts cases and collects failures; ``finish`` prints the summary and exits."""

    def __init__(self, tag: str):
        self.tag = tag
        self.cases = 0
        self.failures = []
        self.t0 = time.time()

    def check(self, cond: bool, msg: str) -> bool:
        self.cases += 1
        if not cond:
            self.failures.append(msg)
            print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
        return bool(cond)

    def run(self, label: str, fn, *args, **kwargs):
        """Run one group of cases; an exception counts as a failure of that group."""
        try:
            return fn(*args, **kwargs)
        except Exception:
            self.cases += 1
            msg = f"{label} raised:\n{traceback.format_exc()}"
            self.failures.append(msg)
            print(f"FAIL rank {bps.rank()}: {msg}", flush=True)
            return None

    def finish(self, exit_on_failure: bool = True) -> None:
        dt = time.time() - self.t0
        r, n = bps.rank(), bps.size()
        if self.failures:
            print(f"{self.tag}_FAILED rank={r} size={n} failures={len(self.failures)} "
                  f"cases={self.cases}", flush=True)
            for f in self.failures[:20]:
                print("  - " + f.replace("\n", "\n    "), flush=True)
            sys.stdout.flush()
            if exit_on_failure:
                bps.shutdown()
                sys.exit(1)
        else:
            print(f"{self.tag}_OK rank={r} size={n} cases={self.cases} time={dt:.1f}s",
                  flush=True)


def rank_data(r: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """Exact small integers in [-5, 5] ([0, 10] for uint8), depending on rank and position, so
    every sum over <= 8 ranks is exact in every dtype."""
    n = 1
    for s in shape:
        n *= s
    v = (torch.arange(n, dtype=torch.int64) * 7 + r * 13 + 3) % 11
    if dtype != torch.uint8:
        v = v - 5
    return v.reshape(shape).to(dtype)


def expected_sum(shape, dtype, size: int) -> torch.Tensor:
    """Sum over ranks of rank_data, as int64 (exact)."""
    total = torch.zeros(shape, dtype=torch.int64)
    for r in range(size):
        total += rank_data(r, shape, torch.int64 if dtype != torch.uint8 else torch.uint8).long()
    return total


def check_result(ck: Checker, got: torch.Tensor, shape, dtype, size, average, label) -> None:
    if not ck.check(got.dtype == dtype and tuple(got.shape) == tuple(shape),
                    f"{label}: got dtype {got.dtype} shape {tuple(got.shape)}"):
        return
    total = expected_sum(shape, dtype, size)
    if not average:
        want = total.to(dtype)
        ok = torch.equal(got, want)
        ck.check(ok, f"{label}: sum mismatch (first got {got.flatten()[:6].tolist()}, "
                     f"want {want.flatten()[:6].tolist()})")
    elif dtype.is_floating_point:
        want = total.double() / size
        ok = torch.allclose(got.double(), want, rtol=AVG_RTOL[dtype], atol=AVG_RTOL[dtype])
        ck.check(ok, f"{label}: average mismatch (first got {got.flatten()[:6].tolist()}, "
                     f"want {want.flatten()[:6].tolist()})")
    else:
        want = torch.div(total, size, rounding_mode="floor").to(dtype)
        ok = torch.equal(got, want)
        ck.check(ok, f"{label}: integer average (floor division) mismatch (first got "
                     f"{got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()})")
