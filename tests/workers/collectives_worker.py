"""Worker script of tests/test_collectives_jobs.py: ``python collectives_worker.py MODE``.

Run under ``python -m byteps.launch``. Every rank builds its input as a deterministic function
of (rank, case), so each rank can compute every other rank's input and the exact expected
result with NumPy. On a failure the worker prints ``FAIL <message>`` and exits 1; on success
``OK <n> cases`` as its last line.

Modes: ``collectives`` (byteps.collectives' allgather with uneven and empty contributions,
several dtypes and partitions, layouts changing between calls; broadcast from every root;
reducescatter with every op, rows that do not divide by the ranks, average; alltoall with
uneven and empty splits, even splits), ``errors``
(allgather with ranks that differ beyond the first dimension, a rank-dependent broadcast
root: every rank gets its error, and the job stays usable).
"""

from __future__ import annotations

import numpy as np
from numpy_cases import Cases, data

from byteps import collectives, errors

C = Cases()  # this rank's cases (numpy_cases)
fail, check = C.fail, C.check








def allgather_cases(size: int) -> None:
    # (rows of rank r, trailing shape, dtype): uneven, one rank empty, several partitions
    # (BYTEPS_PARTITION_BYTES=65536), a dtype the summation service lacks (bool, complex).
    cases = [
        (lambda r: r + 1, (3,), "float32"),
        (lambda r: 0 if r == 1 else 2 * r + 1, (), "int64"),
        (lambda r: 9000 + 1000 * r, (4,), "float32"),
        (lambda r: 2, (2, 2), "bool"),
        (lambda r: r % 2 + 1, (5,), "complex64"),
        (lambda r: 0, (3,), "float64"),
    ]
    for case, (rows, rest, dtype) in enumerate(cases):
        for rnd in range(2):  # the same layout twice, then (case 0) another one
            mine = data(C.rank, case + rnd, (rows(C.rank),) + rest, dtype)
            got = collectives.allgather_start(mine, f"ag{case}").wait()
            want = np.concatenate([data(r, case + rnd, (rows(r),) + rest, dtype)
                                   for r in range(size)])
            check(got, want, f"allgather case {case} round {rnd}")
    for extra in range(3):  # the layout changes every call
        mine = data(C.rank, 40 + extra, (C.rank + extra, 2), "int32")
        got = collectives.allgather_start(mine, "ag.changing").wait()
        want = np.concatenate([data(r, 40 + extra, (r + extra, 2), "int32")
                               for r in range(size)])
        check(got, want, f"allgather changing {extra}")


def broadcast_cases(size: int) -> None:
    for root in range(size):
        for case, (shape, dtype) in enumerate([((7, 3), "float32"), ((40000,), "int64"),
                                               ((3,), "bool"), ((), "float64")]):
            mine = data(C.rank, 100 + case, shape, dtype)
            got = collectives.broadcast_start(mine, root, f"bc{case}").wait()
            check(got, data(root, 100 + case, shape, dtype), f"broadcast root {root} case {case}")
            if C.rank != root:  # the input is left as it was
                check(mine, data(C.rank, 100 + case, shape, dtype), "broadcast input")


def reducescatter_cases(size: int) -> None:
    folds = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}
    for case, (rows, rest, dtype) in enumerate([(2 * size + 1, (3,), "float32"),
                                                (size - 1, (), "int32"),
                                                (30001, (2,), "float64"),
                                                (5, (2,), "int64")]):
        counts = collectives.shard_counts(rows, size)
        start = sum(counts[:C.rank])
        for op, fold in folds.items():
            ins = [data(r, 200 + case, (rows,) + rest, dtype) for r in range(size)]
            want = ins[0].copy()
            for x in ins[1:]:
                want = fold(want, x).astype(dtype)
            got = collectives.reducescatter_start(ins[C.rank], f"rs{case}.{op}", op=op).wait()
            check(got, want[start:start + counts[C.rank]], f"reducescatter {op} case {case}")
        if np.dtype(dtype).kind == "f":
            ins = [data(r, 300 + case, (rows,) + rest, dtype) for r in range(size)]
            got = collectives.reducescatter_start(ins[C.rank], f"rs{case}.avg",
                                                  average=True).wait()
            want = (sum(ins) / size).astype(dtype)[start:start + counts[C.rank]]
            np.testing.assert_allclose(got, want, rtol=1e-6)


def alltoall_cases(size: int) -> None:
    # (rows rank i sends rank j, trailing shape, dtype): uneven, some empty, several partitions.
    cases = [
        (lambda i, j: (i + j) % 3, (2,), "float32"),
        (lambda i, j: 2, (), "int64"),
        (lambda i, j: 0 if i == j else 3000 * (i + 1), (5,), "float64"),
        (lambda i, j: j % 2, (2, 2), "bool"),
    ]
    for case, (count, rest, dtype) in enumerate(cases):
        for rnd in range(2):
            def rows_of(i, j, count=count, rest=rest, dtype=dtype, key=case + rnd):
                return data(i * 31 + j, key, (count(i, j),) + rest, dtype)
            mine = np.concatenate([rows_of(C.rank, j) for j in range(size)])
            splits = [count(C.rank, j) for j in range(size)]
            got, received = collectives.alltoall_start(mine, splits, f"a2a{case}").wait()
            check(got, np.concatenate([rows_of(i, C.rank) for i in range(size)]),
                  f"alltoall case {case} round {rnd}")
            check(received, np.array([count(i, C.rank) for i in range(size)], np.int64),
                  f"alltoall received splits case {case}")
    even = data(C.rank, 9, (2 * size, 3), "int32")  # no splits: even
    got, received = collectives.alltoall_start(even, None, "a2a.even").wait()
    want = np.concatenate([data(i, 9, (2 * size, 3), "int32")[2 * C.rank:2 * C.rank + 2]
                           for i in range(size)])
    check(got, want, "alltoall even")


def errors_cases(size: int) -> None:
    try:  # rank 0's rows are wider than the others'
        collectives.allgather_start(np.zeros((2, 3 if C.rank == 0 else 4), np.float32),
                                    "bad.trailing").wait()
        fail("allgather with different trailing dims did not fail")
    except errors.InvalidArgumentError as e:
        if "differ beyond the first dimension" not in str(e):
            fail(f"unexpected message: {e}")
        print("CAUGHT trailing-dims:", e, flush=True)
        C.count += 1
    try:  # each rank names itself as the root
        collectives.broadcast_start(np.zeros(4, np.float32), C.rank, "bad.root").wait(60)
        fail("broadcast with rank-dependent roots did not fail")
    except errors.BytePSError as e:
        C.caught("rank-dependent-root", e)
    # The job goes on.
    got = collectives.allgather_start(np.full(2, C.rank, np.int32), "after.errors").wait()
    check(got, np.repeat(np.arange(size, dtype=np.int32), 2), "allgather after the errors")


def collectives_mode(size: int) -> None:
    allgather_cases(size)
    broadcast_cases(size)
    reducescatter_cases(size)
    alltoall_cases(size)


MODES = {"collectives": collectives_mode, "errors": errors_cases}


if __name__ == "__main__":
    C.main(MODES)
