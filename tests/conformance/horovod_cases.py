"""The "horovod" group of the conformance suite (registered by ``cases.py``): Horovod's
allgather, broadcast, reducescatter and alltoall (docs/collectives.md) through every adapter,
against exact expected values: every dtype of the framework, uneven allgather and alltoall
(a rank with nothing to send included), every root, reducescatter whose rows do not divide by
the ranks, tensors around the partition bound (the job sets ``BYTEPS_PARTITION_BYTES``
to :data:`PARTITION_BYTES`), all of them in process sets, and join with uneven data.

Cases get the helpers of ``cases.py`` through :func:`register` (this module does not import
it: the pytest driver loads ``cases.py`` under another module name).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

#: the partition bound of this group's jobs (the pytest driver's GROUP_ENV)
PARTITION_BYTES = 65536


def register(case: Callable, helpers) -> None:
    """Register this group's cases with ``cases.case``; ``helpers``: the ``cases`` module's
    namespace (rank_data, assert_values, expected_reduce, shape_tag)."""
    h = helpers

    def rows_data(rank: int, rows: int, rest, dtype: str, salt: int) -> np.ndarray:
        return h.rank_data(rank, (rows,) + tuple(rest), dtype, salt)

    @case("horovod")
    def allgather_uneven_every_dtype(shim):
        """allgather: rank r contributes r + 1 rows (rank 1 none in a second round), every
        dtype; the result is the ranks' rows in rank order, bit for bit."""
        n, r = shim.size(), shim.rank()
        for i, dtype in enumerate(shim.dtypes):
            for rnd, rows in enumerate((lambda k: k + 1, lambda k: 0 if k == 1 else 2)):
                t = shim.tensor(rows_data(r, rows(r), (3,), dtype, 700 + i), dtype)
                out = shim.allgather(t, f"conf.ag.{dtype}.{rnd}")
                assert shim.dtype_of(out) == dtype, f"allgather {dtype}: {shim.dtype_of(out)}"
                want = np.concatenate([rows_data(k, rows(k), (3,), dtype, 700 + i)
                                       for k in range(n)])
                h.assert_values(shim.to_numpy(out), want, dtype, True,
                                f"allgather {dtype} round {rnd}")

    @case("horovod")
    def allgather_around_the_partition_bound(shim):
        """allgather of float32 tensors of the partition bound minus, at and plus one element
        per rank: the gathered tensor spans several partitions."""
        n, r = shim.size(), shim.rank()
        base = PARTITION_BYTES // 4
        for delta in (-1, 0, 1):
            t = shim.tensor(rows_data(r, base + delta, (), "float32", 710), "float32")
            out = shim.allgather(t, f"conf.ag.bound.{delta}")
            want = np.concatenate([rows_data(k, base + delta, (), "float32", 710)
                                   for k in range(n)])
            h.assert_values(shim.to_numpy(out), want, "float32", True, f"allgather {delta}")

    @case("horovod")
    def broadcast_every_root_every_dtype(shim):
        """Horovod's broadcast from every rank, every dtype, a tensor of more than one
        partition too: every rank gets the root's tensor, bit for bit."""
        n = shim.size()
        for root in range(n):
            for i, dtype in enumerate(shim.dtypes):
                shape = h.SHAPES[(root + i) % len(h.SHAPES)]
                t = shim.tensor(h.rank_data(shim.rank(), shape, dtype, 720 + root), dtype)
                out = shim.hvd_broadcast(t, root, f"conf.hbc.{root}.{dtype}")
                h.assert_values(shim.to_numpy(out), h.rank_data(root, shape, dtype, 720 + root),
                                dtype, True, f"broadcast from {root} {dtype}")
            big = (PARTITION_BYTES // 4 * 3 + 1,)
            t = shim.tensor(h.rank_data(shim.rank(), big, "float32", 730), "float32")
            out = shim.hvd_broadcast(t, root, f"conf.hbc.{root}.big")
            h.assert_values(shim.to_numpy(out), h.rank_data(root, big, "float32", 730),
                            "float32", True, f"broadcast from {root}, several partitions")

    @case("horovod")
    def reducescatter_sum_and_average(shim):
        """reducescatter: rows 2n + 1 (the first rank gets one more), Sum exactly for every
        dtype and Average within 1.5 ulp for the floating ones; a tensor over the partition
        bound too."""
        n, r = shim.size(), shim.rank()
        for rows, rest in ((2 * n + 1, (3,)), (PARTITION_BYTES // 8 + 1, (2,))):
            counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
            lo = sum(counts[:r])
            for i, dtype in enumerate(shim.dtypes if rest == (3,) else ("float32",)):
                for average in (False, True):
                    if average and dtype not in ("float16", "bfloat16", "float32", "float64"):
                        continue
                    t = shim.tensor(rows_data(r, rows, rest, dtype, 740 + i), dtype)
                    out = shim.reducescatter(t, f"conf.rs.{rows}.{dtype}.{average}", average)
                    full = h.expected_reduce(n, (rows,) + rest, dtype, average, 740 + i)
                    h.assert_values(shim.to_numpy(out), full[lo:lo + counts[r]], dtype,
                                    not average, f"reducescatter {dtype} average={average}")

    @case("horovod")
    def alltoall_uneven_splits(shim):
        """alltoall: rank i sends (i + j) % 3 rows to rank j (some none), every dtype; rank j
        gets every rank's rows for it in rank order, and (where the framework returns them)
        the number from each."""
        n, r = shim.size(), shim.rank()
        for i, dtype in enumerate(shim.dtypes):
            def block(src, dst, dtype=dtype, i=i):
                return rows_data(src * 31 + dst, (src + dst) % 3, (2,), dtype, 750 + i)
            t = shim.tensor(np.concatenate([block(r, j) for j in range(n)]), dtype)
            out, received = shim.alltoall(t, [(r + j) % 3 for j in range(n)],
                                          f"conf.a2a.{dtype}")
            h.assert_values(shim.to_numpy(out), np.concatenate([block(k, r) for k in range(n)]),
                            dtype, True, f"alltoall {dtype}")
            if received is not None:
                assert list(received) == [(k + r) % 3 for k in range(n)], received

    @case("horovod")
    def process_sets_every_collective(shim):
        """Process sets: the even and the odd worker machines' ranks each run an
        allreduce Sum of every dtype, an uneven allgather, a broadcast from every rank of the
        set, a reducescatter and an alltoall among themselves, of tensors over the partition
        bound too; every result is the set's, bit for bit."""
        n, r, local = shim.size(), shim.rank(), shim.bps.local_size()
        side = [(k // local) % 2 for k in range(n)]  # by machine: a set holds whole machines
        sets = [shim.add_process_set([k for k in range(n) if side[k] == p]) for p in (0, 1)]
        ps = sets[side[r]]
        ranks, me, m = ps.ranks, ps.rank(), len(ps.ranks)
        for i, dtype in enumerate(shim.dtypes):
            t = shim.tensor(h.rank_data(r, (3, 2), dtype, 760 + i), dtype)
            out = shim.allreduce_sum(t, f"conf.ps.ar.{dtype}", ps)
            floating = dtype in ("float16", "bfloat16", "float32", "float64")
            want = sum(h.rank_data(k, (3, 2), dtype, 760 + i).astype(
                np.float64 if floating else np.int64) for k in ranks)
            if not floating:  # integers wrap in their dtype, as the core's sums
                want = want.astype(dtype).astype(np.int64)
            h.assert_values(shim.to_numpy(out), want, dtype, not floating,
                            f"process set allreduce {dtype}")
        big = PARTITION_BYTES // 4 + 3
        for rnd, rows in enumerate((lambda i: i + 1, lambda i: big if i == 0 else 1)):
            t = shim.tensor(rows_data(r, rows(me), (), "float32", 770 + rnd), "float32")
            out = shim.allgather(t, f"conf.ps.ag.{rnd}", ps)
            want = np.concatenate([rows_data(k, rows(i), (), "float32", 770 + rnd)
                                   for i, k in enumerate(ranks)])
            h.assert_values(shim.to_numpy(out), want, "float32", True, f"set allgather {rnd}")
        for root in ranks:
            t = shim.tensor(h.rank_data(r, (big,), "float32", 780 + root), "float32")
            out = shim.hvd_broadcast(t, root, f"conf.ps.bc.{root}", ps)
            h.assert_values(shim.to_numpy(out), h.rank_data(root, (big,), "float32", 780 + root),
                            "float32", True, f"set broadcast from {root}")
        rows = 2 * m + 1
        counts = [rows // m + (1 if k < rows % m else 0) for k in range(m)]
        lo = sum(counts[:me])
        t = shim.tensor(rows_data(r, rows, (2,), "int32", 790), "int32")
        out = shim.reducescatter(t, "conf.ps.rs", False, ps)
        want = sum(rows_data(k, rows, (2,), "int32", 790).astype(np.int64) for k in ranks)
        h.assert_values(shim.to_numpy(out), want[lo:lo + counts[me]].astype(np.int32), "int32",
                        True, "set reducescatter")

        def block(src, dst):
            return rows_data(src * 31 + dst, (src + dst) % 3 + 1, (2,), "float32", 795)
        t = shim.tensor(np.concatenate([block(r, k) for k in ranks]), "float32")
        out, received = shim.alltoall(t, [(r + k) % 3 + 1 for k in ranks], "conf.ps.a2a", ps)
        h.assert_values(shim.to_numpy(out), np.concatenate([block(k, r) for k in ranks]),
                        "float32", True, "set alltoall")
        if received is not None:
            assert list(received) == [(k + r) % 3 + 1 for k in ranks], received

    @case("horovod")
    def join_with_uneven_data(shim):
        """Horovod's join with uneven data: rank r runs r + 1 steps of an allreduce Sum (a new
        name each step, over the partition bound too) and joins; each step's result is the sum
        over the ranks still running; join() returns the last rank (the one with the most
        steps) everywhere. Where join is refused (several processes per machine, a scheme other
        than ps) every rank gets ConfigError instead."""
        import os

        from byteps.errors import ConfigError

        n, r = shim.size(), shim.rank()
        if shim.bps.local_size() > 1 or os.environ.get("BYTEPS_SYNC", "ps") != "ps":
            try:
                shim.join()
            except ConfigError:
                return
            raise AssertionError("join() where it is refused did not raise ConfigError")
        big = PARTITION_BYTES // 4 + 5
        for step in range(r + 1):
            shape = (big,) if step % 2 else (7, 3)
            t = shim.tensor(h.rank_data(r, shape, "float32", 800 + step), "float32")
            out = shim.allreduce_sum(t, f"conf.join.{step}")
            want = sum(h.rank_data(k, shape, "float32", 800 + step).astype(np.float64)
                       for k in range(n) if step < k + 1)
            h.assert_values(shim.to_numpy(out), want, "float32", True, f"join step {step}")
        last = shim.join()
        assert last == n - 1, f"join() returned {last}, want {n - 1}"
