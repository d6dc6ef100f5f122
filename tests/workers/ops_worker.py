"""Worker script of tests/test_reduce_ops_jobs.py: ``python ops_worker.py MODE``.

Run under ``python -m byteps.launch``. Every rank computes its input as a deterministic,
small-integer function of (rank, case, index), so min, max and product of every rank's inputs
are exact in every dtype; the expected result folds all ranks' inputs with NumPy. On a failure
the worker prints ``FAIL <message>`` and exits 1; on success ``OK <n> cases`` as its last line.

Modes: ``barrier`` (five barriers, rank r arriving r * 0.3 s late at each; prints
``BARRIER <i> <entered> <left>`` with ``time.time()`` stamps), ``ops`` (min, max, product: every dtype, a multi-partition tensor, in place and out of
place, two rounds per name, a NaN that must win), ``errors`` (average with another op, a name
reused with another op, a rank-dependent op: every rank must get its error).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import numpy as np

import byteps.basics as bps
from byteps import errors

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")
FOLD = {"min": np.minimum, "max": np.maximum, "product": np.multiply}
RANK = -1


def log(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str) -> None:
    log(f"FAIL rank {RANK}: {msg}")
    os._exit(1)


def storage(dtype: str):
    return np.uint16 if dtype == "bfloat16" else np.dtype(dtype)


def to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """Small integers (float64) to the dtype's storage; bfloat16: the high half of float32."""
    if dtype == "bfloat16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(dtype)


def inputs(rank: int, case: int, n: int, dtype: str) -> np.ndarray:
    """Values in [-2, 2] ([0, 4] for uint8): products of a few ranks stay exact."""
    v = (np.arange(n, dtype=np.int64) * 3 + rank * 7 + case) % 5
    return (v if dtype == "uint8" else v - 2).astype(np.float64)


def expected(op: str, case: int, n: int, dtype: str, size: int) -> np.ndarray:
    acc = inputs(0, case, n, dtype)
    for r in range(1, size):
        acc = FOLD[op](acc, inputs(r, case, n, dtype))
    return to_bits(acc, dtype)


def push_pull(name, inp, out, dtype, op, average=False):
    h = bps.push_pull_async(name, inp.ctypes.data, out.ctypes.data, inp.nbytes, dtype,
                            inp.shape, average, op=op)
    bps.wait(h, timeout=120)


def mode_ops() -> int:
    size, cases = bps.size(), 0
    for op in FOLD:
        for d, dtype in enumerate(DTYPES):
            # 3 elements; ~200 KB (several partitions under BYTEPS_PARTITION_BYTES=65536)
            for n in (3, 100_003 if dtype in ("float16", "bfloat16") else 50_001):
                for rnd in range(2):  # the same name twice: the key's op stays
                    case = d * 10 + rnd
                    inp = to_bits(inputs(RANK, case, n, dtype), dtype)
                    inplace = rnd == 1
                    out = inp if inplace else np.empty_like(inp)
                    push_pull(f"{op}.{dtype}.{n}", inp, out, dtype, op)
                    want = expected(op, case, n, dtype, size)
                    if not np.array_equal(out, want):
                        bad = int(np.flatnonzero(out != want)[0])
                        fail(f"{op} {dtype} n={n} round {rnd}: element {bad} is {out[bad]}, "
                             f"want {want[bad]}")
                    cases += 1
    for op in ("min", "max"):  # a NaN on the last rank wins
        inp = np.arange(8, dtype=np.float32) + RANK
        if RANK == size - 1:
            inp[2] = np.nan
        out = np.empty_like(inp)
        push_pull(f"{op}.nan", inp, out, "float32", op)
        fold = np.minimum if op == "min" else np.maximum
        want = fold(np.arange(8, dtype=np.float32), np.arange(8, dtype=np.float32) + size - 1)
        want[2] = np.nan
        if not np.array_equal(out, want, equal_nan=True):
            fail(f"{op} with a NaN: {out.tolist()} != {want.tolist()}")
        cases += 1
    return cases


def expect(kind, what, fn) -> None:
    try:
        fn()
    except kind as exc:
        log(f"CAUGHT {what}: {type(exc).__name__}: {exc}")
        return
    except Exception as exc:
        fail(f"{what}: expected {kind.__name__}, got {type(exc).__name__}: {exc}")
    fail(f"{what}: no error")


def mode_errors() -> int:
    x = np.ones(16, dtype=np.float32)
    expect(errors.InvalidArgumentError, "average-with-max",
           lambda: push_pull("e.avg", x, x, "float32", "max", average=True))
    expect(errors.InvalidArgumentError, "unknown-op",
           lambda: push_pull("e.unknown", x, x, "float32", "mean"))
    push_pull("e.reuse", x, x, "float32", "max")
    expect(errors.InvalidArgumentError, "reused-with-min",
           lambda: push_pull("e.reuse", x, x, "float32", "min"))
    op = "min" if RANK % 2 == 0 else "max"
    expect(errors.MismatchError, "rank-dependent-op",
           lambda: push_pull("e.mismatch", x, x, "float32", op))
    # the job stays usable
    y = np.full(16, float(RANK), dtype=np.float32)
    push_pull("e.after", y, y, "float32", "max")
    if not np.all(y == bps.size() - 1):
        fail(f"max after the errors: {y.tolist()}")
    return 5


def mode_barrier() -> int:
    for i in range(5):
        time.sleep(0.3 * RANK)
        entered = time.time()
        bps.barrier()
        log(f"BARRIER {i} {entered:.6f} {time.time():.6f}")
    return 5


def main() -> int:
    global RANK
    bps.init()
    RANK = bps.rank()
    try:
        n = {"ops": mode_ops, "errors": mode_errors, "barrier": mode_barrier}[sys.argv[1]]()
    except Exception:
        fail(traceback.format_exc())
    bps.shutdown()
    log(f"OK {n} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
