"""Scheduling on a training-shaped workload (ByteScheduler, SOSP'19), on the emulated cluster.

Every worker host runs a loop shaped like data-parallel training of VGG-16 or ResNet-50
(:mod:`benchmarks.models`: the real per-tensor gradient sizes, float32):

* **backward**: for the tensors from last to first, wait the tensor's backward compute time,
  then ``push_pull_async`` its gradient (as an optimizer's gradient hook does);
* **forward** of the next iteration: for the tensors from first to last, wait for the
  tensor's push_pull, then its forward compute time.

Compute is emulated by sleeping (a GPU's compute does not take the host's CPU); the profile
(:func:`benchmarks.models.profile`) spreads ``compute_ratio x t_opt(model bytes)`` seconds
per iteration over the layers by FLOPs, backward = 2 x forward. An iteration is measured from
the start of a backward pass to the start of the next one.

Compared, in the same cluster, one after another:

* **FIFO**: every gradient at the same priority with unlimited credit: partitions go to the
  wire in the order the gradients were produced (what upstream BytePS does by default, with
  ``BYTEPS_SCHEDULING_CREDIT=0``);
* **priority + credit**: priority = minus the tensor's forward index (the first layer, needed
  first by the next forward pass, goes first), for every (partition bytes, credit) of the
  sweep;
* **autotune**: ``BYTEPS_AUTOTUNE=1`` with neither knob set: the core tries partition sizes
  and credits during the first iterations (docs/autotune.md); the row is the iteration time
  after tuning, its chosen point and trials, and its ratio to the best swept point;
* the **ideal overlap bound** (:func:`ideal_iteration`): the same compute with a network that
  moves each worker's gradients at the physical optimum -- ``t_opt(n, k, bytes, goodput)``
  per push_pull, the measured goodput of one link as B -- preemptively, highest priority first,
  with no partition or latency cost. No schedule can beat it.

``python -m benchmarks.sched [--quick] [--models vgg16] [--sweep 262144:16 1048576:4]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from . import cluster as bc
from . import models
from .report import pyplot, run_standalone, save_figure

log = logging.getLogger(__name__)

#: Cluster of the workload: n worker hosts, k CPU-server hosts (0 = servers colocated).
N_WORKERS, K_SERVERS = 2, 0
BANDWIDTH_MBIT = 800.0
#: Compute per iteration, as a multiple of t_opt of the model's gradients (1 = the regime
#: where overlapping communication with compute matters most).
COMPUTE_RATIO = 1.0
#: (partition bytes, credit in partitions) of the full sweep.
SWEEP = ((128 << 10, 8), (256 << 10, 4), (256 << 10, 8), (512 << 10, 4), (1 << 20, 4),
         (4096000, 4))
TARGET = 1.10  # priority + credit within 10 % of the ideal overlap bound (VGG-16)
AUTOTUNE_TARGET = 1.05  # autotune within 5 % of the best swept point
#: BYTEPS_AUTOTUNE_* of the autotune row (a trial: 1 settling + STEPS timed + 1 averaging
#: iteration)
AUTOTUNE_WARMUP, AUTOTUNE_STEPS = 1, 3


# ---------------------------------------------------------------------------- ideal bound --


def ideal_iteration(layers: Sequence[models.Layer], seconds_per_byte: float) -> float:
    """Iteration time with an ideal network, seconds.

    Backward produces gradient j (last layer first) after its compute; the network serves the
    ready gradient of lowest index (highest priority) preemptively at ``seconds_per_byte``;
    forward of layer j starts once layer j-1's forward ended and j's push_pull finished. At the
    start of every backward pass nothing is in flight (the previous forward needed every
    gradient), so one iteration describes the steady state.
    """
    n = len(layers)
    ready, t = [0.0] * n, 0.0
    for j in reversed(range(n)):
        t += layers[j].bwd_s
        ready[j] = t
    bwd_end = t
    left = [lay.nbytes * seconds_per_byte for lay in layers]
    done: list[float | None] = [None] * n
    now, finished = 0.0, 0
    while finished < n:
        avail = [j for j in range(n) if done[j] is None and ready[j] <= now]
        later = [ready[j] for j in range(n) if done[j] is None and ready[j] > now]
        if not avail:
            now = min(later)
            continue
        j = avail[0]  # lowest index = highest priority
        nxt = min(later, default=math.inf)
        if now + left[j] <= nxt:
            now += left[j]
            left[j], done[j] = 0.0, now
            finished += 1
        else:
            left[j] -= nxt - now
            now = nxt
    t = bwd_end
    for j in range(n):
        t = max(t, done[j]) + layers[j].fwd_s
    return t


def sequential_iteration(layers: Sequence[models.Layer], seconds_per_byte: float) -> float:
    """No overlap at all: compute, then every gradient's push_pull at the ideal rate, s."""
    return sum(lay.fwd_s + lay.bwd_s + lay.nbytes * seconds_per_byte for lay in layers)


