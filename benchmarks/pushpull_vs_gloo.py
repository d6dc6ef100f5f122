"""push_pull latency and throughput next to torch.distributed gloo all_reduce, in one run.

Runs two jobs on this host with the same number of worker processes and the same tensors:
byteps (through ``bpslaunch``: scheduler + servers + workers, or local-only) and gloo
``all_reduce`` (``torch.distributed``, one process per worker). Prints a Markdown table of the
median time per operation (milliseconds) and the algorithm bandwidth (tensor bytes / time).

    python benchmarks/pushpull_vs_gloo.py --workers 2 --servers 1 --sizes 4K 64M

Needs torch (gloo). Issue 4 builds the full benchmark suite (``byteps-bench``); this script is
the quick side-by-side the foundation issue asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '100' -> 100 (bytes)."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def worker_main(args: argparse.Namespace) -> None:
    """Runs inside each worker process: times the operations, writes JSON (rank 0)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    sizes = [parse_size(s) for s in args.sizes]
    results = {}
    if args.backend == "byteps":
        import byteps.torch as bps

        bps.init()
        rank = bps.rank()

        def op(t, name):
            bps.synchronize(bps.push_pull_async_inplace(t, average=False, name=name))

        def barrier():
            op(torch.zeros(1), "bench.barrier")
    else:
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))

        def op(t, name):
            dist.all_reduce(t)

        def barrier():
            dist.barrier()

    for nbytes in sizes:
        t = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
        iters = max(args.min_iters, min(args.max_iters, int(args.budget_bytes // max(nbytes, 1))))
        name = f"bench.{nbytes}"
        for _ in range(args.warmup):
            op(t, name)
        barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            op(t, name)
            times.append(time.perf_counter() - start)
        results[nbytes] = float(np.median(times))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    if args.backend == "byteps":
        bps.shutdown()
    else:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(args: argparse.Namespace, backend: str) -> dict:
    out = tempfile.mktemp(suffix=f".{backend}.json")
    worker = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend,
              "--out", out, "--warmup", str(args.warmup), "--min-iters", str(args.min_iters),
              "--max-iters", str(args.max_iters), "--budget-bytes", str(args.budget_bytes),
              "--sizes", *args.sizes]
    if backend == "byteps":
        cmd = [sys.executable, "-m", "byteps.launcher", "--workers", str(args.workers),
               "--servers", str(args.servers), "--local-size", str(args.local_size)]
        for e in args.env:
            cmd += ["--env", e]
        subprocess.run(cmd + worker, check=True)
    else:
        world = args.workers * args.local_size
        port = free_port()
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(worker, env=env))
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("gloo job failed")
    with open(out) as f:
        data = {int(k): v for k, v in json.load(f).items()}
    os.unlink(out)
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="worker machines (default 2)")
    p.add_argument("--servers", type=int, default=1, help="servers (default 1)")
    p.add_argument("--local-size", type=int, default=1, help="processes per machine (default 1)")
    p.add_argument("--sizes", nargs="+", default=["4K", "64K", "1M", "16M", "64M"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-iters", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=300)
    p.add_argument("--budget-bytes", type=float, default=2e9, help="bytes moved per size")
    p.add_argument("--env", action="append", default=[], help="KEY=VAL for the byteps job")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="byteps", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker_main(args)
    bps = run_job(args, "byteps")
    gloo = run_job(args, "gloo")
    mode = (f"{args.workers} workers x {args.local_size} local, {args.servers} servers"
            if args.workers > 1 else f"1 machine x {args.local_size} local processes")
    print(f"\n### push_pull vs gloo all_reduce ({mode}, float32, median)\n")
    print("| size | byteps ms | gloo ms | byteps GB/s | gloo GB/s | gloo/byteps |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sorted(bps):
        b, g = bps[n], gloo[n]
        print(f"| {n:,} B | {b * 1e3:.3f} | {g * 1e3:.3f} | {n / b / 1e9:.2f} | {n / g / 1e9:.2f} "
              f"| {g / b:.2f} |")


if __name__ == "__main__":
    main()
