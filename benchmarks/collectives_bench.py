"""Horovod's collectives on byteps next to gloo's through torch.distributed (docs/collectives.md).

Two layouts, one job of each library per layout, float32:

* ``loopback`` (quick, the CI smoke run): this host, byteps with two worker machines and one
  server (``bpslaunch --workers 2 --servers 1``: every collective crosses the network path),
  gloo with two processes (``MASTER_ADDR=127.0.0.1``);
* ``cluster`` (the full run, with root and iproute2): the emulated cluster of
  :mod:`benchmarks.cluster`, n = 4 worker hosts with links of ``bandwidth_mbit`` and k = 0 and
  k = 4 CPU-server hosts (byteps placed as :func:`benchmarks.cluster.run_byteps_job` places
  it; gloo one process per worker host).

Each rank times every iteration (after a barrier); a result is the median over the iterations
of the slowest rank's time, of

* allreduce with Sum, Min and Max (byteps: push_pull with the op; gloo: ``all_reduce``);
* allgather (every rank the same rows; gloo: ``all_gather_into_tensor``), broadcast from rank 0,
  reducescatter (Sum; gloo: ``reduce_scatter_tensor`` where gloo has it), alltoall with even
  splits (gloo: ``all_to_all_single``), each of a tensor of ``size`` bytes (allgather: the
  gathered bytes);
* grouped_allreduce of ``GROUP`` tensors of 4 KiB (gloo: the same all_reduces started together
  and waited for together);
* byteps only: a training step (forward, backward, ``DistributedOptimizer``) of a small CNN
  with ``BatchNorm2d`` and the same with ``byteps.torch.SyncBatchNorm``.

Worker code runs in this module behind the hidden ``--worker`` flag; every rank prints
``RESULT {json}`` with its times.

    python -m benchmarks.collectives_bench [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

from . import child_env, report, runner
from . import cluster as bc

WORLD = 2
GROUP = 200
OPS = ("allreduce.sum", "allreduce.min", "allreduce.max", "allgather", "broadcast",
       "reducescatter", "alltoall", "grouped_allreduce")
#: The training steps timed by the byteps job (key: "<step>@step").
STEPS = ("bn_step", "syncbn_step")
#: The collectives whose route is the worker mesh: their wire-limited optimum in bytes that
#: cross each worker link, per byte of the tensor (docs/collectives.md, the analysis).
MESH_BOUND = {"allgather": lambda n: (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
              "alltoall": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


#: The emulated cluster's layouts (n worker hosts, k CPU-server hosts) and link, as table1's.
CLUSTER_CONFIGS = ((4, 0), (4, 4))
BANDWIDTH_MBIT = 800.0


def bench_settings(quick: bool, mode: Optional[str] = None) -> dict:
    """Quick: loopback, 4 MiB, 5 iterations (about 30 s). Full: the emulated cluster when it
    can be built (else loopback), 4 and 64 MiB, 10 and 7 iterations (the emulated links on a
    2-core host give single iterations of 64 MiB up to twice the usual time: a median of 3
    moved by 40 % between runs; docs/performance-notes.md)."""
    if mode is None:
        mode = "loopback" if quick or bc.netns_unavailable() else "cluster"
    sizes = [4 << 20] if quick else [4 << 20, 64 << 20]
    return {"quick": quick, "mode": mode, "sizes": sizes,
            "iters": {str(sz): 5 if quick else (10 if sz <= 8 << 20 else 7) for sz in sizes},
            "warmup": 1, "timeout": 300.0 if quick else 900.0,
            "configs": [[WORLD, 1]] if mode == "loopback" else [list(c) for c in CLUSTER_CONFIGS],
            "bandwidth_mbit": BANDWIDTH_MBIT}


def bench_steps(plan: dict) -> int:
    return 2 * len(plan["configs"])


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _aggregate(reports: list) -> dict:
    """Every rank's ``RESULT`` -> {key: median over iterations of the slowest rank's time, or
    None where an operation failed (its error under ``key.error``)}."""
    out: dict = {}
    for key, times in reports[0]["times"].items():
        if times is None or any(r["times"].get(key) is None for r in reports):
            out[key] = None
            out[key + ".error"] = next(r["errors"][key] for r in reports if key in r["errors"])
        else:
            out[key] = _median([max(ts) for ts in zip(*(r["times"][key] for r in reports))])
    return out


def _reports(text: str) -> list:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines()
            if "RESULT {" in line]


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
    res: dict = {"rank": rank, "times": {}, "errors": {}}
    for nbytes, iters in zip(args.sizes, args.iters):
        t = torch.zeros(nbytes // 4)
        small = [torch.zeros(1024) for _ in range(GROUP)]
        for op in [o for o in OPS if o in args.ops]:
            arg = small if op == "grouped_allreduce" else t
            name = f"bench.{op}.{nbytes}"
            key = f"{op}@{nbytes}"
            try:
                for _ in range(args.warmup):
                    run[op](arg, name)
                times = []
                for _ in range(iters):
                    barrier()  # every rank starts together
                    t0 = time.perf_counter()
                    run[op](arg, name)
                    times.append(time.perf_counter() - t0)
                res["times"][key] = times
            except (RuntimeError, NotImplementedError) as exc:  # a collective gloo lacks
                res["times"][key] = None
                res["errors"][key] = str(exc).splitlines()[0][:200]
                barrier()
    if byteps:
        for step in [s for s in STEPS if s in args.ops]:
            res["times"][f"{step}@step"] = _time_steps(hvd, step == "syncbn_step",
                                                       max(args.iters), barrier)
    barrier()
    print("RESULT " + json.dumps(res), flush=True)
    if byteps:
        hvd.shutdown()
    else:
        dist.destroy_process_group()


def _time_steps(hvd, sync_bn: bool, iters: int, barrier) -> list:
    """The times of ``iters`` training steps (after two warm-up steps) of a small CNN on a
    batch of 32 images of 3 x 32 x 32: BatchNorm2d, or SyncBatchNorm (its statistics over every
    rank's batch: two push_pulls per layer and step), gradients through DistributedOptimizer."""
    import torch

    norm = hvd.SyncBatchNorm if sync_bn else torch.nn.BatchNorm2d
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), norm(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1, stride=2), norm(64), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    tag = "sync" if sync_bn else "plain"
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()])
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    times = []
    for i in range(iters + 2):
        barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times


