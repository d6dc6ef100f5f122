"""Loopback timing of the synchronization schemes (docs/schemes.md): one job per (scheme, worker
machines), every worker push_pulls float32 tensors of each size (in place, sum) and rank 0
reports the median seconds per operation.

    python -m benchmarks.schemes [--workers 2 3 4] [--schemes ps ring tree hips]
                                 [--sizes 4K 256K 4M 64M] [--reps 7] [--out FILE.json]

``ps`` and ``hips`` run with servers as the scheme needs them (ps: one per worker machine, as
colocated servers would; hips: one first-level server per group plus one top-level server);
``ring`` and ``tree`` use the worker mesh (their servers sit idle). The worker code runs behind
the hidden ``--worker`` flag.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

from . import runner

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SIZES = ["4K", "256K", "4M", "64M"]


def parse_size(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def worker(sizes, reps: int, out: str) -> None:
    import numpy as np

    import byteps.basics as bps
    bps.init()
    res = {}
    for size in sizes:
        n = parse_size(size) // 4
        buf = np.ones(n, np.float32)
        name = f"bench.{size}"
        times = []
        for i in range(reps + 2):  # two warm-up rounds (declaration, first touch)
            t0 = time.perf_counter()
            bps.wait(bps.push_pull_async(name, buf.ctypes.data, buf.ctypes.data, buf.nbytes,
                                         "float32", (n,), False))
            if i >= 2:
                times.append(time.perf_counter() - t0)
            buf[:] = 1
        res[size] = statistics.median(times)
    if bps.rank() == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    bps.shutdown()


def servers_for(scheme: str, workers: int, group: int) -> int:
    if scheme == "hips":
        return math.ceil(workers / group) + 1
    return workers if scheme == "ps" else 1


def run(scheme: str, workers: int, sizes, reps: int, group: int) -> dict:
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "byteps.launch", "--workers", str(workers), "--servers",
           str(servers_for(scheme, workers, group)), "--env", f"BYTEPS_SYNC={scheme}",
           "--env", f"BYTEPS_HIPS_GROUP={group}", "--env", "BYTEPS_TIMEOUT=120", "--",
           sys.executable, "-m", "benchmarks.schemes", "--worker", "--out", out,
           "--reps", str(reps), "--sizes", *sizes]
    proc = runner.run(cmd, timeout=1200, label=f"{scheme} x {workers}")
    if proc.returncode != 0:
        raise RuntimeError(f"{scheme} x {workers}: exit {proc.returncode}\n"
                           f"{proc.output[-6000:]}")
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--schemes", nargs="+", default=["ps", "ring", "tree", "hips"])
    p.add_argument("--sizes", nargs="+", default=SIZES)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--hips-group", type=int, default=2)
    p.add_argument("--out")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.sizes, a.reps, a.out)
        return 0
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    results = {"loadavg_before": load, "rows": []}
    print(f"load average before: {load}")
    print("| scheme | workers | " + " | ".join(a.sizes) + " |")
    print("|---|---|" + "---|" * len(a.sizes))
    for n in a.workers:
        for scheme in a.schemes:
            res = run(scheme, n, a.sizes, a.reps, a.hips_group)
            results["rows"].append({"scheme": scheme, "workers": n, "seconds": res})
            cells = " | ".join(f"{res[s] * 1e3:.2f} ms" for s in a.sizes)
            print(f"| {scheme} | {n} | {cells} |", flush=True)
    with open("/proc/loadavg") as f:
        results["loadavg_after"] = f.read().split()[0]
    print(f"load average after: {results['loadavg_after']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
