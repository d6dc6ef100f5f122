"""What the timeline costs: push_pull throughput with BYTEPS_TRACE_ON=0 vs 1 (docs/timeline.md).

``python -m benchmarks.trace_overhead [--workers 2] [--servers 1] [--repeats 5] [--steps 30]``
launches, ``--repeats`` times per configuration (interleaved), a local job (bpslaunch) whose
workers push_pull many tensors per step: ``--small`` tensors of 4 KiB to 64 KiB and
``--large`` of 4 MiB. Every measured step is inside the trace window, so the "trace on" runs
record every event. Throughput = bytes push_pulled per step / wall time per step (rank 0,
after ``--warmup`` steps, from its fastest step: on a shared host the fastest step is the one
least disturbed by other load); the best run of each configuration is reported (and the best
median step), and the overhead as the relative drop of the best throughput; the typical step
(the median over the runs of each run's median step) and its overhead are reported too: the
fastest step is the less disturbed one, the typical step the one with more samples behind it. Configurations: telemetry and trace off,
telemetry on (the default), telemetry and trace on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import runner

CONFIGS = {
    "telemetry off, trace off": {"BYTEPS_TELEMETRY_ON": "0", "BYTEPS_TRACE_ON": "0"},
    "telemetry on, trace off": {"BYTEPS_TELEMETRY_ON": "1", "BYTEPS_TRACE_ON": "0"},
    "telemetry on, trace on": {"BYTEPS_TELEMETRY_ON": "1", "BYTEPS_TRACE_ON": "1"},
}


def worker(args) -> None:
    """One worker process of the job: prints ``RESULT <json>`` on rank 0."""
    import numpy as np

    import byteps.basics as bps

    bps.init()
    sizes = [1024 * (1 << (i % 5)) for i in range(args.small)] + [1 << 20] * args.large
    bufs = [(np.ones(n, np.float32), np.empty(n, np.float32)) for n in sizes]
    names = [f"t{i}" for i in range(len(sizes))]
    step_bytes = sum(4 * n for n in sizes)

    def step():
        hs = [bps.push_pull_async(nm, x.ctypes.data, y.ctypes.data, x.nbytes, "float32",
                                  x.shape, False) for nm, (x, y) in zip(names, bufs)]
        for h in hs:
            bps.wait(h)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if bps.rank() == 0:
        best = min(times)
        median = sorted(times)[len(times) // 2]
        print("RESULT " + json.dumps({"step_ms": best * 1e3, "median_step_ms": median * 1e3,
                                      "MB_per_s": step_bytes / best / 1e6,
                                      "step_bytes": step_bytes, "tensors": len(sizes)}),
              flush=True)
    bps.shutdown()


def run_once(args, env_extra: dict, trace_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    env.update(env_extra)
    env.update({"BYTEPS_TRACE_START_STEP": str(args.warmup),
                "BYTEPS_TRACE_END_STEP": str(args.warmup + args.steps),
                "BYTEPS_TRACE_DIR": trace_dir, "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-m", "byteps.launch", "--workers", str(args.workers), "--servers",
           str(args.servers), "--", sys.executable, "-m", "benchmarks.trace_overhead",
           "--worker", "--small", str(args.small), "--large", str(args.large), "--steps",
           str(args.steps), "--warmup", str(args.warmup)]
    r = runner.run(cmd, env=env, timeout=600, cwd=Path(__file__).resolve().parents[1])
    for line in r.output.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"job failed (rc {r.returncode}):\n{r.output[-6000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trace_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--small", type=int, default=64, help="tensors of 4-64 KiB")
    p.add_argument("--large", type=int, default=4, help="tensors of 4 MiB")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    runs = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, env in CONFIGS.items():
                res = run_once(args, env, os.path.join(tmp, f"{rep}"))
                runs[name].append(res)
                print(f"run {rep} {name}: {res['MB_per_s']:.1f} MB/s, "
                      f"fastest step {res['step_ms']:.2f} ms, median "
                      f"{res['median_step_ms']:.2f} ms", flush=True)
    base = max(r["MB_per_s"] for r in runs["telemetry off, trace off"])
    print(f"\n{args.workers} workers + {args.servers} server(s), {args.small} small + "
          f"{args.large} large tensors per step, best of {args.repeats}:")
    table = {}
    typical_base = statistics.median(r["median_step_ms"] for r in runs["telemetry off, trace off"])
    for name, rs in runs.items():
        best = max(r["MB_per_s"] for r in rs)
        typical = statistics.median(r["median_step_ms"] for r in rs)
        table[name] = {"best_MB_per_s": best, "best_step_ms": min(r["step_ms"] for r in rs),
                       "best_median_step_ms": min(r["median_step_ms"] for r in rs),
                       "overhead_pct": (base - best) / base * 100,
                       "typical_step_ms": typical,
                       "typical_overhead_pct": (typical / typical_base - 1) * 100}
        print(f"| {name} | {best:.1f} MB/s | {table[name]['best_step_ms']:.2f} ms | "
              f"{table[name]['best_median_step_ms']:.2f} ms | "
              f"{table[name]['overhead_pct']:+.1f} % | {typical:.2f} ms | "
              f"{table[name]['typical_overhead_pct']:+.1f} % |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs,
                                               "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