def _worker_cmd(plan: dict, backend: str) -> list:
    return [sys.executable, "-m", "benchmarks.collectives_bench", "--worker", "--backend",
            backend, "--warmup", str(plan["warmup"]),
            "--sizes", *[str(s) for s in plan["sizes"]],
            "--iters", *[str(plan["iters"][str(s)]) for s in plan["sizes"]]]


def _run_loopback(plan: dict, backend: str) -> dict:
    with runner.Group() as group:
        if backend == "byteps":
            cmd = [sys.executable, "-m", "byteps.launch", "--workers", str(WORLD),
                   "--servers", "1"] + _worker_cmd(plan, backend)
            group.start(cmd, child_env(), label="byteps collectives job")
        else:
            port = str(runner.free_port())
            for r in range(WORLD):
                env = dict(child_env(), RANK=str(r), WORLD_SIZE=str(WORLD),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo")
                group.start(_worker_cmd(plan, backend), env, label=f"gloo rank {r}")
        codes = group.wait_all(plan["timeout"], fail_fast=True)
        reports = _reports(group.output())
        if any(c != 0 for c in codes) or len(reports) != WORLD:
            group.stop(grace=5.0)
            raise RuntimeError(f"{backend} collectives job: exit codes {codes}\n"
                               f"{group.output(limit=4000)}")
    return _aggregate(reports)


def _run_cluster(plan: dict, cluster, backend: str) -> dict:
    n = cluster.num_workers
    if backend == "byteps":
        job = bc.run_byteps_job(cluster, _worker_cmd(plan, backend), {"OMP_NUM_THREADS": "1"},
                                timeout=plan["timeout"])
        return _aggregate(job.worker_reports("byteps collectives job"))
    env = {**child_env(), "MASTER_ADDR": cluster.workers[0].address,
           "MASTER_PORT": str(runner.free_port()), "WORLD_SIZE": str(n),
           "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    outs, codes = bc.run_on_worker_hosts(cluster, _worker_cmd(plan, backend), env,
                                         plan["timeout"], "gloo collectives job")
    reports = [r for out in outs for r in _reports(out)]
    if any(c != 0 for c in codes) or len(reports) != n:
        raise RuntimeError(f"gloo collectives job failed (exit codes {codes}):\n"
                           + "\n".join(outs[0].splitlines()[-15:]))
    return _aggregate(reports)


def bench_run(plan: dict, progress) -> dict:
    """{"plan", "runs": [{"config": [n, k], "byteps": {...}, "gloo": {...}}]}."""
    runs = []
    for n, k in plan["configs"]:
        run: dict = {"config": [n, k]}
        if plan["mode"] == "loopback":
            for backend in ("byteps", "gloo"):
                progress(f"collectives loopback: {backend}")
                run[backend] = _run_loopback(plan, backend)
        else:
            with bc.EmulatedCluster(n, k, plan["bandwidth_mbit"] * 1e6) as cluster:
                for backend in ("byteps", "gloo"):
                    progress(f"collectives n={n} k={k}: {backend}")
                    run[backend] = _run_cluster(plan, cluster, backend)
        runs.append(run)
    return {"plan": plan, "runs": runs}


def _ms(x: Optional[float]) -> str:
    return "—" if x is None else f"{x * 1e3:.2f}"


def bench_markdown(results: dict, img_dir: str, img_rel: str) -> tuple:
    plan = results["plan"]
    loopback = plan["mode"] == "loopback"
    md, targets = ["## Collectives" + (" (loopback)" if loopback else ""), ""], []
    md.append(
        ("Horovod's collectives through byteps (2 worker machines + 1 server on loopback, "
         "`byteps.torch`) and gloo's through torch.distributed (2 processes)" if loopback else
         f"Horovod's collectives through byteps (`byteps.torch`) and gloo's through "
         f"torch.distributed on the emulated cluster (n worker hosts, k CPU-server hosts, "
         f"links of {plan['bandwidth_mbit']:.0f} Mbit/s)")
        + ", float32; the median over the iterations of the slowest rank's time, milliseconds "
          "(docs/collectives.md). The ratio is gloo's time over byteps's (above 1: byteps "
          "faster).")
    for run in results["runs"]:
        (n, k), bp, gl = run["config"], run["byteps"], run["gloo"]
        where = "" if loopback else f", n={n} k={k}"
        rows = []
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
                        f"allreduce {op.capitalize()} vs Sum, {nbytes >> 20} MiB{where}",
                        "within 5 % of Sum's time", f"{_ms(t)} vs {_ms(total)} ms", total / t,
                        0.95))
            if not loopback:
                targets += _cluster_targets(n, k, nbytes, bp, gl, plan["bandwidth_mbit"], where)
        key = f"grouped_allreduce@{plan['sizes'][0]}"
        b, g = bp.get(key), gl.get(key)
        if b and g:
            targets.append(report.target(f"grouped_allreduce of {GROUP} x 4 KiB vs gloo{where}",
                                         "at least gloo's speed", f"{_ms(b)} vs {_ms(g)} ms",
                                         g / b, 1.0))
        plain, sync = bp.get("bn_step@step"), bp.get("syncbn_step@step")
        if plain and sync:
            rows.append(["training step, BatchNorm2d", "CNN, batch 32", _ms(plain), "—", "—"])
            rows.append(["training step, SyncBatchNorm", "CNN, batch 32", _ms(sync), "—", "—"])
            if k == 0:
                targets.append(report.target(
                    f"SyncBatchNorm step vs BatchNorm step{where}", "at most 1.2 x",
                    f"{_ms(sync)} vs {_ms(plain)} ms", 1.2 * plain / sync, 1.0))
        if not loopback:
            md += ["", f"### n = {n}, k = {k}"]
        md += ["", report._table(["collective", "tensor", "byteps ms", "gloo ms",
                                  "gloo / byteps"], rows, "llrrr")]
        errors = sorted(key for key in gl if key.endswith(".error"))
        if errors:
            md += ["", "gloo lacks: " + "; ".join(f"{e[:-6]} ({gl[e]})" for e in errors)]
    return "\n".join(md), targets


