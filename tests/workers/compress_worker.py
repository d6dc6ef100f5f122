"""Worker script of tests/test_compression.py: ``python compress_worker.py MODE [ARGS...]``.

Run under ``python -m byteps.launch``. Every rank computes the inputs of every rank itself
(seeded by rank, tensor and round) and re-computes the two-level scheme with the NumPy
reference of the compressors (tests/compression_reference.py): per partition, each worker's
compressor (scale 1/size when averaging, the learning rate of the round), the sum of the
decoded pushes in rank order, and the server's compressor over that sum, whose decoded value
is what every worker must get. Output protocol as tests/workers/bps_worker.py (``FAIL ...`` /
``OK <n> cases``).

Modes:
  twolevel KWARGS_JSON ROUNDS AVERAGE   compressed push_pulls of several tensors against the
                                        reference, ROUNDS rounds (state carried across rounds)
  mismatch                              rank 0 declares another compressor than the others:
                                        MismatchError on every rank
  threshold                             a tensor below BYTEPS_MIN_COMPRESS_BYTES is summed
                                        exactly (not compressed)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

import byteps.basics as bps
from byteps import _core, _core_testing, errors

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
import bps_worker
from bps_worker import fail, log
from compression_reference import reference_compressor
from compression_sgd import core_kwargs

#: (name, element count, dtype) of the tensors a twolevel job sums: one partition, several
#: partitions (with a short last one), and a float64 one.
TENSORS = (("small", 5_000, "float32"), ("multi", 70_001, "float32"), ("wide", 9_000, "float64"))


def partitions(nbytes: int, dtype: str):
    """The core's partitions of a compressed tensor of ``nbytes`` in this job: (offset, length)
    in bytes; a compressed tensor is cut at the job's bound only, never finer (upstream
    compresses each ``BYTEPS_PARTITION_BYTES`` partition)."""
    es = np.dtype(dtype).itemsize
    job_bound = _core.partition_bound(int(os.environ["BYTEPS_PARTITION_BYTES"]),
                                      bps.local_size())
    bound = _core.tensor_partition_bound(nbytes, job_bound, int(os.environ["DMLC_NUM_WORKER"]),
                                         bps.local_size(), compressed=True)
    if bound != job_bound:
        fail(f"a compressed tensor of {nbytes} bytes is cut at {bound}, not the job's bound "
             f"{job_bound}")
    return [(off, length) for _, off, length in _core_testing.partition(nbytes, bound, es)]


def inputs(rank: int, name: str, n: int, dtype: str, rnd: int) -> np.ndarray:
    seed = [rank, rnd, sum(name.encode())]
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def machine_inputs(name: str, n: int, dtype: str, rnd: int):
    """Each worker machine's input: the sum of its local ranks' inputs, in local-rank order (what
    LOCAL_REDUCE gives the local root to compress)."""
    local = bps.local_size()
    out = []
    for m in range(bps.size() // local):
        xs = [inputs(m * local + lr, name, n, dtype, rnd) for lr in range(local)]
        total = xs[0].copy()
        for x in xs[1:]:
            total += x
        out.append(total)
    return out


def push_pull(x: np.ndarray, name: str, average: bool) -> np.ndarray:
    """push_pull of ``x`` (out of place), waited for."""
    out = np.full_like(x, 77)
    h = bps.push_pull_async(name, x.ctypes.data, out.ctypes.data, x.nbytes, str(x.dtype),
                            x.shape, average)
    bps.wait(h)
    return out


class TwoLevelModel:
    """The NumPy model of one tensor's two-level compression across every worker machine,
    round by round (the state of each machine's and each server key's compressor carried)."""

    def __init__(self, kwargs: dict, n: int, dtype: str, size: int):
        es = np.dtype(dtype).itemsize
        self.parts = [(off // es, length // es) for off, length in partitions(n * es, dtype)]
        self.dtype = dtype
        kwargs = core_kwargs(kwargs)  # the reference reads the core's strings
        # one compressor per worker machine: its local root compresses the machine's sum
        self.workers = [[reference_compressor(kwargs, "worker", dtype, count)
                         for _, count in self.parts] for _ in range(size // bps.local_size())]
        self.servers = [reference_compressor(kwargs, "server", dtype, count)
                        for _, count in self.parts]

    def step(self, xs, scale: float, lr: float) -> np.ndarray:
        out = np.empty_like(xs[0])
        for p, (start, count) in enumerate(self.parts):
            total = None
            for rank, x in enumerate(xs):
                c = self.workers[rank][p].roundtrip(x[start:start + count], scale, lr)
                c = np.asarray(c, dtype=self.dtype)
                total = c.copy() if total is None else total + c
            out[start:start + count] = self.servers[p].roundtrip(total, 1.0, lr)
        return out


def mode_twolevel(args) -> int:
    kwargs = json.loads(args[0])
    rounds, average = int(args[1]), args[2] == "1"
    size, rank = bps.size(), bps.rank()
    models = {}
    for name, n, dtype in TENSORS:
        bps.declare(name, compression=kwargs)
        models[name] = TwoLevelModel(kwargs, n, dtype, size)
    cases = 0
    for rnd in range(rounds):
        lr = 0.1 / (1 + rnd)  # changes every round: error feedback's correction is exercised
        bps.set_learning_rate(lr)
        scale = 1.0 / size if average else 1.0
        for name, n, dtype in TENSORS:
            x = inputs(rank, name, n, dtype, rnd)
            got = push_pull(x, name, average)
            want = models[name].step(machine_inputs(name, n, dtype, rnd), scale, lr)
            tol = np.finfo(dtype).eps * 8 * max(1.0, float(np.max(np.abs(want))))
            bad = np.abs(got.astype(np.float64) - want.astype(np.float64)) > tol
            if bad.any():
                i = int(np.argmax(bad))
                fail(f"{name} round {rnd}: {int(bad.sum())} of {n} elements differ from the "
                     f"two-level reference; first at {i}: got {got[i]!r}, want {want[i]!r}")
            cases += 1
    return cases


def mode_mismatch(args) -> int:
    mine = ({"compressor_type": "onebit"} if bps.rank() == 0
            else {"compressor_type": "topk", "compressor_k": 3})
    bps.declare("grad", compression=mine)
    try:
        push_pull(np.ones(20_000, np.float32), "grad", True)
    except errors.MismatchError as exc:
        if "compression" not in str(exc):
            fail(f"the mismatch error does not name the compression: {exc}")
        log(f"MISMATCH_RAISED {exc}")
        return 1
    fail("no MismatchError for different compressors")
    return 0


def mode_threshold(args) -> int:
    bps.declare("tiny", compression={"compressor_type": "onebit"})
    x = np.arange(100, dtype=np.float32) + bps.rank()  # 400 bytes: below the threshold
    got = push_pull(x, "tiny", False)
    want = sum(np.arange(100, dtype=np.float32) + r for r in range(bps.size()))
    if not np.array_equal(got, want):
        fail(f"a tensor below BYTEPS_MIN_COMPRESS_BYTES was not summed exactly: {got[:5]}")
    return 1


MODES = {"twolevel": mode_twolevel, "mismatch": mode_mismatch, "threshold": mode_threshold}

if __name__ == "__main__":
    bps_worker.main(MODES)
