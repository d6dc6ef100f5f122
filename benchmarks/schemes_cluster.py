"""The synchronisation schemes on the emulated cluster, ``BYTEPS_SYNC=auto`` checked against them.

For n worker hosts and each k of the plan (0: a server colocated on every worker host, the
usual BytePS deployment; k > 0: k CPU-server hosts and none on the workers), one byteps job per
scheme the job can run (``ps``, ``ring``, ``tree``, ``hips`` where its ⌈n/g⌉ + 1 servers
exist) and one with ``auto`` (the α-β-γ cost model's choice per tensor, docs/schemes.md). Each
job measures, after a warm-up:

* the push_pull of one float32 tensor of each size of the plan (4 KiB, 256 KiB, 4 MiB,
  64 MiB): the median over the timed iterations of the slowest worker's time, every iteration
  started together after a barrier and its sum checked exactly;
* a mixed-size model profile: ResNet-50's gradient tensors (:mod:`byteps.sim.models`, the real
  per-layer sizes) all push_pulled per iteration in backward order, priority = minus the
  forward index, no compute: the iteration time.

Beside every measured time: the what-if simulator's (:mod:`byteps.sim`, docs/simulator.md)
for the same configuration, driven with the goodput of one link measured in the same cluster
(as ``benchmarks/sim_validate.py`` does), and the ratio. The ``auto`` job's workers report the
cost model's parameters (α, β, γ, k and where it came from) and their choice per size.

Targets: ``auto`` ≤ 1.05 × the best fixed scheme at every size and k; on the profile ``auto`` ≤
every fixed scheme (ratio best / auto ≥ 1.0, or within the runs' scatter where ``auto`` runs
the best scheme itself).

``python -m benchmarks`` plugin ``schemes`` (``--only schemes``); alone:
``python -m benchmarks.schemes_cluster [--quick] [--json FILE]`` (quick: n = 2, k = 0, two
sizes, ps / ring / auto and the first 4 MiB of the profile: the CI smoke run). Needs root and
iproute2 (the emulated cluster, :mod:`benchmarks.netns`).
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

log = logging.getLogger(__name__)

#: tensor sizes of the full plan (bytes, float32)
SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)
#: timed iterations per size (the median counts), after WARMUP untimed ones
ITERS = {4 << 10: 51, 256 << 10: 21, 4 << 20: 7, 64 << 20: 5}
WARMUP = 2
#: rounds of the full plan: every scheme's job once per round, in turn (the median pools every
#: round's iterations: a load burst from another process hits one round of one scheme)
ROUNDS = 2
#: sizes up to this many bytes get SMALL_ROUNDS more rounds of jobs that time only them (no
#: profile): at 4 KiB a job's median moves 20-40 % from one job to the next on a shared
#: 2-core host (which process waits for a core), as much as the schemes differ, so one
#: scheme's two jobs against another's said more about the jobs than about the schemes
SMALL_MAX_BYTES = 256 << 10
SMALL_ROUNDS = 4
#: per-link bandwidth (Mbit/s): the architecture table's (benchmarks/table1.py)
BANDWIDTH_MBIT = 800.0
FIXED = ("ps", "ring", "tree", "hips")
#: the profile's model and, in the quick plan, its first bytes only
PROFILE_MODEL = "resnet50"
QUICK_PROFILE_BYTES = 4 << 20
#: auto against the best fixed scheme: at most this much slower per size
SIZE_TOLERANCE = 1.05


def hips_group(n: int) -> int:
    """The core's default HiPS group (``BYTEPS_HIPS_GROUP=0``): ceil(sqrt(n))."""
    return max(1, math.ceil(math.sqrt(n)))


def schemes_for(n: int, servers: int) -> list:
    """The fixed schemes a job of ``n`` worker hosts and ``servers`` servers can run."""
    out = ["ps", "ring", "tree"] if n > 1 else ["ps"]
    if n > 1 and servers >= math.ceil(n / hips_group(n)) + 1:
        out.append("hips")
    return out


