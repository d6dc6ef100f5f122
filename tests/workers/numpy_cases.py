"""What the NumPy job workers share (collectives_worker, process_sets_worker, join_worker):
rank-dependent inputs every rank can compute for every other rank, and exact checks that end
the process with ``FAIL rank <r>: <message>`` (the job tests look for it) or count a case."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Mapping

import numpy as np

import byteps.basics as bps


class Cases:
    """This rank's cases: ``rank`` is set after ``init()``; ``count`` the cases passed."""

    def __init__(self) -> None:
        self.rank = -1
        self.count = 0

    def fail(self, msg: str) -> None:
        print(f"FAIL rank {self.rank}: {msg}", flush=True)
        os._exit(1)

    def check(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        """The same dtype, shape and values (NaNs equal in floating arrays)."""
        if got.shape != want.shape or got.dtype != want.dtype:
            self.fail(f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
        if not np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
            self.fail(f"{what}: differs at {np.argwhere(got != want)[:3].tolist()}")
        self.count += 1

    def close(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        """The same shape and values within float32 rounding."""
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6):
            self.fail(f"{what}: got {got.tolist()}, want {want.tolist()}")
        self.count += 1

    def main(self, modes: Mapping[str, Callable[[int], None]]) -> None:
        """``python <worker> MODE``: init, run ``modes[MODE](size)``, shut down, print ``OK <n>
        cases``; an exception is this rank's failure."""
        mode = sys.argv[1]
        bps.init()
        self.rank = bps.rank()
        try:
            if mode not in modes:
                self.fail(f"unknown mode {mode}")
            modes[mode](bps.size())
        except Exception:
            self.fail(traceback.format_exc())
        bps.shutdown()
        print(f"OK {self.count} cases", flush=True)

    def caught(self, what: str, exc: BaseException) -> None:
        """An error a case expected: printed as ``CAUGHT <what>: ...`` and counted."""
        print(f"CAUGHT {what}: {type(exc).__name__}: {exc}", flush=True)
        self.count += 1


def data(rank: int, case: int, shape, dtype="float32") -> np.ndarray:
    """Small integers (exact in every dtype), distinct per rank and case."""
    n = int(np.prod(shape, dtype=np.int64))
    x = (np.arange(n, dtype=np.int64) * 7 + rank * 13 + case * 3) % 23 + 1
    if np.dtype(dtype) == np.bool_:
        return (x % 2 == 0).reshape(shape)
    return x.astype(dtype).reshape(shape)
