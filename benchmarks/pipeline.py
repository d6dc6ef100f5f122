"""PipeDream pipeline parallelism against data parallelism, on the emulated cluster.

A VGG-like model (:func:`benchmarks.pipeline_worker.vgg_like`: a few convolutions, then one
large fully connected layer, as VGG's) trains on n = 4 worker hosts whose links are shaped to
:data:`FULL` / :data:`QUICK`'s ``bandwidth_mbit`` (servers colocated, k = 0), so that data
parallelism, which sums every gradient (the FC layer's included) each step, is communication-
bound. Two byteps jobs (:func:`benchmarks.cluster.run_byteps_job`):

* ``pipedream``: ``byteps.torch.pipeline`` profiles the model on every host at once (they share
  the machine's cores, as the stages do in training; rank 0's profile decides), rank 0
  partitions it at the link's bandwidth, and trains with the chosen plan (1F1B, stashing);
* ``dp``: byteps ``DistributedOptimizer`` on the same number of samples per epoch.

Reported: the plan (stages, replicas), time per epoch of both, the pipeline's throughput
(minibatches/s over the epoch, and in steady state: the middle half of the last stage's
backwards) against the partitioner's prediction. Targets: the pipeline's epoch faster than data
parallelism's; the prediction within 15 % of the steady-state throughput.

The emulated hosts share this machine's cores: on a machine other jobs also load, neither the
profile nor the measurement is a real number (the report gives the load average).

Plugged into ``python -m benchmarks`` (``--only pipeline``) through ``bench_*``; alone:
``python -m benchmarks.pipeline [--quick] [--json FILE]``. Needs root and iproute2 (otherwise
skipped with the reason).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Callable, Optional, Sequence

from . import cluster as bc

log = logging.getLogger(__name__)

#: the full run: 33.6 MB FC layer (8.4 M parameters), 200 Mbit/s links
FULL = {"image": 32, "convs": [32, 64, 128], "fc": 4096, "minibatch": 32, "minibatches": 96,
        "epochs": 2, "warmup_epochs": 1, "profile_repeats": 11, "bandwidth_mbit": 200}
#: the quick run (< 2 min): 4.2 MB FC layer, 50 Mbit/s links
QUICK = {"image": 16, "convs": [16, 32], "fc": 2048, "minibatch": 16, "minibatches": 24,
         "epochs": 1, "warmup_epochs": 1, "profile_repeats": 7, "bandwidth_mbit": 50}
WORKERS = 4


def bench_settings(quick: bool, **override) -> dict:
    p = dict(QUICK if quick else FULL)
    p.update(override)
    p["quick"] = quick
    p["workers"] = WORKERS
    p["bandwidth_Bps"] = p["bandwidth_mbit"] * 1e6 / 8
    p["unavailable"] = bc.netns_unavailable()
    return p


def bench_steps(plan: dict) -> int:
    return 2


def _run(cluster, plan: dict, mode: str) -> list:
    argv = [sys.executable, "-m", "benchmarks.pipeline_worker", mode, json.dumps(plan)]
    job = bc.run_byteps_job(cluster, argv, env={"OMP_NUM_THREADS": "1"},
                            timeout=120 if plan["quick"] else 900)
    return job.worker_reports(f"pipeline benchmark ({mode})")


def _load() -> Optional[list]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def bench_run(plan: dict, progress: Callable[[str], None] = lambda label: None) -> dict:
    """Both jobs on one emulated cluster; the raw reports and the derived numbers."""
    res = {"plan": plan, "load_before": _load()}
    if plan["unavailable"]:
        return res
    with bc.EmulatedCluster(plan["workers"], 0, plan["bandwidth_mbit"] * 1e6) as cluster:
        reports = _run(cluster, plan, "pipedream")
        progress("pipedream")
        dp = _run(cluster, plan, "dp")
        progress("dp")
    res["load_after"] = _load()
    chosen = next(r["plan"] for r in reports if r["plan"])
    last = max(reports, key=lambda r: (r["stage"], -r["rank"]))
    n_ep = len(last["epochs"])
    pipe_epoch = max(sum(e["seconds"] for e in r["epochs"]) / n_ep for r in reports)
    dp_epoch = max(sum(e["seconds"] for e in r["epochs"]) / n_ep for r in dp)
    mbs = last["epochs"][0]["minibatches"]
    steady = sum(e["steady_rate"] for e in last["epochs"]) / n_ep
    # a replicated last stage: each replica sees 1/r of the minibatches
    steady *= chosen["stages"][-1]["replicas"]
    res.update({
        "chosen": {"stages": [[s["first"], s["last"], s["replicas"]] for s in chosen["stages"]],
                   "bottleneck": chosen["bottleneck"],
                   "predicted_rate": 1.0 / chosen["time_per_minibatch"],
                   "predicted_dp_rate": 1.0 / chosen["dp_time_per_minibatch"],
                   "profile": chosen["profile"]},
        "pipedream": {"epoch_s": pipe_epoch, "minibatches": mbs, "rate": mbs / pipe_epoch,
                      "steady_rate": steady},
        "dp": {"epoch_s": dp_epoch, "minibatches": dp[0]["epochs"][0]["minibatches"],
               "rate": dp[0]["epochs"][0]["minibatches"] / dp_epoch},
    })
    return res


def bench_markdown(res: dict, img_dir: Optional[str] = None, img_rel: str = "img"):
    from .report import target

    plan = res["plan"]
    md = ["## PipeDream pipeline parallelism vs data parallelism", ""]
    if plan.get("unavailable"):
        return "\n".join(md + [f"Not measured: {plan['unavailable']}."]), []
    ch, pd, dp = res["chosen"], res["pipedream"], res["dp"]
    fc_mb = (plan["fc"] * plan["convs"][-1] * (plan["image"] >> len(plan["convs"])) ** 2) * 4e-6
    stages = ", ".join(f"layers {a}-{b} x{r}" for a, b, r in ch["stages"])
    md += [f"{plan['workers']} worker hosts, {plan['bandwidth_mbit']} Mbit/s links, servers "
           f"colocated; VGG-like model (convolutions {plan['convs']} on "
           f"{plan['image']}x{plan['image']} images, a {fc_mb:.1f} MB FC layer), minibatch "
           f"{plan['minibatch']}, {pd['minibatches']} minibatches per epoch"
           f"{' (quick run)' if plan['quick'] else ''}. Load average before/after: "
           f"{res.get('load_before')} / {res.get('load_after')}.", "",
           f"Chosen plan: {stages} (bottleneck: {ch['bottleneck']}).", "",
           "| configuration | epoch (s) | minibatches/s | predicted minibatches/s |",
           "|---|---:|---:|---:|",
           f"| PipeDream (epoch) | {pd['epoch_s']:.2f} | {pd['rate']:.2f} | "
           f"{ch['predicted_rate']:.2f} |",
           f"| PipeDream (steady state) | – | {pd['steady_rate']:.2f} | "
           f"{ch['predicted_rate']:.2f} |",
           f"| data parallelism (byteps) | {dp['epoch_s']:.2f} | {dp['rate']:.2f} | "
           f"{ch['predicted_dp_rate']:.2f} |", ""]
    speedup = dp["epoch_s"] / pd["epoch_s"] if pd["epoch_s"] else 0.0
    acc = pd["steady_rate"] / ch["predicted_rate"] if ch["predicted_rate"] else 0.0
    targets = [
        target("PipeDream beats data parallelism", "epoch time ratio dp / pipeline >= 1",
               f"{dp['epoch_s']:.2f} s / {pd['epoch_s']:.2f} s", speedup, 1.0),
        target("partitioner's prediction within 15 %", "min(m/p, p/m) >= 0.85 (steady state)",
               f"{pd['steady_rate']:.2f} vs {ch['predicted_rate']:.2f} minibatches/s",
               min(acc, 1 / acc) if acc > 0 else 0.0, 0.85),
    ]
    return "\n".join(md), targets


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the < 2 min smoke run")
    p.add_argument("--json", help="write the raw results here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    plan = bench_settings(args.quick)
    res = bench_run(plan, progress=lambda label: log.info("done: %s", label))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    md, targets = bench_markdown(res)
    print(md)
    for t in targets:
        print(f"{t['name']}: {t['measured']} ratio {t['ratio']:.2f} "
              f"{'met' if t['met'] else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
