"""Throughput of byteps' SIMD summation kernels (byteps._core.reduce.sum_into).

For every dtype and every ISA this CPU offers, times ``sum_into(a, b)`` (a += b) on two
buffers of ``--size-mib`` MiB each, next to NumPy's ``np.add(a, b, out=a)`` on the same
buffers, and prints a Markdown table of GB/s (best of ``--repeats``). Bandwidth counts
three streams per element: two reads and one write, i.e. 3 * buffer size per call.
bfloat16 has no NumPy dtype, so its NumPy column is empty.

    python benchmarks/sum_throughput.py [--size-mib 64] [--repeats 10]
"""

import argparse
import time

import numpy as np

from byteps._core import reduce

DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64"]


def make_buffers(dtype, nbytes, rng):
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


def best_seconds(fn, repeats):
    fn()  # warm-up: page faults, caches, lazy dispatch
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=float, default=64.0, help="bytes per buffer, MiB")
    p.add_argument("--repeats", type=int, default=10, help="timed calls; the best is kept")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated dtypes")
    p.add_argument("--isas", default=",".join(reduce.available_isas()),
                   help="comma-separated ISAs (default: all available here)")
    p.add_argument("--no-numpy", action="store_true", help="skip the NumPy column")
    args = p.parse_args()

    nbytes = int(args.size_mib * (1 << 20))
    dtypes = [d for d in args.dtypes.split(",") if d]
    isas = [i for i in args.isas.split(",") if i]
    rng = np.random.default_rng(0)
    previous = reduce.active_isa()
    rows = []
    try:
        for dtype in dtypes:
            a, b = make_buffers(dtype, nbytes, rng)
            traffic = 3 * a.nbytes
            kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
            row = {}
            for isa in isas:
                reduce.force_isa(isa)
                secs = best_seconds(lambda a=a, b=b, kw=kw: reduce.sum_into(a, b, **kw), args.repeats)
                row[isa] = traffic / secs / 1e9
            if not args.no_numpy and dtype != "bfloat16":
                with np.errstate(all="ignore"):
                    secs = best_seconds(lambda a=a, b=b: np.add(a, b, out=a), args.repeats)
                row["numpy"] = traffic / secs / 1e9
            rows.append((dtype, row))
    finally:
        reduce.force_isa(previous)

    cols = isas + ([] if args.no_numpy else ["numpy"])
    print(f"sum_into(a, b), {args.size_mib:g} MiB per buffer, GB/s counting 2 reads + 1 write, "
          f"best of {args.repeats}")
    print()
    header = ["dtype"] + cols + ([] if args.no_numpy else [f"{isas[0]} / numpy"])
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for dtype, row in rows:
        cells = [dtype] + [f"{row[c]:.1f}" if c in row else "n/a" for c in cols]
        if not args.no_numpy:
            cells.append(f"{row[isas[0]] / row['numpy']:.2f}x" if "numpy" in row else "n/a")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
