"""Horovod's collectives on byteps next to gloo's through torch.distributed (docs/collectives.md).

One job of each on this host's loopback, two worker processes, float32: byteps with two worker
machines and one server (``bpslaunch --workers 2 --servers 1``: every collective crosses the
network path), gloo with two processes (``MASTER_ADDR=127.0.0.1``). Each measures the median
time of

* allreduce with Sum, Min and Max (byteps: push_pull with the op; gloo: ``all_reduce``);
* allgather (every rank the same rows; gloo: ``all_gather_into_tensor``), broadcast from rank 0,
  reducescatter (Sum; gloo: ``reduce_scatter_tensor`` where gloo has it), alltoall with even
  splits (gloo: ``all_to_all_single``), each of a tensor of ``size`` bytes (allgather: the
  gathered bytes);
* grouped_allreduce of ``GROUP`` tensors of 4 KiB (gloo: the same all_reduces started together
  and waited for together).

Worker code runs in this module behind the hidden ``--worker`` flag; rank 0 writes a JSON file.

    python -m benchmarks.collectives_bench [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional, Sequence

from . import child_env, report, runner

WORLD = 2
GROUP = 200
OPS = ("allreduce.sum", "allreduce.min", "allreduce.max", "allgather", "broadcast",
       "reducescatter", "alltoall", "grouped_allreduce")


def bench_settings(quick: bool) -> dict:
    return {"quick": quick, "sizes": [4 << 20] if quick else [4 << 20, 64 << 20],
            "iters": 5 if quick else 15, "warmup": 2, "timeout": 300.0}


def bench_steps(plan: dict) -> int:
    return 2


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def worker_main(args: argparse.Namespace) -> None:
    """Inside each worker process: time every collective; rank 0 writes the JSON."""
    import torch

    torch.set_num_threads(1)
    byteps = args.backend == "byteps"
    if byteps:
        import byteps.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        run = {
            "allreduce.sum": lambda t, n: hvd.allreduce_(t, op=hvd.Sum, name=n),
            "allreduce.min": lambda t, n: hvd.allreduce_(t, op=hvd.Min, name=n),
            "allreduce.max": lambda t, n: hvd.allreduce_(t, op=hvd.Max, name=n),
            "allgather": lambda t, n: hvd.allgather(t[: t.numel() // size], name=n),
            "broadcast": lambda t, n: hvd.broadcast_(t, 0, name=n),
            "reducescatter": lambda t, n: hvd.reducescatter(t, op=hvd.Sum, name=n),
            "alltoall": lambda t, n: hvd.alltoall(t, name=n),
            "grouped_allreduce": lambda ts, n: hvd.grouped_allreduce_(ts, op=hvd.Sum, name=n),
        }
        barrier = hvd.barrier
    else:
        import torch.distributed as dist

        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", rank=rank, world_size=size)

        def gather(t, n):
            part = t[: t.numel() // size]
            out = torch.empty(part.numel() * size)
            dist.all_gather_into_tensor(out, part)

        def scatter(t, n):
            out = torch.empty(t.numel() // size)
            dist.reduce_scatter_tensor(out, t)

        def grouped(ts, n):
            for w in [dist.all_reduce(t, async_op=True) for t in ts]:
                w.wait()

        run = {
            "allreduce.sum": lambda t, n: dist.all_reduce(t, op=dist.ReduceOp.SUM),
            "allreduce.min": lambda t, n: dist.all_reduce(t, op=dist.ReduceOp.MIN),
            "allreduce.max": lambda t, n: dist.all_reduce(t, op=dist.ReduceOp.MAX),
            "allgather": gather,
            "broadcast": lambda t, n: dist.broadcast(t, 0),
            "reducescatter": scatter,
            "alltoall": lambda t, n: dist.all_to_all_single(torch.empty_like(t), t),
            "grouped_allreduce": grouped,
        }
        barrier = dist.barrier
    res: dict = {}
    for nbytes in args.sizes:
        t = torch.zeros(nbytes // 4)
        small = [torch.zeros(1024) for _ in range(GROUP)]
        for op in OPS:
            arg = small if op == "grouped_allreduce" else t
            name = f"bench.{op}.{nbytes}"
            try:
                for _ in range(args.warmup):
                    run[op](arg, name)
                barrier()
                times = []
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    run[op](arg, name)
                    times.append(time.perf_counter() - t0)
                res[f"{op}@{nbytes}"] = _median(times)
            except (RuntimeError, NotImplementedError) as exc:  # a collective gloo lacks
                res[f"{op}@{nbytes}"] = None
                res[f"{op}@{nbytes}.error"] = str(exc).splitlines()[0][:200]
                barrier()
    barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    if byteps:
        hvd.shutdown()
    else:
        dist.destroy_process_group()


def _worker_cmd(plan: dict, backend: str, out: str) -> list:
    return [sys.executable, "-m", "benchmarks.collectives_bench", "--worker", "--backend",
            backend, "--out", out, "--iters", str(plan["iters"]), "--warmup",
            str(plan["warmup"]), "--sizes", *[str(s) for s in plan["sizes"]]]


def _run(plan: dict, backend: str) -> dict:
    fd, out = tempfile.mkstemp(suffix=f".{backend}.json")
    os.close(fd)
    try:
        with runner.Group() as group:
            if backend == "byteps":
                cmd = [sys.executable, "-m", "byteps.launch", "--workers", str(WORLD),
                       "--servers", "1"] + _worker_cmd(plan, backend, out)
                group.start(cmd, child_env(), label="byteps collectives job")
            else:
                port = str(runner.free_port())
                for r in range(WORLD):
                    env = dict(child_env(), RANK=str(r), WORLD_SIZE=str(WORLD),
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo")
                    group.start(_worker_cmd(plan, backend, out), env, label=f"gloo rank {r}")
            codes = group.wait_all(plan["timeout"], fail_fast=True)
            if any(c != 0 for c in codes):
                group.stop(grace=5.0)
                raise RuntimeError(f"{backend} collectives job: exit codes {codes}\n"
                                   f"{group.output(limit=4000)}")
        with open(out) as f:
            return json.load(f)
    finally:
        os.unlink(out)


def bench_run(plan: dict, progress) -> dict:
    results = {"plan": plan}
    for backend in ("byteps", "gloo"):
        progress(f"collectives: {backend}")
        results[backend] = _run(plan, backend)
    return results


def _ms(x: Optional[float]) -> str:
    return "—" if x is None else f"{x * 1e3:.2f}"


def bench_markdown(results: dict, img_dir: str, img_rel: str) -> tuple:
    plan, bp, gl = results["plan"], results["byteps"], results["gloo"]
    rows, targets = [], []
    for nbytes in plan["sizes"]:
        for op in OPS:
            b, g = bp.get(f"{op}@{nbytes}"), gl.get(f"{op}@{nbytes}")
            what = f"{GROUP} x 4 KiB" if op == "grouped_allreduce" else f"{nbytes >> 20} MiB"
            ratio = f"{g / b:.2f}x" if b and g else "—"
            rows.append([op, what, _ms(b), _ms(g), ratio])
        total = bp.get(f"allreduce.sum@{nbytes}")
        for op in ("min", "max"):
            t = bp.get(f"allreduce.{op}@{nbytes}")
            if total and t:
                targets.append(report.target(
                    f"allreduce {op.capitalize()} vs Sum, {nbytes >> 20} MiB",
                    "within 5 % of Sum's time", f"{_ms(t)} vs {_ms(total)} ms", total / t,
                    0.95))
    b, g = bp.get(f"grouped_allreduce@{plan['sizes'][0]}"), gl.get(
        f"grouped_allreduce@{plan['sizes'][0]}")
    if b and g:
        targets.append(report.target(f"grouped_allreduce of {GROUP} x 4 KiB vs gloo",
                                     "at least gloo's speed", f"{_ms(b)} vs {_ms(g)} ms", g / b,
                                     1.0))
    md = ["## Collectives (loopback)", "",
          "Horovod's collectives through byteps (2 worker machines + 1 server on loopback, "
          "`byteps.torch`) and gloo's through torch.distributed (2 processes), float32, median "
          f"of {plan['iters']} (docs/collectives.md; the emulated cluster's rows are not run "
          "yet). Milliseconds; the ratio is gloo's time over byteps's (above 1: byteps "
          "faster).", "",
          report._table(["collective", "tensor", "byteps ms", "gloo ms", "gloo / byteps"],
                        rows, "llrrr")]
    errors = sorted(k for k in gl if k.endswith(".error"))
    if errors:
        md += ["", "gloo lacks: " + "; ".join(f"{k[:-6]} ({gl[k]})" for k in errors)]
    return "\n".join(md), targets


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.collectives_bench")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=("byteps", "gloo"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--iters", type=int, default=5, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=int, nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)
    plan = bench_settings(args.quick)
    results = bench_run(plan, lambda label: print(label, flush=True))
    md, targets = bench_markdown(results, "", "")
    print(md)
    print(report.targets_table(targets))


if __name__ == "__main__":
    main()