def job_servers(n: int, k: int) -> int:
    """Servers of a job on an (n, k) cluster (``bc.run_byteps_job``: one per worker host when
    k < n, else the k CPU-server hosts only)."""
    return k + (n if k < n else 0)


def profile_tensors(quick: bool) -> list:
    """[(name, bytes)] of the profile in forward order (quick: the first
    :data:`QUICK_PROFILE_BYTES` only)."""
    from .models import MODELS

    out, total = [], 0
    for t in MODELS[PROFILE_MODEL]():
        nb = 4 * t.numel
        if quick and out and total + nb > QUICK_PROFILE_BYTES:
            break
        out.append((t.name, nb))
        total += nb
    return out


def bench_settings(quick: bool, n: int | None = None, ks: Sequence[int] | None = None,
                   sizes: Sequence[int] | None = None,
                   schemes: Sequence[str] | None = None) -> dict:
    """The plan. Full: n = 4, k = 0 and 4, :data:`SIZES`, every scheme the job can run and
    ``auto``, the whole ResNet-50 profile (about 10 minutes on 2 cores). Quick: n = 2, k = 0,
    4 KiB and 256 KiB, ps, ring and auto, the profile's first 4 MiB (about a minute)."""
    sizes = [int(s) for s in (sizes or ((4 << 10, 256 << 10) if quick else SIZES))]
    return {
        "quick": quick,
        "n": int(n or (2 if quick else 4)),
        "ks": [int(k) for k in (ks if ks is not None else ([0] if quick else [0, 4]))],
        "sizes": sizes,
        "iters": {str(s): (5 if quick else ITERS.get(s, 5)) for s in sizes},
        "warmup": 1 if quick else WARMUP,
        "rounds": 1 if quick else ROUNDS,
        "small_rounds": 0 if quick else SMALL_ROUNDS,
        "small_max_bytes": SMALL_MAX_BYTES,
        "schemes": list(schemes or (("ps", "ring") if quick else FIXED)),
        "profile": {"model": PROFILE_MODEL, "tensors": profile_tensors(quick),
                    "iters": 3 if quick else 5, "warmup": 1 if quick else 2},
        "bandwidth_mbit": BANDWIDTH_MBIT,
        "link_seconds": 1.0 if quick else 2.0,
        "unavailable": bc.netns_unavailable(),
    }


def plan_jobs(plan: dict, k: int) -> list:
    """The ``BYTEPS_SYNC`` of each job at ``k``: the plan's fixed schemes the job can run,
    then ``auto``."""
    ok = schemes_for(plan["n"], job_servers(plan["n"], k))
    return [s for s in plan["schemes"] if s in ok] + ["auto"]


def bench_steps(plan: dict) -> int:
    """Progress steps: per k, one for the cluster (build + link) and one per job and round
    (the small sizes' rounds included)."""
    if plan["unavailable"]:
        return 1
    return sum(1 + sum(round_counts(plan)) * len(plan_jobs(plan, k)) for k in plan["ks"])


def small_sizes(plan: dict) -> list:
    """The plan's sizes that the small rounds time again (``small_max_bytes`` or less)."""
    return [s for s in plan["sizes"] if s <= plan.get("small_max_bytes", 0)]


def round_counts(plan: dict) -> tuple:
    """(full rounds, small rounds) of the plan: the small ones only where it has small sizes."""
    return plan.get("rounds", 1), plan.get("small_rounds", 0) if small_sizes(plan) else 0


# --------------------------------------------------------------------------------- worker --


