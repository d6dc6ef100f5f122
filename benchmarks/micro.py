"""Loopback microbenchmarks: push_pull next to gloo all_reduce and raw TCP, in one run.

Jobs run on this host, each with two worker processes and the same tensors:

* ``local``  — byteps, one worker machine with two local processes (``bpslaunch --workers 1
  --local-size 2``): the shared-memory path, no sockets;
* ``dist``   — byteps forced through the network path: two worker machines and one server
  (``bpslaunch --workers 2 --servers 1``), once per van of the plan (:mod:`benchmarks.vans`;
  default: the TCP van on loopback, and where byteps has UCX the UCX van over shared memory);
  the TCP van's results are ``dist``, another van's ``dist:<van>`` (``dist:ucx-shm``);
* ``gloo``   — ``torch.distributed.all_reduce`` (gloo), two processes, ``MASTER_ADDR=127.0.0.1``;
* ``tcp``    — raw TCP on loopback: one Python sender/receiver pair with large
  ``sendall``/``recv_into`` (and two pairs in parallel, for the aggregate).

Every job measures (float32, in place, sum): the median time per operation versus size, the
one-tensor-at-a-time throughput (``count`` distinct 4 KiB tensors, each a new name used once,
synchronised one by one; and the same issued all at once), the steady-state time per operation
on one reused 4 KiB name (so first use minus steady state = the first-use/declare cost), and,
for byteps, the time of ``declare()`` alone. Worker code runs in this module behind the hidden
``--worker`` flag; rank 0 writes a JSON file that the parent reads.

    python -m benchmarks.micro [--quick] [--sizes 4K 64M] [--jobs local,dist,gloo,tcp]
                               [--vans tcp,ucx-shm]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from . import child_env, runner
from . import vans as bv

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

#: 4 KiB ... 256 MiB in steps of 4x.
FULL_SIZES = [4 << 10 << (2 * i) for i in range(9)]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]

#: job name -> (description, launcher arguments); None = gloo / raw TCP (no launcher).
BYTEPS_JOBS = {
    "local": ("byteps, 1 machine x 2 local processes (shared memory)",
              ["--workers", "1", "--local-size", "2"]),
    "dist": ("byteps, 2 worker machines + 1 server (TCP loopback)",
             ["--workers", "2", "--servers", "1"]),
}
#: What the ``dist`` job says about its van, per van (the TCP van's is in its description).
DIST_VAN = {"ucx-shm": "the UCX van over shared memory (`UCX_TLS=sm,self`)",
            "ucx-tcp": "the UCX van over TCP loopback (`UCX_TLS=tcp,self`)",
            "ucx": "the UCX van, transports of UCX's choice",
            "ipc": "the TCP van with `BYTEPS_ENABLE_IPC=1` (colocated peers over UCX shared "
                   "memory)"}
JOBS = ("local", "dist", "gloo", "tcp")
WORLD = 2  # worker processes of every job


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1GiB' -> 1073741824, '100' -> 100 (bytes)."""
    text = text.strip().upper()
    for suffix in ("IB", "B"):
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)]
            break
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def job_key(job: str, van: str = "tcp") -> str:
    """The results key of a job run on a van: 'dist' (TCP van), 'dist:ucx-shm'."""
    return job if van == "tcp" else f"{job}:{van}"


