"""Helpers shared by the worker scripts (run under the byteps launcher, one per rank)."""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import torch

import byteps.torch as bps

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: oracle.py
import oracle

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


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the oracle's dtype names)."""
    return str(dtype).split(".")[-1]


def rank_data(r: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """The oracle's :func:`oracle.rank_data` of rank ``r`` as a ``dtype`` tensor: exact small
    integers in [-5, 5] ([0, 10] for uint8), so every sum over <= 8 ranks is exact in every
    dtype."""
    return torch.from_numpy(oracle.rank_data(r, shape, dtype_name(dtype))).to(dtype)


def expected(shape, dtype, size: int, average: bool = False, shift: int = 0) -> torch.Tensor:
    """The oracle's push_pull result over ``size`` ranks of ``rank_data(r + shift, shape,
    dtype)``: int64 (sum, integer average: floor division) or float64 (floating average)."""
    name = dtype_name(dtype)
    return torch.from_numpy(oracle.expected_push_pull(
        lambda r: oracle.rank_data(r + shift, shape, name), size, average, name))


def check_result(ck: Checker, got: torch.Tensor, shape, dtype, size, average, label) -> None:
    if not ck.check(got.dtype == dtype and tuple(got.shape) == tuple(shape),
                    f"{label}: got dtype {got.dtype} shape {tuple(got.shape)}"):
        return
    want = expected(shape, dtype, size, average)
    if not average:
        want = want.to(dtype)
        ok = torch.equal(got, want)
        ck.check(ok, f"{label}: sum mismatch (first got {got.flatten()[:6].tolist()}, "
                     f"want {want.flatten()[:6].tolist()})")
    elif dtype.is_floating_point:
        ok = torch.allclose(got.double(), want, rtol=AVG_RTOL[dtype], atol=AVG_RTOL[dtype])
        ck.check(ok, f"{label}: average mismatch (first got {got.flatten()[:6].tolist()}, "
                     f"want {want.flatten()[:6].tolist()})")
    else:
        want = want.to(dtype)
        ok = torch.equal(got, want)
        ck.check(ok, f"{label}: integer average (floor division) mismatch (first got "
                     f"{got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()})")
