"""Summation throughput of the server's SIMD kernels next to NumPy and memory bandwidth.

For every dtype and every ISA this CPU offers (``byteps._core.reduce.force_isa``), times
``sum_into(a, b)`` (``a += b``) on two buffers of ``size`` bytes each, next to NumPy's
``np.add(a, b, out=a)`` on the same buffers, and a memory-bandwidth probe: the better of
``np.copyto(dst, src)`` and an in-place ``np.multiply(x, 1.0, out=x)`` of a ``probe_size``
buffer (2 streams each: one read, one write; the copy alone can be slow where memcpy switches
to non-temporal stores). GB/s count every byte read and written: ``a += b`` moves 3 × size per
call (two reads, one write), the probes 2 × size.

Each figure is measured single-threaded and with ``threads`` Python threads, each working on
its own contiguous slice (the core's kernels and NumPy's ufuncs release the GIL), and is the
best of ``repeats`` timed calls (the ISAs and NumPy timed in turn in every round). bfloat16 has no NumPy dtype, so its NumPy column is empty.

    python -m benchmarks.sumbench [--quick] [--size-mib 64] [--repeats 10] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

import numpy as np

DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64"]
QUICK_DTYPES = ["float32", "float16", "bfloat16", "int32"]


def settings(quick: bool, **override) -> dict:
    """The measurement plan; keyword arguments (not None) override fields."""
    plan = {
        "size": 64 << 20,  # bytes per buffer: far beyond any last-level cache here
        "repeats": 5 if quick else 15,
        "dtypes": list(QUICK_DTYPES if quick else DTYPES),
        "isas": None,  # None = every ISA available on this CPU
        "threads": os.cpu_count() or 1,
        "probe_size": (64 << 20) if quick else (256 << 20),  # memory-bandwidth probe buffer
    }
    plan.update({k: v for k, v in override.items() if v is not None})
    return plan


def make_buffers(dtype: str, nbytes: int, rng: np.random.Generator):
    """Two arrays of nbytes each with small values (no overflow to inf within a run)."""
    if dtype == "bfloat16":
        n = nbytes // 2
        x = rng.uniform(-1, 1, size=(2, n)).astype(np.float32)
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for data
        return bits[0].copy(), bits[1].copy()
    n = nbytes // np.dtype(dtype).itemsize
    if np.dtype(dtype).kind == "f":
        x = rng.uniform(-1, 1, size=(2, n)).astype(dtype)
    else:
        x = rng.integers(-3, 4, size=(2, n)).astype(dtype)
    return x[0].copy(), x[1].copy()


def best_seconds(fn: Callable[[], None], repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up (page faults, lazy dispatch)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _np_add(x: np.ndarray, y: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        np.add(x, y, out=x)


def _best_interleaved(fns: dict, repeats: int, reduce, default_isa: str) -> dict:
    """Best seconds of each ``name -> (isa or None, fn)``, the candidates timed in turn in
    every round (so background load hits all of them alike); one warm-up round first."""
    best = {k: float("inf") for k in fns}
    for r in range(repeats + 1):
        for k, (isa, fn) in fns.items():
            reduce.force_isa(isa or default_isa)
            t0 = time.perf_counter()
            fn()
            if r:
                best[k] = min(best[k], time.perf_counter() - t0)
    reduce.force_isa(default_isa)
    return best


def _slices(n: int, parts: int, align: int = 64) -> List[slice]:
    """``parts`` contiguous slices covering range(n), boundaries aligned to ``align`` elements."""
    step = -(-n // parts)
    step = -(-step // align) * align
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _parallel(pool: Optional[ThreadPoolExecutor], fn: Callable, arrays: Sequence[np.ndarray],
              threads: int) -> Callable[[], None]:
    """A callable applying ``fn`` to ``arrays`` split into ``threads`` slices, one per thread."""
    if threads <= 1 or pool is None:
        return lambda: fn(*arrays)
    parts = [[a[s] for a in arrays] for s in _slices(arrays[0].size, threads)]

    def call():
        for f in [pool.submit(fn, *p) for p in parts]:
            f.result()

    return call


def memory_bandwidth(probe: int, repeats: int, threads: int = 1,
                     pool: Optional[ThreadPoolExecutor] = None) -> dict:
    """The memory-bandwidth probe on a buffer of ``probe`` bytes: GB/s (2 streams: one read,
    one write) of ``np.copyto`` (``copy``) and of an in-place ``np.multiply(x, 1.0)``
    (``scale``), best of ``repeats``, the buffer split over ``threads`` threads of ``pool``
    (1 thread without a pool); ``best`` is the better of the two."""
    src = np.ones(probe // 8, dtype=np.float64)
    dst = np.zeros_like(src)

    def scale(x):
        np.multiply(x, 1.0, out=x)

    copy = 2 * probe / best_seconds(_parallel(pool, np.copyto, (dst, src), threads),
                                    repeats) / 1e9
    rmw = 2 * probe / best_seconds(_parallel(pool, scale, (src,), threads), repeats) / 1e9
    return {"copy": copy, "scale": rmw, "best": max(copy, rmw)}


def run(plan: dict, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Measure; returns a JSON-able dict: rows[dtype][threads][column] = GB/s."""
    from byteps._core import reduce

    progress = progress or (lambda label: None)
    isas = plan["isas"] or list(reduce.available_isas())
    thread_counts = sorted({1, int(plan["threads"])})
    rng = np.random.default_rng(0)
    nbytes, repeats = int(plan["size"]), int(plan["repeats"])
    previous = reduce.active_isa()
    rows: dict = {}
    membw: dict = {}
    pool = ThreadPoolExecutor(max(thread_counts)) if max(thread_counts) > 1 else None
    try:
        progress("sum memory bandwidth")
        probe = int(plan.get("probe_size") or nbytes)
        for th in thread_counts:
            membw[th] = memory_bandwidth(probe, repeats, th, pool)
        for dtype in plan["dtypes"]:
            progress(f"sum {dtype}")
            a, b = make_buffers(dtype, nbytes, rng)
            traffic = 3 * a.nbytes
            kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
            rows[dtype] = {}
            for th in thread_counts:
                fns = {}
                for isa in isas:
                    def kernel(x, y, kw=kw):
                        reduce.sum_into(x, y, **kw)

                    fns[isa] = (isa, _parallel(pool, kernel, (a, b), th))
                if dtype != "bfloat16":
                    fns["numpy"] = (None, _parallel(pool, _np_add, (a, b), th))
                secs = _best_interleaved(fns, repeats, reduce, previous)
                rows[dtype][th] = {k: traffic / v / 1e9 for k, v in secs.items()}
            del a, b
    finally:
        reduce.force_isa(previous)
        if pool is not None:
            pool.shutdown()
    return {"plan": dict(plan, isas=isas), "isas": isas, "default_isa": previous,
            "threads": thread_counts, "membw": membw, "rows": rows}


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sumbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer dtypes and repeats")
    p.add_argument("--size-mib", type=float, help="bytes per buffer, MiB (default 64)")
    p.add_argument("--repeats", type=int, help="timed calls; the best is kept")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: all)")
    p.add_argument("--isas", help="comma-separated ISAs (default: all available here)")
    p.add_argument("--threads", type=int, help="threads of the multi-threaded columns")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    plan = settings(
        args.quick,
        size=int(args.size_mib * (1 << 20)) if args.size_mib else None,
        repeats=args.repeats,
        dtypes=[d for d in args.dtypes.split(",") if d] if args.dtypes else None,
        isas=[i for i in args.isas.split(",") if i] if args.isas else None,
        threads=args.threads)
    results = run(plan)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    from . import report

    print(report.sum_markdown(results)[0])


if __name__ == "__main__":
    main()