# --------------------------------------------------------------------------------- worker --


def _worker_main(profile_path: str, mode: str, iters: int, warmup: int) -> int:
    """One worker of the workload (run by :func:`run_workload`): prints ``RESULT {json}`` with
    the seconds of each timed iteration; exits 1 when a sum is wrong (checked after the last
    iteration, every element). Mode ``autotune``: priorities as ``priority``; first the
    iterations until the core's tuner has chosen (the same number on every worker: the choice
    is made at the same push_pull everywhere), then the warm-up and timed ones; the result
    also has the tuner's status and the tuning iterations."""
    import numpy as np

    import byteps.basics as bps

    with open(profile_path) as f:
        layers = [models.Layer(*v) for v in json.load(f)]
    bps.init()
    r, size = bps.rank(), bps.size()
    offs = [0]
    for lay in layers:
        offs.append(offs[-1] + lay.nbytes // 4)
    grad = np.full(offs[-1], np.float32(r + 1))
    out = np.empty_like(grad)
    views = [(grad[a:b], out[a:b]) for a, b in zip(offs, offs[1:])]
    want = np.float32(size * (size + 1) // 2)
    handles: list = [None] * len(layers)
    times = []

    def step() -> float:
        t0 = time.perf_counter()
        t = t0
        for j in reversed(range(len(layers))):  # backward
            t += layers[j].bwd_s
            delay = t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            g, o = views[j]
            prio = 0 if mode == "fifo" else -(j + 1)  # priority and autotune
            handles[j] = bps.push_pull_async(f"grad.{layers[j].name}", g.ctypes.data,
                                             o.ctypes.data, g.nbytes, "float32", g.shape,
                                             False, prio)
        t = None
        for j in range(len(layers)):  # forward of the next iteration
            bps.wait(handles[j])
            if t is None:
                t = time.perf_counter()
            t = max(t, time.perf_counter()) + layers[j].fwd_s
            delay = t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        return time.perf_counter() - t0

    result: dict = {"rank": r}
    if mode == "autotune":
        from byteps import _core

        tune_iters = 0
        while not _core.autotune_status()["done"] and tune_iters < 10_000:
            step()
            tune_iters += 1
        result.update(autotune=_core.autotune_status(), tune_iters=tune_iters)
    for it in range(warmup + iters):
        dt = step()
        if it >= warmup:
            times.append(dt)
    bad = np.flatnonzero(out != want)
    bps.shutdown()
    if bad.size:
        print(f"FAIL rank {r}: out[{bad[0]}]={out[bad[0]]} want {want}", flush=True)
        return 1
    result["times"] = times
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_workload(cluster: bc.EmulatedCluster, layers: Sequence[models.Layer], mode: str,
                 env: dict, iters: int, warmup: int, timeout: float) -> float:
    """Median over the timed iterations of the slowest worker's iteration time, seconds.

    Raises:
        RuntimeError: the job failed (the message carries the tail of its output).
    """
    return _median_slowest(_run_job(cluster, layers, mode, env, iters, warmup, timeout))


def autotune_env(log_path: str | None = None, steps: int = AUTOTUNE_STEPS,
                 warmup: int = AUTOTUNE_WARMUP) -> dict:
    """The environment of the autotune row: BYTEPS_AUTOTUNE=1, neither knob set."""
    env = {"BYTEPS_AUTOTUNE": "1", "BYTEPS_AUTOTUNE_WARMUP_SAMPLES": str(warmup),
           "BYTEPS_AUTOTUNE_STEPS_PER_SAMPLE": str(steps)}
    if log_path:
        env["BYTEPS_AUTOTUNE_LOG"] = log_path
    return env


def run_autotune(cluster: bc.EmulatedCluster, layers: Sequence[models.Layer], env: dict,
                 iters: int, warmup: int, timeout: float) -> dict:
    """The workload with the core's tuner (``env``: :func:`autotune_env`): ``{"time_s": median
    of the slowest worker's iterations after tuning, "autotune": rank 0's
    byteps._core.autotune_status(), "tune_iters": iterations until the choice}``.

    Raises:
        RuntimeError: the job failed, or the workers disagree on the choice.
    """
    reports = _run_job(cluster, layers, "autotune", env, iters, warmup, timeout)
    choices = {json.dumps(r["autotune"]["choice"], sort_keys=True) for r in reports}
    if len(choices) != 1 or len({r["tune_iters"] for r in reports}) != 1:
        raise RuntimeError(f"workers disagree on the autotune choice: {sorted(choices)}")
    r0 = min(reports, key=lambda r: r["rank"])
    return {"time_s": _median_slowest(reports), "autotune": r0["autotune"],
            "tune_iters": r0["tune_iters"]}


def _median_slowest(reports: list) -> float:
    return statistics.median(max(ts) for ts in zip(*(r["times"] for r in reports)))


def _run_job(cluster: bc.EmulatedCluster, layers: Sequence[models.Layer], mode: str, env: dict,
             iters: int, warmup: int, timeout: float) -> list:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([list(lay) for lay in layers], f)
    try:
        argv = [sys.executable, "-m", "benchmarks.sched", "--worker", f.name, mode,
                str(iters), str(warmup)]
        res = bc.run_byteps_job(cluster, argv, env=env, timeout=timeout)
    finally:
        os.unlink(f.name)
    return res.worker_reports("workload job")


# ------------------------------------------------------------------------------ the bench --


def core_defaults() -> tuple[int, int]:
    """(BYTEPS_PARTITION_BYTES, BYTEPS_SCHEDULING_CREDIT) defaults of the core's registry."""
    from byteps import _core

    k = {x["name"]: x["default"] for x in _core.knobs()}
    return int(k["BYTEPS_PARTITION_BYTES"]), int(k["BYTEPS_SCHEDULING_CREDIT"])


def _env(partition: int, credit: int | None) -> dict:
    """The knobs of a job; ``credit`` None: unset (the core's adaptive push window)."""
    env = {"BYTEPS_PARTITION_BYTES": str(partition)}
    if credit is not None:
        env["BYTEPS_SCHEDULING_CREDIT"] = str(credit)
    return env


def bench_settings(quick: bool, model_names: Sequence[str] | None = None,
                   sweep: Sequence[Sequence[int]] | None = None,
                   compute_ratio: float = COMPUTE_RATIO,
                   bandwidth_mbit: float | None = None, autotune: bool | None = None) -> dict:
    """The plan. Quick: ResNet-50, FIFO vs the core's defaults (the adaptive push window), 2
    iterations (about 40 s). Full: VGG-16 and ResNet-50, FIFO, the defaults, every fixed point
    of :data:`SWEEP` (the default credit's among them) and the autotune row (about 6 minutes
    plus the tuning: up to 16 trials of AUTOTUNE_STEPS + 2 iterations). ``autotune``: add the
    autotune row (default: full runs only)."""
    defaults = core_defaults()
    points = [list(p) for p in (sweep or ([] if quick else SWEEP))]
    if not quick and list(defaults) not in points:
        points.append(list(defaults))
    return {
        "quick": quick,
        "models": list(model_names or (["resnet50"] if quick else ["vgg16", "resnet50"])),
        "n": N_WORKERS, "k": K_SERVERS,
        "bandwidth_mbit": float(bandwidth_mbit or BANDWIDTH_MBIT),
        "compute_ratio": float(compute_ratio),
        "fifo_partition": defaults[0],
        "sweep": points,
        "defaults": list(defaults),
        "iters": 2 if quick else 3,
        "warmup": 1,
        "autotune": (not quick) if autotune is None else bool(autotune),
        "unavailable": bc.netns_unavailable(),
    }


def bench_steps(plan: dict) -> int:
    """Progress steps: the cluster, then one per job."""
    jobs = 2 + len(plan["sweep"]) + int(plan.get("autotune", False))
    return 1 if plan["unavailable"] else 1 + len(plan["models"]) * jobs


def bench_run(plan: dict, progress: Callable[[str], None] = lambda label: None) -> dict:
    """Measure; JSON-able results (a failed job becomes ``{"error": ...}``)."""
    res: dict = {"plan": plan, "models": {}}
    if plan["unavailable"]:
        progress("sched: skipped")
        res["skipped"] = plan["unavailable"]
        return res
    n, k, B = plan["n"], plan["k"], plan["bandwidth_mbit"] * 1e6
    t_start = time.monotonic()
    progress(f"sched n={n} k={k}: build + link")
    with bc.EmulatedCluster(n, k, B) as c:
        good = bc.table_goodput(c, 2.0)
        res["goodput_Bps"] = good
        res["network"] = c.network_info()
        for name in plan["models"]:
            total = 4 * sum(t.numel for t in models.MODELS[name]())
            comm = bc.t_opt(n, k, total, good)
            layers = models.profile(name, plan["compute_ratio"] * comm)
            spb = comm / total
            row = {"bytes": total, "tensors": len(layers), "t_comm_opt_s": comm,
                   "compute_s": sum(x.fwd_s + x.bwd_s for x in layers),
                   "ideal_s": ideal_iteration(layers, spb),
                   "sequential_s": sequential_iteration(layers, spb), "jobs": []}
            timeout = 90.0 + 6.0 * (plan["iters"] + plan["warmup"]) * (comm + row["compute_s"])
            # the core's defaults: the adaptive push window (no credit set), from the
            # default credit; then the fixed points of the sweep
            jobs = [("fifo", plan["fifo_partition"], 0),
                    ("adaptive", plan["defaults"][0], plan["defaults"][1])] + \
                [("priority", p, cr) for p, cr in plan["sweep"]]
            for mode, part, credit in jobs:
                progress(f"sched {name}: {mode} partition {part} credit {credit}")
                job = {"mode": mode, "partition": part, "credit": credit}
                try:
                    env = _env(part, None if mode == "adaptive" else credit)
                    job["time_s"] = run_workload(c, layers, "priority" if mode == "adaptive"
                                                 else mode, env, plan["iters"], plan["warmup"],
                                                 timeout)
                except RuntimeError as exc:
                    log.warning("%s %s failed: %s", name, job, exc)
                    job["error"] = str(exc).splitlines()[0]
                log.info("%s: %s (ideal %.3f s)", name, job, row["ideal_s"])
                row["jobs"].append(job)
            if plan.get("autotune"):
                progress(f"sched {name}: autotune")
                row["jobs"].append(_autotune_job(c, layers, plan, timeout))
                log.info("%s: %s", name, row["jobs"][-1])
            res["models"][name] = row
    res["elapsed_s"] = time.monotonic() - t_start
    return res


def _autotune_job(c: bc.EmulatedCluster, layers, plan: dict, timeout: float) -> dict:
    job: dict = {"mode": "autotune"}
    per_iter = timeout / 6.0 / (plan["iters"] + plan["warmup"])
    tune_max = AUTOTUNE_WARMUP + 2 + 16 * (AUTOTUNE_STEPS + 2)
    try:
        a = run_autotune(c, layers, autotune_env(), plan["iters"], plan["warmup"],
                         timeout + 3.0 * tune_max * per_iter)
        ch = a["autotune"]["choice"] or {}
        job.update(time_s=a["time_s"], partition=ch.get("partition_bytes"),
                   credit=ch.get("credit"), trials=a["autotune"]["trials"],
                   tune_iters=a["tune_iters"], error_tuning=a["autotune"]["error"])
    except RuntimeError as exc:
        log.warning("autotune failed: %s", exc)
        job["error"] = str(exc).splitlines()[0]
    return job


# ---------------------------------------------------------------------------------- report --


def _best(row: dict) -> dict | None:
    ok = [j for j in row["jobs"] if j["mode"] == "priority" and "time_s" in j]
    return min(ok, key=lambda j: j["time_s"]) if ok else None


def _default_job(row: dict, plan: dict) -> dict | None:
    """The core's defaults: the adaptive window's job (the fixed default credit's in runs
    from before it)."""
    for mode in ("adaptive", "priority"):
        for j in row["jobs"]:
            if j["mode"] == mode and [j["partition"], j["credit"]] == plan["defaults"]:
                return j
    return None


def sched_targets(res: dict) -> list[dict]:
    from .report import target

    out = []
    plan = res["plan"]
    for name, row in res.get("models", {}).items():
        for label, job in (("defaults", _default_job(row, plan)), ("best of sweep", _best(row))):
            if job is None or "time_s" not in job:
                continue
            ratio = row["ideal_s"] / job["time_s"]
            out.append(target(
                f"scheduling {name}: priority + credit within 10 % of the ideal overlap bound "
                f"({label}: {job['partition']} B, "
                + (f"adaptive window from credit {job['credit']})" if job["mode"] == "adaptive"
                   else f"credit {job['credit']})")
                + ("" if name == "vgg16" else " (info)"),
                "ideal / measured ≥ 0.909",
                f"{job['time_s']:.3f} s vs ideal {row['ideal_s']:.3f} s",
                ratio, 1 / TARGET if name == "vgg16" else None))
        auto = next((j for j in row["jobs"] if j["mode"] == "autotune" and "time_s" in j), None)
        best = _best(row)
        if auto and best:
            out.append(target(
                f"scheduling {name}: autotune within 5 % of the best swept point "
                f"(chose {auto['partition']} B, credit {auto['credit']})",
                "best swept / autotune ≥ 0.952",
                f"{auto['time_s']:.3f} s vs {best['time_s']:.3f} s "
                f"({best['partition']} B, credit {best['credit']})",
                best["time_s"] / auto["time_s"], 1 / AUTOTUNE_TARGET))
        fifo = next((j for j in row["jobs"] if j["mode"] == "fifo" and "time_s" in j), None)
        dj = _default_job(row, plan)
        if fifo and dj and "time_s" in dj:
            out.append(target(f"scheduling {name}: FIFO / priority + credit (defaults; info)",
                              "speed-up of scheduling",
                              f"FIFO {fifo['time_s']:.3f} s vs {dj['time_s']:.3f} s",
                              fifo["time_s"] / dj["time_s"], None))
    return out


def bench_markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    """The section (Markdown) and its targets."""
    from .report import _have_matplotlib, _table, fmt_size, network_sentence

    plan = res["plan"]
    md = ["## Scheduling: a training-shaped workload on the emulated cluster", ""]
    if res.get("skipped"):
        md.append(f"Not measured: {res['skipped']}.")
        return "\n".join(md), []
    md.append(
        f"n = {plan['n']} worker hosts, k = {plan['k']} (a server colocated on every worker "
        f"host), links shaped to {plan['bandwidth_mbit']:g} Mbit/s (measured goodput "
        f"{res['goodput_Bps'] * 8 / 1e6:.0f} Mbit/s); {network_sentence([res.get('network')])}"
        ". Each worker runs the gradient tensors of "
        "the model (real sizes from the published architecture, float32) through a "
        "training-shaped loop: backward from the last tensor to the first, `push_pull_async` "
        "as each gradient is produced, then the next forward pass waits for each tensor's "
        "push_pull before its layer's compute. Compute is emulated by sleeping (as a GPU "
        f"would not use the host CPU): {plan['compute_ratio']:g} × t_opt of the model's "
        "gradients per iteration, spread over the layers by FLOPs, backward = 2 × forward. "
        "**FIFO** = one priority for all, unlimited credit (gradients go out in the order "
        "they are produced); **priority + credit** = priority by forward index (first layer "
        "first) with the credit (in partitions) of the row. **Ideal** = the same compute with "
        "a network that carries every gradient at the physical optimum t_opt (measured "
        "goodput), preemptively in priority order, with no partition or latency cost "
        "(`benchmarks.sched.ideal_iteration`); **sequential** = no overlap at all. "
        f"Iteration time: median of {plan['iters']} (after {plan['warmup']} warm-up) of the "
        f"slowest worker. Core defaults: partition {plan['defaults'][0]} B, credit "
        f"{plan['defaults'][1]}.")
    md.append("")
    for name, row in res["models"].items():
        md += [f"### {name}: {fmt_size(row['bytes'])} of gradients in {row['tensors']} "
               f"tensors; compute {row['compute_s']:.2f} s, t_opt of the gradients "
               f"{row['t_comm_opt_s']:.2f} s per iteration", ""]
        body = [["ideal overlap bound", "", "", f"{row['ideal_s']:.3f}", "1.00"],
                ["sequential (no overlap)", "", "", f"{row['sequential_s']:.3f}",
                 f"{row['sequential_s'] / row['ideal_s']:.2f}"]]
        for j in row["jobs"]:
            t = j.get("time_s", math.nan)
            if j["mode"] == "autotune" and "partition" not in j:
                body.append(["autotune", "", "", "failed", ""])
                continue
            body.append([{"fifo": "FIFO", "autotune": "autotune (chosen)",
                          "adaptive": "priority + adaptive window (default)"}.get(
                             j["mode"], "priority + credit"),
                         str(j["partition"]),
                         f"from {j['credit']}" if j["mode"] == "adaptive" else
                         "∞" if j["credit"] == 0 else str(j["credit"]),
                         "failed" if not math.isfinite(t) else f"{t:.3f}",
                         "" if not math.isfinite(t) else f"{t / row['ideal_s']:.2f}"])
        md += [_table(["schedule", "partition (B)", "credit", "iteration (s)", "/ ideal"],
                      body, "lrrrr"), ""]
        md += _autotune_markdown(row)
    if img_dir is not None and _have_matplotlib() and res["models"]:
        md += [f"![iteration time / ideal]({img_rel}/{plot_sched(res, img_dir)})", ""]
    if res.get("elapsed_s"):
        md += [f"This section took {res['elapsed_s']:.0f} s.", ""]
    return "\n".join(md), sched_targets(res)


def _autotune_markdown(row: dict) -> list:
    """The autotune row's trials and its ratio to the best swept point (Markdown lines)."""
    auto = next((j for j in row["jobs"] if j["mode"] == "autotune"), None)
    if auto is None:
        return []
    if "time_s" not in auto:
        return [f"Autotune failed: {auto.get('error', 'no result')}.", ""]
    best = _best(row)
    trials = ", ".join(f"{t['partition_bytes'] >> 10} KiB/{t['credit']}: "
                       f"{t['iteration_s']:.3f} s" for t in auto["trials"])
    ratio = (f"; after tuning {auto['time_s']:.3f} s = {auto['time_s'] / best['time_s']:.3f} × "
             f"the best swept point ({best['partition']} B, credit {best['credit']}: "
             f"{best['time_s']:.3f} s)" if best else "")
    return [f"**Autotune** (`BYTEPS_AUTOTUNE=1`, steps per trial {AUTOTUNE_STEPS}): chose "
            f"{auto['partition']} B, credit {auto['credit']} after {len(auto['trials'])} trials "
            f"in {auto['tune_iters']} iterations{ratio}. Trials (partition/credit: median "
            f"iteration averaged over the workers): {trials}.", ""]


def plot_sched(res: dict, img_dir: str) -> str:
    """Bars of iteration time / ideal per schedule, one panel per model; PNG file name."""
    plt = pyplot(img_dir)
    names = list(res["models"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), dpi=110,
                             squeeze=False)
    for ax, name in zip(axes[0], names):
        row = res["models"][name]
        labels, ys, colors = [], [], []
        for j in row["jobs"]:
            if "partition" not in j:
                continue
            labels.append("FIFO" if j["mode"] == "fifo" else
                          ("autotune\n" if j["mode"] == "autotune" else "") +
                          f"{j['partition'] >> 10} KiB\ncredit {j['credit']}")
            ys.append(j.get("time_s", 0.0) / row["ideal_s"])
            colors.append({"fifo": "tab:grey", "autotune": "tab:green"}.get(j["mode"],
                                                                            "tab:blue"))
        ax.bar(range(len(ys)), ys, color=colors)
        ax.axhline(1.0, color="black", lw=1, label="ideal overlap bound")
        ax.axhline(TARGET, color="red", ls=":", lw=1, label="target 1.10")
        ax.axhline(row["sequential_s"] / row["ideal_s"], color="grey", ls="--", lw=1,
                   label="no overlap")
        ax.set_xticks(range(len(ys)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(name)
        ax.set_ylabel("iteration time / ideal")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, img_dir, "sched_iteration.png")


# ------------------------------------------------------------------------------------ main --


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.sched``: measure and print the section."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sched", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="ResNet-50, FIFO vs defaults")
    p.add_argument("--models", nargs="+", choices=sorted(models.MODELS))
    p.add_argument("--sweep", nargs="+", metavar="PARTITION:CREDIT")
    p.add_argument("--compute-ratio", type=float, default=COMPUTE_RATIO,
                   help="compute per iteration / t_opt of the gradients")
    p.add_argument("--bandwidth", type=float, help=f"Mbit/s (default {BANDWIDTH_MBIT:g})")
    p.add_argument("--autotune", action=argparse.BooleanOptionalAction, default=None,
                   help="add the BYTEPS_AUTOTUNE=1 row (default: full runs only)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        path, mode, iters, warmup = args.worker
        return _worker_main(path, mode, int(iters), int(warmup))
    sweep = [tuple(int(v) for v in s.split(":")) for s in args.sweep] if args.sweep else None
    plan = bench_settings(args.quick, args.models, sweep, args.compute_ratio, args.bandwidth,
                          args.autotune)
    return run_standalone(plan, bench_run, bench_markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