def _worker_main(spec_path: str) -> int:
    """One worker of a job (``BYTEPS_SYNC`` from the environment): the sizes, then the
    profile; prints ``RESULT {json}``: ``times`` {size: [seconds per timed iteration]},
    ``profile`` [seconds per timed iteration] and, under ``auto``, ``model``
    (``CostModel.as_dict()``), ``choices`` {size: scheme} and ``profile_choices``
    {scheme: tensors}. Exits 1 on a wrong sum."""
    import numpy as np

    import byteps
    import byteps.basics as bps

    with open(spec_path) as f:
        spec = json.load(f)
    bps.init()
    r, size = bps.rank(), bps.size()
    sync = os.environ.get("BYTEPS_SYNC", "ps")
    out: dict = {"rank": r, "size": size, "sync": sync, "times": {}, "profile": []}
    tensors = [(name, int(nb)) for name, nb in spec["profile"]["tensors"]]
    if sync == "auto":
        model = byteps.cost_model()  # collective: every rank here, before any push_pull
        out["model"] = model.as_dict()
        out["choices"] = {str(s): model.choose(int(s)) for s in spec["sizes"]}
        counts: dict = {}
        for _, nb in tensors:
            c = model.choose(nb)
            counts[c] = counts.get(c, 0) + 1
        out["profile_choices"] = counts
        print(model.describe(), flush=True)
    token = np.zeros(1, np.float32)

    def barrier() -> None:
        bps.wait(bps.push_pull_async("schemes.barrier", token.ctypes.data, token.ctypes.data,
                                     token.nbytes, "float32", token.shape, False))

    want_of = float(size * (size + 1) // 2)  # rank r sends r + 1 everywhere
    for s in spec["sizes"]:
        x = np.full(max(int(s) // 4, 1), r + 1, np.float32)
        y = np.empty_like(x)
        times = []
        for it in range(spec["warmup"] + spec["iters"][str(s)]):
            barrier()
            t0 = time.perf_counter()
            bps.wait(bps.push_pull_async(f"schemes.t{s}", x.ctypes.data, y.ctypes.data,
                                         x.nbytes, "float32", x.shape, False))
            dt = time.perf_counter() - t0
            if y[0] != want_of or y[-1] != want_of or (it == 0 and not (y == want_of).all()):
                print(f"FAIL rank {r}: {s} B sum {y[0]} / {y[-1]}, want {want_of}", flush=True)
                return 1
            if it >= spec["warmup"]:
                times.append(dt)
        out["times"][str(s)] = times
    bufs = [np.full(max(nb // 4, 1), r + 1, np.float32) for _, nb in tensors]
    p = spec["profile"]
    for it in range(p["warmup"] + p["iters"] if tensors else 0):
        barrier()
        t0 = time.perf_counter()
        handles = [bps.push_pull_async(f"schemes.p.{tensors[j][0]}", bufs[j].ctypes.data,
                                       bufs[j].ctypes.data, bufs[j].nbytes, "float32",
                                       bufs[j].shape, False, -j)
                   for j in reversed(range(len(tensors)))]
        for h in handles:
            bps.wait(h)
        dt = time.perf_counter() - t0
        if bufs[0][0] != want_of or bufs[-1][-1] != want_of:
            print(f"FAIL rank {r}: profile sum {bufs[0][0]} / {bufs[-1][-1]}, want {want_of}",
                  flush=True)
            return 1
        for b in bufs:  # in place: the sum of the ranks' sums so far; refill for the next one
            b.fill(r + 1)
        if it >= p["warmup"]:
            out["profile"].append(dt)
    bps.shutdown()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# --------------------------------------------------------------------------------- driver --


def _slowest(reports: list, pick: Callable[[dict], list]) -> list:
    """Per timed iteration, the slowest worker's seconds."""
    return [max(ts) for ts in zip(*(pick(r) for r in reports))]


def _stats(times: list) -> dict:
    """Median, extremes and ``scatter``: the interquartile range over the median (0 with fewer
    than 2 times)."""
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [med, med, med]
    return {"time_s": med, "min_s": min(times), "max_s": max(times), "iters": len(times),
            "scatter": (q[2] - q[0]) / med if med > 0 else 0.0}


def _timeout(plan: dict, goodput: float) -> float:
    n = plan["n"]
    per_byte = 2.0 * (n - 1) / n / goodput
    t = sum((plan["warmup"] + plan["iters"][str(s)] + 1) * max(s * per_byte, 0.02)
            for s in plan["sizes"])
    nb = sum(b for _, b in plan["profile"]["tensors"])
    t += (plan["profile"]["warmup"] + plan["profile"]["iters"]) * max(nb * per_byte, 0.05)
    return 120.0 + 6.0 * t


def run_job(c: bc.EmulatedCluster, plan: dict, sync: str, goodput: float,
            small: bool = False) -> dict:
    """One job: ``BYTEPS_SYNC=sync`` on cluster ``c``; ``raw``: per size and for the profile,
    the slowest worker's seconds of each timed iteration; under ``auto`` rank 0's model and
    choices. ``small``: only :func:`small_sizes`, no profile.

    Raises:
        RuntimeError: the job failed.
    """
    spec = {k: plan[k] for k in ("sizes", "iters", "warmup", "profile")}
    if small:
        spec["sizes"] = small_sizes(plan)
        spec["profile"] = dict(plan["profile"], tensors=[])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        argv = [sys.executable, "-m", "benchmarks.schemes_cluster", "--worker", f.name]
        res = bc.run_byteps_job(c, argv, env={"BYTEPS_SYNC": sync},
                                timeout=_timeout(plan, goodput))
        reports = res.worker_reports(f"schemes job BYTEPS_SYNC={sync}")
    finally:
        os.unlink(f.name)
    job = {"raw": {"sizes": {s: _slowest(reports, lambda r, s=s: r["times"][s])
                             for s in reports[0]["times"]},
                   "profile": _slowest(reports, lambda r: r["profile"])}}
    if sync == "auto":
        r0 = min(reports, key=lambda r: r["rank"])
        job["model"] = r0["model"]
        job["choices"] = r0["choices"]
        job["profile_choices"] = r0["profile_choices"]
        job["same_on_every_rank"] = all(r["model"]["intervals"] == r0["model"]["intervals"]
                                        for r in reports)
    return job


def _pool(jobs: list) -> dict:
    """One scheme's rounds as one job: every timed iteration of every round that did not fail
    and timed it (their median, :func:`_stats`; ``rounds`` per size and for the profile);
    ``auto``: the first round's model and choices, and ``choices_rounds`` (each round's,
    re-measured at each start)."""
    ok = [j for j in jobs if "error" not in j]
    full = [j for j in ok if j["raw"]["profile"]]
    if not full:
        return {"error": next((j["error"] for j in jobs if "error" in j), "no full round"),
                "rounds": len(jobs)}
    sizes = {s: [j for j in ok if s in j["raw"]["sizes"]] for s in full[0]["raw"]["sizes"]}
    out = {"rounds": len(ok), "failed_rounds": len(jobs) - len(ok),
           "wall_s": sum(j["wall_s"] for j in jobs),
           "sizes": {s: dict(_stats([t for j in js for t in j["raw"]["sizes"][s]]),
                             rounds=len(js)) for s, js in sizes.items()},
           "profile": dict(_stats([t for j in full for t in j["raw"]["profile"]]),
                           rounds=len(full))}
    if "model" in ok[0]:
        for key in ("model", "choices", "profile_choices"):
            out[key] = full[0][key]
        out["same_on_every_rank"] = all(j["same_on_every_rank"] for j in ok)
        out["choices_rounds"] = [j["choices"] for j in ok]
        out["profile_choices_rounds"] = [j["profile_choices"] for j in full]
        out["models"] = [{x: j["model"].get(x) for x in ("alpha", "beta", "gamma", "latency",
                                                          "intervals")} for j in ok]
    return out


def simulated(plan: dict, k: int, scheme: str, goodput: float, nbytes: int | None) -> float:
    """The simulator's seconds for one push_pull of ``nbytes`` (None: one iteration of the
    profile) with ``scheme`` on the (n, k) cluster at ``goodput`` bytes/s
    (:func:`benchmarks.sim_compare.schemes_row`: each tensor its own all-reduce, byteps does not
    bucket)."""
    from byteps.sim.profiles import Layer, Profile
    from byteps.sim.simulate import single_tensor

    from .sim_compare import schemes_row

    if nbytes is None:
        prof = Profile(plan["profile"]["model"],
                       [Layer(name, int(nb)) for name, nb in plan["profile"]["tensors"]])
    else:
        prof = single_tensor(int(nbytes))
    return schemes_row(plan["n"], k, scheme, goodput, prof)


def _simulate_rows(plan: dict, k: int, row: dict) -> None:
    """Adds ``sim_s`` beside every measured time of ``row`` (auto: the simulator's time of the
    scheme it chose; for a profile that mixes schemes, none: the simulator runs one scheme per
    job)."""
    good = row["goodput_Bps"]
    for sync, job in row["jobs"].items():
        if "error" in job:
            continue
        for s, st in job["sizes"].items():
            scheme = job["choices"][s] if sync == "auto" else sync
            st["sim_s"] = simulated(plan, k, scheme, good, int(s))
        if sync == "auto":
            mix = job["profile_choices"]
            scheme = next(iter(mix)) if len(mix) == 1 else None
        else:
            scheme = sync
        job["profile"]["sim_s"] = simulated(plan, k, scheme, good, None) if scheme else None


def bench_run(plan: dict, progress: Callable[[str], None] = lambda label: None) -> dict:
    """Measure every job of the plan, then simulate it; JSON-able (a failed job becomes
    ``{"error": ...}``)."""
    res: dict = {"plan": plan, "cores": os.cpu_count(), "rows": []}
    if plan["unavailable"]:
        progress("schemes: skipped")
        res["skipped"] = plan["unavailable"]
        return res
    t_start = time.monotonic()
    n, B = plan["n"], plan["bandwidth_mbit"] * 1e6
    for k in plan["ks"]:
        progress(f"schemes n={n} k={k}: build + link")
        row: dict = {"n": n, "k": k, "servers": job_servers(n, k), "jobs": {}}
        with bc.EmulatedCluster(n, k, B) as c:
            row["goodput_Bps"] = good = bc.table_goodput(c, plan["link_seconds"])
            row["network"] = c.network_info()
            runs: dict = {sync: [] for sync in plan_jobs(plan, k)}
            full, small = round_counts(plan)
            for rnd in range(full + small):  # the schemes in turn, round by round
                for sync in runs:
                    what = "round" if rnd < full else "small sizes, round"
                    progress(f"schemes n={n} k={k}: BYTEPS_SYNC={sync} ({what} {rnd + 1})")
                    t0 = time.monotonic()
                    try:
                        runs[sync].append(run_job(c, plan, sync, good, small=rnd >= full))
                    except RuntimeError as exc:
                        log.warning("schemes n=%d k=%d %s failed: %s", n, k, sync, exc)
                        runs[sync].append({"error": str(exc).splitlines()[0]})
                    runs[sync][-1]["wall_s"] = time.monotonic() - t0
                    log.info("n=%d k=%d %s: %s", n, k, sync,
                             {x: y for x, y in runs[sync][-1].items() if x != "raw"})
            row["jobs"] = {sync: _pool(jobs) for sync, jobs in runs.items()}
        row["t_opt_s"] = {str(s): bc.t_opt(n, k, s, good) for s in plan["sizes"]}
        _simulate_rows(plan, k, row)
        res["rows"].append(row)
    res["elapsed_s"] = time.monotonic() - t_start
    return res


def bench_markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    """(Markdown section, targets): :mod:`benchmarks.schemes_cluster_report`."""
    from .schemes_cluster_report import markdown

    return markdown(res)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.schemes_cluster",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the CI smoke plan")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker_main(a.worker)
    from .report import run_standalone

    bc.install_signal_cleanup()
    return run_standalone(bench_settings(a.quick), bench_run, bench_markdown, a.json)


if __name__ == "__main__":
    sys.exit(main())
