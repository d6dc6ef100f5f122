"""Worker script of tests/test_join_jobs.py: ``python join_worker.py MODE``.

Run under ``python -m byteps.launch``. Mode ``join`` (one process per machine), after Horovod's
``test_horovod_join_*``: twice, one rank (1, then 0) joins at once while the others run, each
checked against NumPy over the ranks that have not joined: push_pull Sum and Average of a
tensor used before the join and of a new one (Average still divides by the job's size, as
Horovod's), allgather (the joined rank contributes no rows), broadcast from a rank that has not
joined, reducescatter (the joined rank contributes zeros), an alltoall (refused on every
caller) and a barrier; then they join. Every rank gets the same last rank, not the first to
join. Afterwards every rank runs the same tensors again, and new ones (the joined rank's keys
and rounds caught up). Mode ``refused``: join() with several processes per machine is a
ConfigError. Prints ``OK <n> cases`` last, ``FAIL <message>`` on a failure.
"""

from __future__ import annotations

import numpy as np
from numpy_cases import Cases, data

import byteps.basics as bps
from byteps import collectives, errors

C = Cases()  # this rank's cases (numpy_cases)
fail, check = C.fail, C.close








def push_pull(x: np.ndarray, name: str, average: bool = False) -> np.ndarray:
    out = np.empty_like(x)
    bps.wait(bps.push_pull_async(name, x.ctypes.data, out.ctypes.data, x.nbytes,
                                 str(x.dtype), x.shape, average))
    return out


def everyone(size: int, tag: str) -> None:
    """Every rank takes part: old and new names."""
    for name in ("pp.old", f"pp.{tag}.new"):
        check(push_pull(data(C.rank, 1, (6,)), name), sum(data(r, 1, (6,)) for r in range(size)),
              f"{tag}: push_pull {name} with every rank")
    got = collectives.allgather_start(np.full((C.rank + 1,), C.rank, np.float32), "ag").wait()
    check(got, np.concatenate([np.full((r + 1,), r, np.float32) for r in range(size)]),
          f"{tag}: allgather with every rank")
    got = collectives.broadcast_start(data(C.rank, 2, (6,)), size - 1, "bc").wait()
    check(got, data(size - 1, 2, (6,)), f"{tag}: broadcast with every rank")


def episode(size: int, first: int, tag: str) -> None:
    if C.rank == first:
        last = collectives.join()
    else:
        here = [r for r in range(size) if r != first]
        for rnd in range(3):  # the old name and a new one, several rounds
            for name in ("pp.old", f"pp.{tag}.during"):
                got = push_pull(data(C.rank, rnd, (6,)), name)
                check(got, sum(data(r, rnd, (6,)) for r in here), f"{tag}: sum {name} round {rnd}")
            got = push_pull(data(C.rank, 9, (6,)), f"pp.{tag}.avg", average=True)
            check(got, sum(data(r, 9, (6,)) for r in here) / size, f"{tag}: average over the job")
        got = collectives.allgather_start(np.full((C.rank + 1, 2), C.rank, np.float32),
                                          "ag").wait()
        check(got, np.concatenate([np.full((r + 1, 2), r, np.float32) for r in here]),
              f"{tag}: allgather without the joined rank")
        got = collectives.broadcast_start(data(C.rank, 4, (6,)), here[-1], "bc").wait()
        check(got, data(here[-1], 4, (6,)), f"{tag}: broadcast from {here[-1]}")
        rows = 2 * size + 1
        counts = collectives.shard_counts(rows, size)
        lo = sum(counts[:C.rank])
        got = collectives.reducescatter_start(data(C.rank, 5, (rows, 2)), "rs").wait()
        want = sum(data(r, 5, (rows, 2)) for r in here)[lo:lo + counts[C.rank]]
        check(got, want, f"{tag}: reducescatter without the joined rank")
        try:
            collectives.alltoall_start(np.zeros((size, 1), np.float32), None, "a2a").wait()
            fail(f"{tag}: alltoall while a rank has joined did not fail")
        except errors.InvalidArgumentError as e:
            C.caught(f"{tag} alltoall", e)
        bps.barrier()
        last = collectives.join()
    if last == first:
        fail(f"{tag}: join() returned {last}, the rank that joined first")
    lasts = collectives.allgather_object(last, f"{tag}.last")
    if lasts != [last] * size:
        fail(f"{tag}: join() returned different ranks: {lasts}")
    C.count += 1
    everyone(size, tag)


def join_mode(size: int) -> None:
    everyone(size, "before")
    episode(size, 1, "first")
    episode(size, 0, "second")


def refused_mode(size: int) -> None:
    try:
        collectives.join()
        fail("join() with several processes per machine did not fail")
    except errors.ConfigError as e:
        C.caught("refused", e)
    bps.barrier()


MODES = {"join": join_mode, "refused": refused_mode}


if __name__ == "__main__":
    C.main(MODES)
