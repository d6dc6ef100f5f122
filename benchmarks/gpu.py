"""GPU push_pull against its parts, measured in one run (docs/gpu.md "Numbers").

``python -m benchmarks.gpu [--mib 256] [--iters 5] [--json gpu.json]`` on a machine with a
CUDA device and torch. Two jobs of this script's workers (``--worker``), each worker process on
``cuda:<local_rank % devices>``:

* ``copies``: one process, forced distributed (1 worker machine + 1 server): the pinned-memory
  copy bandwidth of each direction (torch: one ``copy_(non_blocking=True)`` of the whole tensor
  between the device and pinned host memory, timed to ``torch.cuda.synchronize``); the
  bandwidth of byteps' copy stages, timed on the device (``_core.device.set_copy_timing``:
  events around each partition's copy, bytes over the device time between them, over the
  timed iterations); and the time the copy stages add, ``2 * bytes / (t_gpu - t_host)``: what
  the push_pull of the CUDA tensor takes beyond the push_pull of the same bytes from host
  memory, both in this process.
* ``parts``: 2 worker processes sharing the GPU as 2 worker machines + 1 server: per iteration
  the push_pull of a CUDA tensor (t_gpu), and, of the same size, a D2H copy into pinned memory,
  the CPU push_pull of that pinned tensor, an H2D copy (their sum: t_parts); allocation counters
  of the CUDA backend before and after the timed iterations.
* on a machine with several GPUs, ``machine``: one worker machine of one process per GPU (up to
  8), no servers, twice: the NCCL stages (``BYTEPS_NCCL=1``: an all-reduce among the GPUs) and
  the host path (``BYTEPS_NCCL=0``: each GPU's tensor copied to host memory and summed there);
  the same per-iteration times, and the CUDA backend's collective calls. With one GPU it is
  skipped, and the summary says so (NCCL refuses two ranks on one GPU).

Rank 0 of each job prints ``RESULT <json>``; the driver prints a summary and writes every
number to ``--json``. With ``--trace DIR`` the ``parts`` job runs once more (3 iterations) with
the timeline on (``BYTEPS_TRACE_ON``, its second and third push_pull of each tensor traced into
``DIR``), and ``DIR/step.png`` draws the last traced step: where the copy stages of the CUDA
tensor overlap its pushes and pulls. It measures; it asserts nothing (tests/test_gpu.py checks
correctness).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

from benchmarks import ROOT, child_env, runner


def _worker(args) -> None:
    import torch

    import byteps.torch as bps
    from byteps import _core

    bps.init()
    if args.job == "copies":  # before the first copy: every partition's copies timed
        _core.device.set_copy_timing("cuda", True)
    dev = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    n = args.mib * (1 << 20) // 4
    gpu = torch.ones(n, device=dev)
    pinned = torch.empty(n, pin_memory=True)
    host = torch.ones(n)

    def timed(fn) -> float:
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    def d2h():
        pinned.copy_(gpu, non_blocking=True)

    def h2d():
        gpu.copy_(pinned, non_blocking=True)

    def gpu_pp():
        bps.synchronize(bps.push_pull_async_inplace(gpu, average=False, name="bench.gpu"))

    def cpu_pp():
        bps.synchronize(bps.push_pull_async_inplace(pinned, average=False, name="bench.cpu"))

    def host_pp():
        bps.synchronize(bps.push_pull_async_inplace(host, average=False, name="bench.host"))

    for fn in (d2h, h2d, gpu_pp, cpu_pp, host_pp):  # warm-up: first-use allocations, declares
        fn()
    before = dict(_core.device.stats("cuda"))
    rows = []
    for _ in range(args.iters):
        t = {"d2h": timed(d2h), "h2d": timed(h2d), "gpu_push_pull": timed(gpu_pp),
             "cpu_push_pull": timed(cpu_pp), "host_push_pull": timed(host_pp)}
        rows.append(t)
    after = dict(_core.device.stats("cuda"))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    nbytes = n * 4
    out = {
        "job": args.job, "bytes": nbytes, "iters": args.iters, "size": bps.size(),
        "device": torch.cuda.get_device_name(dev), "median_s": med, "runs": rows,
        "pinned_d2h_GBps": nbytes / med["d2h"] / 1e9,
        "pinned_h2d_GBps": nbytes / med["h2d"] / 1e9,
        "parts_s": med["d2h"] + med["cpu_push_pull"] + med["h2d"],
        "alloc_before": before, "alloc_after": after,
    }
    out["gpu_over_parts"] = med["gpu_push_pull"] / out["parts_s"]
    added = med["gpu_push_pull"] - med["host_push_pull"]
    out["copy_added_GBps"] = 2 * nbytes / added / 1e9 if added > 0 else None
    for d in ("d2h", "h2d"):  # the copy stages on the device (copy timing; 0 when off)
        busy = after[f"{d}_busy_ns"] - before[f"{d}_busy_ns"]
        out[f"stage_{d}_GBps"] = (after[f"{d}_timed_bytes"] - before[f"{d}_timed_bytes"]) / busy \
            if busy else None
        out[f"stage_{d}_copies"] = after[f"{d}_timed"] - before[f"{d}_timed"]
    if bps.rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    bps.shutdown()


JOBS = {
    "copies": ["--workers", "1", "--servers", "1", "--env", "BYTEPS_FORCE_DISTRIBUTED=1"],
    "parts": ["--workers", "2", "--servers", "1"],
}


def _machine(gpus: int, nccl: bool) -> list:
    """Launcher options of the ``machine`` job: one process per GPU (up to 8), no servers."""
    return ["--workers", "1", "--local-size", str(min(gpus, 8)), "--env",
            f"BYTEPS_NCCL={int(nccl)}"]


def _run_job(job: str, args, trace_dir: str = "", options=None) -> dict:
    traced = ["--env", "BYTEPS_TRACE_ON=1", "--env", "BYTEPS_TRACE_START_STEP=1", "--env",
              "BYTEPS_TRACE_END_STEP=3", "--env", f"BYTEPS_TRACE_DIR={trace_dir}"]
    cmd = [sys.executable, "-m", "byteps.launch", *(options or JOBS[job]),
           *(traced if trace_dir else []),
           "--", sys.executable, "-m", "benchmarks.gpu", "--worker", "--job", job,
           "--mib", str(args.mib), "--iters", str(3 if trace_dir else args.iters)]
    env = {k: v for k, v in child_env().items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    proc = runner.run(cmd, cwd=ROOT, env=env, timeout=args.timeout, label=f"job {job}")
    m = re.search(r"RESULT (\{.*\})", proc.output)
    if proc.returncode != 0 or not m:
        sys.exit(f"job {job} failed (exit {proc.returncode}):\n{proc.output[-8000:]}")
    return json.loads(m.group(1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="tensor size in MiB (default 256)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations (default 5)")
    p.add_argument("--json", help="write every number to this file")
    p.add_argument("--timeout", type=float, default=500, help="seconds per job")
    p.add_argument("--trace", default="", help="also run the parts job traced into this "
                   "directory and draw its last traced step (DIR/step.png)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", default="parts", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    import byteps

    status = byteps.cuda_status()
    if not status["available"]:
        sys.exit(f"no GPU benchmark: CUDA off: {status['reason']}")
    results = {job: _run_job(job, args) for job in JOBS}
    c, q = results["copies"], results["parts"]
    print(f"device: {q['device']}; {q['bytes'] >> 20} MiB float32, median of {q['iters']}")
    print(f"pinned copies: D2H {c['pinned_d2h_GBps']:.1f} GB/s, H2D {c['pinned_h2d_GBps']:.1f} "
          f"GB/s")
    for d in ("d2h", "h2d"):
        if c[f"stage_{d}_GBps"]:
            print(f"byteps COPY_{d.upper()} on the device (1 process, forced distributed, "
                  f"{c[f'stage_{d}_copies']} copies): {c[f'stage_{d}_GBps']:.1f} GB/s = "
                  f"{c[f'stage_{d}_GBps'] / c[f'pinned_{d}_GBps']:.0%} of the pinned copy")
    if c["copy_added_GBps"]:
        pinned = (c["pinned_d2h_GBps"] + c["pinned_h2d_GBps"]) / 2
        print(f"time the copy stages add to the host push_pull: as if copied at "
              f"{c['copy_added_GBps']:.1f} GB/s = {c['copy_added_GBps'] / pinned:.0%} of the "
              f"pinned mean")
    m = q["median_s"]
    print(f"2 workers + 1 server: CUDA push_pull {m['gpu_push_pull'] * 1e3:.1f} ms; parts "
          f"D2H {m['d2h'] * 1e3:.1f} + CPU push_pull {m['cpu_push_pull'] * 1e3:.1f} + H2D "
          f"{m['h2d'] * 1e3:.1f} = {q['parts_s'] * 1e3:.1f} ms; ratio {q['gpu_over_parts']:.2f}")
    import torch

    gpus = torch.cuda.device_count()
    if gpus >= 2:
        for nccl in (True, False):
            results["machine_nccl" if nccl else "machine_host"] = _run_job(
                "machine", args, options=_machine(gpus, nccl))
        a, b = results["machine_nccl"], results["machine_host"]
        calls = a["alloc_after"]["collectives"] - a["alloc_before"]["collectives"]
        print(f"one machine, {a['size']} GPUs, no servers: CUDA push_pull with the NCCL stages "
              f"{a['median_s']['gpu_push_pull'] * 1e3:.1f} ms ({calls} NCCL calls), through "
              f"host memory {b['median_s']['gpu_push_pull'] * 1e3:.1f} ms")
    else:
        print(f"NCCL stages: not measured: {gpus} GPU (they need one GPU per local process; "
              f"NCCL refuses two ranks on one GPU)")
    for job, r in results.items():
        grew = {k: r["alloc_after"][k] - r["alloc_before"][k]
                for k in ("host_allocs", "streams", "events")}
        print(f"{job}: CUDA backend allocations during the timed iterations: {grew}")
    if args.trace:
        from pathlib import Path

        from benchmarks import timeline_plot

        _run_job("parts", args, trace_dir=os.path.abspath(args.trace))
        files = sorted(Path(args.trace).glob("worker*/*/comm.json"))
        results["trace"] = {"files": [str(f) for f in files]}
        try:
            drawn = timeline_plot.render(
                files, Path(args.trace) / "step.png",
                title=f"{args.mib} MiB CUDA push_pull, 2 workers + 1 server")
        except ImportError as exc:  # no matplotlib on this machine: the timelines are there
            print(f"trace: {len(files)} timelines in {args.trace}; not drawn ({exc})")
        else:
            results["trace"].update(drawn)
            print(f"trace: {len(files)} timelines in {args.trace}, step {drawn['step']} drawn "
                  f"in {args.trace}/step.png ({drawn['span_ms']:.1f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "cuda": status, "pid": os.getpid()}, f, indent=2)


if __name__ == "__main__":
    main()
