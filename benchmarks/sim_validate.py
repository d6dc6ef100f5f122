"""The what-if simulator against the emulated cluster, in one run: the architecture table's
and the scheduling workload's configurations are measured (:mod:`benchmarks.table1`,
:mod:`benchmarks.sched`) and simulated (:mod:`benchmarks.sim_compare`) with the goodput the
run measured; the section shows them side by side (target: within 10 %).

Hooked into ``python -m benchmarks`` as ``sim`` (``--only sim``); alone:
``python -m benchmarks.sim_validate [--quick]`` (quick: n = 2 and 4 at k = 0 and 4, 16 MiB;
ResNet-50 FIFO vs the defaults).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from . import netns, sched, table1
from .report import run_standalone

TOLERANCE = 0.10


def bench_settings(quick: bool) -> dict:
    t = table1.bench_settings(quick, configs=[[2, 0], [4, 4]] if quick else None, gloo=True,
                              vans=["tcp"])
    return {"quick": quick, "table1": t, "sched": sched.bench_settings(quick, autotune=False),
            "unavailable": t["unavailable"]}


#: sections of ``python -m benchmarks`` whose results this one reads when the same run has them
#: (their full plans cover this one's: the TCP van's default jobs and gloo at every (n, k) and
#: size; FIFO and priority + credit per model), so the cluster is not measured twice.
REUSES = ("cluster", "sched")


def bench_steps(plan: dict) -> int:
    return (0 if plan.get("reused") else
            table1.bench_steps(plan["table1"]) + sched.bench_steps(plan["sched"]))


def _shaper_burst(plan: dict) -> int:
    """Bytes of the tbf bucket the architecture table's links were shaped with."""
    mbit = plan["table1"].get("bandwidth_mbit", table1.BANDWIDTH_MBIT)
    return netns.tbf_params(mbit * 1e6)[0]


def bench_run(plan: dict, progress: Callable[[str], None] = lambda label: None,
              reused: dict | None = None) -> dict:
    """Measure both workloads on the emulated cluster, then simulate them. ``reused``: the
    results of this run's ``cluster`` and ``sched`` sections (keys of :data:`REUSES`), simulated
    instead of measuring again; the plans are then theirs."""
    from . import sim_compare

    if reused:
        plan = {**plan, "table1": reused["cluster"]["plan"], "sched": reused["sched"]["plan"],
                "reused": sorted(reused)}
        res = {"plan": plan, "table1": reused["cluster"], "sched": reused["sched"]}
    else:
        res = {"plan": plan, "table1": table1.bench_run(plan["table1"], progress),
               "sched": sched.bench_run(plan["sched"], progress)}
    rows = []
    # the default jobs ran with the core's adaptive push window unless the run fixed the credit
    adaptive = "BYTEPS_SCHEDULING_CREDIT" not in res["table1"].get("env_knobs", {})
    # the links' tbf buckets, as the run shaped them (full when each timed push_pull starts)
    burst = _shaper_burst(plan)
    for r in res["table1"].get("rows", []):
        meas = (r.get("default") or {}).get("time_s")
        if meas:
            rows.append(sim_compare._row(f"byteps n={r['n']} k={r['k']} {r['bytes'] >> 20} MiB",
                                      meas, sim_compare.table1_row(r["n"], r["k"], r["bytes"],
                                                                r["goodput_Bps"],
                                                                adaptive_credit=adaptive,
                                                                shaper_burst=burst)))
        g = (r.get("gloo") or {}).get("time_s")
        if g:
            rows.append(sim_compare._row(f"gloo (ring) n={r['n']} k={r['k']} "
                                      f"{r['bytes'] >> 20} MiB", g, sim_compare.table1_row(
                                          r["n"], r["k"], r["bytes"], r["goodput_Bps"], "ring")))
    s, sp = res["sched"], plan["sched"]
    for name, row in s.get("models", {}).items():
        for j in row["jobs"]:
            if "time_s" not in j or j["mode"] not in ("fifo", "priority", "adaptive"):
                continue
            sim_s = sim_compare.sched_row(name, sp["n"], sp["k"], s["goodput_Bps"], j["mode"],
                                       j["partition"], j["credit"], sp["compute_ratio"])
            rows.append(sim_compare._row(f"{name} {j['mode']} {j['partition'] >> 10} KiB credit "
                                      f"{j['credit']}", j["time_s"], sim_s))
    res["rows"] = rows
    return res


def bench_markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    from . import sim_compare
    from .report import target

    md = ["## The what-if simulator against the emulated cluster", ""]
    if res["plan"].get("unavailable"):
        return "\n".join(md + [f"Not measured: {res['plan']['unavailable']}."]), []
    rows = res.get("rows", [])
    md += ["The architecture table's and the scheduling workload's configurations, measured "
           "in this run and simulated by `byteps.sim` (docs/simulator.md) with the goodput "
           "this run measured" + (" (the jobs of this page's emulated-cluster and scheduling "
                                  "sections, not run again)" if res["plan"].get("reused") else "")
           + ". The links' `tbf` buckets "
           f"({_shaper_burst(res['plan']):,} bytes each "
           "way) are simulated full when each of the architecture table's push_pulls starts "
           "(`Cluster.shaper_burst`: its jobs start every timed push_pull after a barrier, on "
           "idle links), and not for the scheduling workload (iterations back to back).",
           "", sim_compare.markdown(rows), ""]
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1), default=None)
    targets = []
    if worst:
        inside = sum(abs(r["ratio"] - 1) <= TOLERANCE for r in rows)
        targets.append(target("simulator within 10 % of the emulated cluster (info)",
                               "rows within 10 %", f"{inside} of {len(rows)}; worst "
                               f"{worst['label']}: {worst['ratio']:.2f}",
                               inside / len(rows), None))
    return "\n".join(md), targets


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_validate", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="also write the raw results here")
    a = p.parse_args(argv)
    return run_standalone(bench_settings(a.quick), bench_run, bench_markdown, a.json)


if __name__ == "__main__":
    sys.exit(main())