def fmt_size(nbytes: int) -> str:
    """4096 -> '4 KiB', 67108864 -> '64 MiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# ------------------------------------------------------------------------------ settings --
def settings(quick: bool, sizes: Optional[Sequence[int]] = None, **override) -> dict:
    """The measurement plan. ``quick`` = the CI subset; keyword arguments override fields."""
    plan = {
        "sizes": list(sizes) if sizes else list(QUICK_SIZES if quick else FULL_SIZES),
        "warmup": 2 if quick else 3,
        "min_iters": 3 if quick else 5,
        "max_iters": 100 if quick else 400,
        "budget_bytes": 3e8 if quick else 2e9,  # bytes moved per size and job
        "count": 500 if quick else 2000,  # one-tensor-at-a-time tensors
        "oat_bytes": 4096,
        "repeats": 1 if quick else 3,  # every job is run this often; the best is kept
        "tcp_bytes": (256 << 20) if quick else (1 << 30),
        "tcp_chunk": 16 << 20,
        "timeout": 300.0,
        "env": [],  # KEY=VAL for the byteps jobs
        # vans the dist job runs on (benchmarks.vans); 'local' needs none (shared memory)
        "vans": bv.default_vans(netns=False),
    }
    plan.update({k: v for k, v in override.items() if v is not None})
    plan["vans"] = bv.check(plan["vans"])
    return plan


# -------------------------------------------------------------------------------- worker --
def _iters(nbytes: int, args: argparse.Namespace) -> int:
    return int(max(args.min_iters, min(args.max_iters, args.budget_bytes // max(nbytes, 1))))


def worker_main(args: argparse.Namespace) -> None:
    """Runs inside each worker process: times the operations; rank 0 writes the JSON."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    res: dict = {"latency": {}, "best": {}, "iters": {}}
    if args.backend == "byteps":
        import byteps.torch as bps

        bps.init()
        rank = bps.rank()

        def start(t, name):
            return bps.push_pull_async_inplace(t, average=False, name=name)

        def finish(h):
            bps.synchronize(h)

        bar_t = torch.zeros(1)

        def barrier():
            finish(start(bar_t, "bench.barrier"))
    else:
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))

        def start(t, name):
            return dist.all_reduce(t, async_op=True)

        def finish(h):
            h.wait()

        def barrier():
            dist.barrier()

    def op(t, name):
        finish(start(t, name))

    barrier()
    # -- latency / bandwidth versus size (zeros: no overflow, no denormals) --
    for nbytes in args.sizes:
        t = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)
        name = f"bench.size.{nbytes}"
        for _ in range(args.warmup):
            op(t, name)
        barrier()
        times = []
        for _ in range(_iters(nbytes, args)):
            t0 = time.perf_counter()
            op(t, name)
            times.append(time.perf_counter() - t0)
        res["latency"][nbytes] = float(np.median(times))
        res["best"][nbytes] = float(np.min(times))
        res["iters"][nbytes] = len(times)
        del t

    # -- one tensor at a time: many distinct small tensors, each a new name used once --
    n, elems = args.count, max(args.oat_bytes // 4, 1)
    tensors = [torch.zeros(elems) for _ in range(n)]
    reuse = torch.zeros(elems)
    for _ in range(args.warmup + 5):
        op(reuse, "bench.oat.reuse")
    barrier()
    k = min(n, 500)
    t0 = time.perf_counter()
    for _ in range(k):
        op(reuse, "bench.oat.reuse")
    steady = (time.perf_counter() - t0) / k
    barrier()
    t0 = time.perf_counter()
    for i, t in enumerate(tensors):
        op(t, f"bench.oat.{i}")
    seq = time.perf_counter() - t0
    barrier()
    tensors = [torch.zeros(elems) for _ in range(n)]
    barrier()
    t0 = time.perf_counter()
    handles = [start(t, f"bench.oatb.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        finish(h)
    batched = time.perf_counter() - t0
    res["one_at_a_time"] = {"count": n, "nbytes": elems * 4, "seq_s": seq, "batched_s": batched,
                            "steady_per_op_s": steady, "steady_ops": k}
    if args.backend == "byteps":
        barrier()
        t0 = time.perf_counter()
        for i in range(n):
            bps.declare(f"bench.decl.{i}")
        res["declare_per_call_s"] = (time.perf_counter() - t0) / n
    barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    if args.backend == "byteps":
        bps.shutdown()
    else:
        dist.destroy_process_group()


# -------------------------------------------------------------------------------- parent --
def _run_procs(cmds: List[List[str]], envs: List[dict], timeout: float, label: str) -> None:
    """Run the commands together (:class:`runner.Group`: each in its own session), waiting at
    most ``timeout`` s in all; on the first non-zero exit or at the timeout stop them all (by
    PID: SIGTERM, then SIGKILL) and raise RuntimeError with the tail of their output."""
    with runner.Group() as group:
        for i, (c, e) in enumerate(zip(cmds, envs)):
            group.start(c, e, label=f"{label} process {i}")
        codes = group.wait_all(timeout, fail_fast=True)
        failed = next((f"exit status {c}" for c in codes if c not in (None, 0)), None)
        if failed is None and None in codes:
            failed = f"timed out after {timeout:.0f} s"
        if failed:
            group.stop(grace=5.0)
            raise RuntimeError(f"{label}: {failed}\n{group.output(limit=4000)}")


def _worker_cmd(plan: dict, backend: str, out: str) -> List[str]:
    return [sys.executable, "-m", "benchmarks.micro", "--worker", "--backend", backend,
            "--out", out, "--warmup", str(plan["warmup"]), "--min-iters", str(plan["min_iters"]),
            "--max-iters", str(plan["max_iters"]), "--budget-bytes", str(plan["budget_bytes"]),
            "--count", str(plan["count"]), "--oat-bytes", str(plan["oat_bytes"]),
            "--sizes", *[str(s) for s in plan["sizes"]]]


def run_job(plan: dict, job: str, van: str = "tcp") -> dict:
    """Run one byteps ('local', 'dist') or gloo job once; returns rank 0's results. A byteps
    job runs on ``van`` (:mod:`benchmarks.vans`), the plan's ``env`` on top."""
    fd, out = tempfile.mkstemp(suffix=f".{job}.json")
    os.close(fd)
    try:
        if job in BYTEPS_JOBS:
            cmd = [sys.executable, "-m", "byteps.launch", *BYTEPS_JOBS[job][1]]
            for e in [f"{k}={v}" for k, v in bv.job_env(van).items()] + list(plan["env"]):
                cmd += ["--env", e]
            _run_procs([cmd + _worker_cmd(plan, "byteps", out)], [child_env()],
                       plan["timeout"], f"byteps {job_key(job, van)} job")
        elif job == "gloo":
            port = str(runner.free_port())
            envs = [dict(child_env(), RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo") for r in range(WORLD)]
            cmd = _worker_cmd(plan, "gloo", out)
            _run_procs([cmd] * WORLD, envs, plan["timeout"], "gloo job")
        else:
            raise ValueError(f"unknown job {job!r}")
        with open(out) as f:
            data = json.load(f)
    finally:
        os.unlink(out)
    for key in ("latency", "best", "iters"):
        data[key] = {int(k): v for k, v in data[key].items()}
    return data


def tcp_throughput(total: int, chunk: int, streams: int = 1) -> float:
    """Raw TCP on loopback: ``streams`` sender/receiver thread pairs each move ``total`` bytes
    with ``sendall`` / ``recv_into`` of ``chunk``-byte buffers; returns aggregate bytes/s."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(streams)
    addr = listener.getsockname()
    errors: List[BaseException] = []
    ready = threading.Barrier(2 * streams + 1)

    def send():
        try:
            buf = memoryview(bytearray(chunk))
            with socket.create_connection(addr) as s:
                ready.wait()
                left = total
                while left > 0:
                    n = min(left, chunk)
                    s.sendall(buf[:n])
                    left -= n
        except BaseException as e:
            errors.append(e)
            ready.abort()

    def recv(conn):
        try:
            buf = memoryview(bytearray(chunk))
            with conn:
                ready.wait()
                left = total
                while left > 0:
                    n = conn.recv_into(buf, min(left, chunk))
                    if n == 0:
                        raise ConnectionError("sender closed early")
                    left -= n
        except BaseException as e:
            errors.append(e)
            ready.abort()

    threads = []
    with listener:
        for _ in range(streams):
            ts = threading.Thread(target=send, daemon=True)
            ts.start()
            conn, _ = listener.accept()
            tr = threading.Thread(target=recv, args=(conn,), daemon=True)
            tr.start()
            threads += [ts, tr]
        ready.wait(timeout=30)
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        secs = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"raw TCP benchmark failed: {errors[0]!r}")
    return streams * total / secs


def _better(old: Optional[dict], new: dict) -> dict:
    """Merge two runs of one job keeping, per number, the best (lowest time)."""
    if old is None:
        return new
    out = dict(new)
    for key in ("latency", "best"):
        out[key] = {n: min(old[key][n], new[key][n]) for n in new[key]}
    oat_old, oat_new = old["one_at_a_time"], new["one_at_a_time"]
    out["one_at_a_time"] = dict(oat_new, **{
        k: min(oat_old[k], oat_new[k]) for k in ("seq_s", "batched_s", "steady_per_op_s")})
    if "declare_per_call_s" in new:
        out["declare_per_call_s"] = min(old["declare_per_call_s"], new["declare_per_call_s"])
    return out


def _runs(plan: dict, jobs: Sequence[str]) -> List[tuple]:
    """(job, van) of every job run of one repeat: 'dist' once per van of the plan."""
    return [(j, v) for j in jobs if j != "tcp"
            for v in (plan["vans"] if j == "dist" else ["tcp"])]


def steps(plan: dict, jobs: Sequence[str] = JOBS) -> int:
    """Number of progress steps :func:`run` reports."""
    return plan["repeats"] * len(_runs(plan, jobs)) + (1 if "tcp" in jobs else 0)


def run(plan: dict, jobs: Sequence[str] = JOBS,
        progress: Optional[Callable[[str], None]] = None) -> dict:
    """Run every job ``plan['repeats']`` times (interleaved, so background load hits all of
    them alike) and keep the best of each number. Returns a JSON-able dict."""
    progress = progress or (lambda label: None)
    results: Dict[str, dict] = {}
    for rep in range(plan["repeats"]):
        for job, van in _runs(plan, jobs):
            key = job_key(job, van)
            progress(f"micro {key} ({rep + 1}/{plan['repeats']})")
            results[key] = _better(results.get(key), run_job(plan, job, van))
    if "tcp" in jobs:
        progress("micro raw TCP")
        reps = max(plan["repeats"], 2)
        one = max(tcp_throughput(plan["tcp_bytes"], plan["tcp_chunk"], 1) for _ in range(reps))
        two = max(tcp_throughput(plan["tcp_bytes"] // 2, plan["tcp_chunk"], 2)
                  for _ in range(reps))
        results["tcp"] = {"bytes": plan["tcp_bytes"], "chunk": plan["tcp_chunk"],
                          "single_Bps": one, "dual_Bps": two, "repeats": reps}
    plan_out = {k: v for k, v in plan.items()}
    vans = {v: bv.describe(v, bv.job_env(v)) for v in plan["vans"]}
    dist = BYTEPS_JOBS["dist"][0].split(" (")[0]
    return {"plan": plan_out, "world": WORLD, "jobs": results, "vans": vans,
            "descriptions": {**{k: v[0] for k, v in BYTEPS_JOBS.items()},
                             **{job_key("dist", v): f"{dist}, {DIST_VAN.get(v, vans[v])}"
                                for v in plan["vans"] if v != "tcp"},
                             "gloo": "torch.distributed gloo all_reduce, 2 processes",
                             "tcp": "raw TCP on loopback (Python sendall/recv_into)"}}


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the CI subset of sizes, one repeat")
    p.add_argument("--sizes", nargs="+", help="tensor sizes, e.g. 4K 64M (default: all)")
    p.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: " + ",".join(JOBS))
    p.add_argument("--vans", help="comma-separated vans of the dist job (benchmarks.vans: "
                   f"{', '.join(bv.VANS)}; default: tcp, plus ucx-shm where byteps has UCX)")
    p.add_argument("--repeats", type=int, help="runs of every job; the best is kept")
    p.add_argument("--count", type=int, help="tensors of the one-tensor-at-a-time test")
    p.add_argument("--env", action="append", help="KEY=VAL for the byteps jobs (repeatable)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="byteps", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    p.add_argument("--min-iters", type=int, help=argparse.SUPPRESS)
    p.add_argument("--max-iters", type=int, help=argparse.SUPPRESS)
    p.add_argument("--budget-bytes", type=float, help=argparse.SUPPRESS)
    p.add_argument("--oat-bytes", type=int, default=4096, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes] if args.sizes else None
    if args.worker:
        args.sizes = sizes
        return worker_main(args)
    plan = settings(args.quick, sizes, repeats=args.repeats, count=args.count, env=args.env,
                    vans=args.vans.split(",") if args.vans else None)
    results = run(plan, [j for j in args.jobs.split(",") if j],
                  progress=lambda label: print(label, file=sys.stderr, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    from . import report

    print(report.micro_markdown(results, img_dir=None)[0])


if __name__ == "__main__":
    main()
