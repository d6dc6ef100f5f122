"""NumPy model of what a distributed optimizer step applies under two-level compression, for
the adapters' compression tests (tests/adapter_*/workers): for one tensor that is a single
partition (the job's partition bound at least its size) in a job of ``size`` workers (one
process each) and one server, each worker's compressor round-trips its gradient times
``scale``, the server's round-trips the sum, and every worker gets that:
``C_s(sum_i C_w(scale * g_i))``. The compressors are the NumPy reference of tests/compression_reference.py, each keeping its state across steps.
"""

from __future__ import annotations

import numpy as np


def core_kwargs(kwargs: dict) -> dict:
    """The kwargs as the core holds them (strings; bools "true"/"false"), which is what the
    NumPy reference (tests/compression_reference.py) reads."""
    return {k: ("true" if v is True else "false" if v is False else str(v))
            for k, v in kwargs.items()}


class TwoLevel:
    """The two-level round trip of one single-partition tensor of ``count`` elements of
    ``dtype`` (a NumPy dtype name) across ``size`` workers, state carried from step to step."""

    def __init__(self, kwargs: dict, dtype: str, count: int, size: int):
        from compression_reference import reference_compressor

        kw = core_kwargs(kwargs)
        self.dtype = dtype
        self.workers = [reference_compressor(kw, "worker", dtype, count) for _ in range(size)]
        self.server = reference_compressor(kw, "server", dtype, count)

    def step(self, grads, scale: float, lr: float) -> np.ndarray:
        """What every worker pulls for the gradients ``grads`` (one array per rank)."""
        total = None
        for w, g in zip(self.workers, grads):
            c = np.asarray(w.roundtrip(np.asarray(g, dtype=self.dtype), scale, lr),
                           dtype=self.dtype)
            total = c.copy() if total is None else total + c
        return np.asarray(self.server.roundtrip(total, 1.0, lr), dtype=self.dtype)


def rank_gradient(rank: int, step: int, case: str, count: int) -> np.ndarray:
    """The float32 gradient of rank ``rank`` at ``step`` in a test case (standard normal,
    seeded by all three, so every process can compute every rank's)."""
    seed = [rank, step, sum(case.encode())]
    return np.random.default_rng(seed).standard_normal(count).astype(np.float32)