def _cluster_targets(n: int, k: int, nbytes: int, bp: dict, gl: dict, mbit: float,
                     where: str) -> list:
    """The emulated cluster's targets of one size: each mesh collective within 1.15 x its
    wire-limited optimum and (allgather, reducescatter, alltoall: gloo's ring meets the same
    bound) at least gloo's speed; allreduce Sum's speed-up over gloo's ring at least 0.95 x the
    theory's where the servers help (k > 0: ring 2(n-1)/n M/B against max(1, n/k) M/B)."""
    out, size = [], f"{nbytes >> 20} MiB"
    per_s = mbit * 1e6 / 8
    for op, share in MESH_BOUND.items():
        b, g = bp.get(f"{op}@{nbytes}"), gl.get(f"{op}@{nbytes}")
        if not b:
            continue
        bound = share(n) * nbytes / per_s
        out.append(report.target(f"{op} {size} vs its optimum{where}", "within 1.15 x",
                                 f"{_ms(b)} vs {_ms(bound)} ms", 1.15 * bound / b, 1.0))
        if g and op != "broadcast":
            out.append(report.target(f"{op} {size} vs gloo{where}", "at least gloo's speed",
                                     f"{_ms(b)} vs {_ms(g)} ms", g / b, 1.0))
    b, g = bp.get(f"allreduce.sum@{nbytes}"), gl.get(f"allreduce.sum@{nbytes}")
    if k > 0 and b and g:
        theory = (2 * (n - 1) / n) / max(1.0, n / k)
        out.append(report.target(f"allreduce Sum {size} speed-up over gloo{where}",
                                 f"at least 0.95 x the theory's {theory:.2f}x",
                                 f"{g / b:.2f}x", g / b / theory, 0.95))
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.collectives_bench")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=("byteps", "gloo"), help=argparse.SUPPRESS)
    p.add_argument("--iters", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--ops", nargs="+", choices=OPS + STEPS, default=list(OPS + STEPS),
                   help=argparse.SUPPRESS)  # worker: time only these (a focused run)
    p.add_argument("--json", help="also save the raw results to this file")
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)
    plan = bench_settings(args.quick)
    results = bench_run(plan, lambda label: print(label, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    md, targets = bench_markdown(results, "", "")
    print(md)
    print(report.targets_table(targets))


if __name__ == "__main__":
    main()
