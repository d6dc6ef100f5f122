"""Worker script of tests/test_process_sets_jobs.py: ``python process_sets_worker.py MODE``.

Run under ``python -m byteps.launch``. Every rank builds its inputs as a deterministic function
of (global rank, case), so it can compute the exact result of an operation among any set of
ranks with NumPy. On a failure the worker prints ``FAIL <message>`` and exits 1; on success
``OK <n> cases`` as its last line; each expected error is printed as ``CAUGHT <what>``.

Mode ``sets``: one process per machine (3 ranks): sets [0, 2] (given to ``init``), [1, 2] and
[1] (added); two processes per machine (4 ranks): [0, 1] and [2, 3], and [0, 2] refused (it
holds half of each machine). In each set a rank is in: push_pull sum, average and max,
allgather with uneven rows, broadcast from every rank of the set, reducescatter, alltoall and
a barrier, several partitions (``BYTEPS_PARTITION_BYTES=65536``); the sets of a rank run one
after the other while other ranks run other sets. Then: an operation of a set this rank is not
in, a set the ranks added differently, a removed set (errors), and a global allreduce.
"""

from __future__ import annotations

import numpy as np
from numpy_cases import Cases, data

import byteps.basics as bps
from byteps import collectives, errors
from byteps.process_sets import ProcessSet, add_process_set, remove_process_set

C = Cases()  # this rank's cases (numpy_cases)
fail, check = C.fail, C.check








def push_pull(x: np.ndarray, name: str, ps, average=False, op="sum") -> np.ndarray:
    out = np.empty_like(x)
    bps.wait(bps.push_pull_async(name, x.ctypes.data, out.ctypes.data, x.nbytes, str(x.dtype),
                                 x.shape, average, op=op, process_set=ps))
    return out


def run_set(ps: ProcessSet, tag: str) -> None:
    ranks, me = ps.ranks, ps.rank()
    n = len(ranks)
    if ps.size() != n or ranks[me] != C.rank or not ps.included():
        fail(f"{ps!r}: size {ps.size()}, rank {me} of global rank {C.rank}")
    for case, shape in enumerate([(5, 3), (40000,)]):  # 40000 float32: three partitions
        ins = [data(r, case, shape) for r in ranks]
        check(push_pull(ins[me], f"{tag}.sum{case}", ps), sum(ins), f"{tag} sum {shape}")
        got = push_pull(ins[me], f"{tag}.avg{case}", ps, average=True)
        np.testing.assert_allclose(got, sum(ins) / n, rtol=1e-6)
        check(push_pull(ins[me], f"{tag}.max{case}", ps, op="max"),
              np.maximum.reduce(ins), f"{tag} max {shape}")
    for rnd in range(2):  # uneven rows, one rank's several partitions
        rows = [(r + rnd) % 3 + (9000 if r == ranks[-1] else 0) for r in ranks]
        ins = [data(r, 10 + rnd, (rows[i], 2)) for i, r in enumerate(ranks)]
        got = collectives.allgather_start(ins[me], f"{tag}.ag", process_set=ps).wait()
        check(got, np.concatenate(ins), f"{tag} allgather round {rnd}")
    for root in ranks:
        mine = data(C.rank, 20, (30000,), "int64")
        got = collectives.broadcast_start(mine, root, f"{tag}.bc", process_set=ps).wait()
        check(got, data(root, 20, (30000,), "int64"), f"{tag} broadcast from {root}")
    rows = 2 * n + 1
    ins = [data(r, 30, (rows, 3), "int32") for r in ranks]
    counts = collectives.shard_counts(rows, n)
    got = collectives.reducescatter_start(ins[me], f"{tag}.rs", process_set=ps).wait()
    start = sum(counts[:me])
    check(got, sum(ins)[start:start + counts[me]], f"{tag} reducescatter")
    sends = [[(i + j) % 3 + 1 for j in range(n)] for i in range(n)]

    def block(i, j):
        return data(ranks[i] * 31 + ranks[j], 40, (sends[i][j], 2), "float64")
    mine = np.concatenate([block(me, j) for j in range(n)])
    got, received = collectives.alltoall_start(mine, sends[me], f"{tag}.a2a",
                                               process_set=ps).wait()
    check(got, np.concatenate([block(i, me) for i in range(n)]), f"{tag} alltoall")
    check(received, np.array([sends[i][me] for i in range(n)], np.int64), f"{tag} splits")
    bps.barrier(process_set=ps)


def expect(kind, what: str, fn) -> None:
    try:
        fn()
    except kind as e:
        C.caught(what, e)
        return
    fail(f"{what}: no {kind.__name__}")


def sets_mode(size: int) -> None:
    local = bps.local_size()
    if local == 1:
        even = ProcessSet([0, 2])
        bps.init(process_sets=[even])  # initialized: registers the sets only (Horovod's static)
        if even.process_set_id != 1:
            fail(f"init(process_sets=...) registered {even!r}")
        sets = [even, add_process_set([1, 2]), add_process_set(ProcessSet([1]))]
    else:
        sets = [add_process_set([0, 1]), add_process_set([2, 3])]
        expect(errors.InvalidArgumentError, "part of a machine",
               lambda: add_process_set([0, 2]))
    if [s.process_set_id for s in sets] != list(range(1, len(sets) + 1)):
        fail(f"ids: {sets}")
    for i, ps in enumerate(sets):
        if C.rank in ps.ranks:
            run_set(ps, f"set{i}")
    outside = next(ps for ps in sets if C.rank not in ps.ranks)
    expect(errors.InvalidArgumentError, "not in the set",
           lambda: push_pull(np.zeros(2, np.float32), "outside", outside))
    expect(errors.InvalidArgumentError, "different sets",
           lambda: add_process_set([C.rank]))
    gone = sets[-1]
    if not remove_process_set(gone) or gone.process_set_id is not None:
        fail("remove_process_set did not remove the set")
    if C.rank in gone.ranks:
        expect(errors.InvalidArgumentError, "removed set",
               lambda: push_pull(np.zeros(2, np.float32), "removed", gone))
    x = data(C.rank, 50, (4,))  # every rank again
    check(push_pull(x, "global.after", None), sum(data(r, 50, (4,)) for r in range(size)),
          "global allreduce after the sets")
    bps.barrier()


MODES = {"sets": sets_mode}


if __name__ == "__main__":
    C.main(MODES)
