"""The emulated cluster's configurations, simulated by :mod:`byteps.sim`: the architecture
table, the scheduling workload and the synchronisation schemes, side by side with measured
times (:mod:`benchmarks.sim_recorded`, or a fresh run's, as :mod:`benchmarks.sim_validate`
passes them).

Each function returns rows ``{"label", "measured_s", "simulated_s", "ratio"}`` (ratio =
simulated / measured). ``python -m benchmarks.sim_compare`` prints every recorded
configuration's row (:func:`all_rows`) and how many are within :data:`TOLERANCE`.
"""

from __future__ import annotations

import math
import sys
from typing import Dict, List, Optional, Sequence

from byteps.sim.profiles import Profile, from_architecture
from byteps.sim.simulate import Cluster, Scheme, simulate, single_tensor, t_opt
from byteps.sync.cost_formulas import default_tree_width

from . import sim_recorded as recorded

#: Allowed |simulated / measured - 1|.
TOLERANCE = 0.10
#: Iterations before the one the architecture table's median stands for: its jobs run 1
#: warm-up and 3 to 5 timed push_pulls (the median: about the third), and the adaptive push
#: window carries over from each to the next.
TABLE1_WARMUP = 3


def table1_row(n: int, k: int, nbytes: int, goodput_Bps: float,
               scheme: str = "byteps", adaptive_credit: bool = True,
               shaper_burst: float = recorded.EMULATED_SHAPER_BURST) -> float:
    """Simulated push_pull of one ``nbytes`` tensor on the emulated cluster (default
    settings), seconds; ``scheme="ring"`` for gloo's all_reduce. ``adaptive_credit``: the
    core's adaptive push window (its default), in the state it reaches by the middle of the
    benchmark's timed iterations (:data:`TABLE1_WARMUP` iterations simulated first); False:
    the fixed credit of 4 partitions that the core had before it (the recorded runs up to
    2026-11-23). ``shaper_burst``: bytes of the links' ``tbf`` buckets (``Cluster.shaper_burst``;
    default the emulated cluster's at 800 Mbit/s), full at the start of each push_pull."""
    cl = Cluster(n, k, bandwidth=goodput_Bps, latency=recorded.EMULATED_LATENCY_S,
                 shaper_burst=shaper_burst)
    return simulate(single_tensor(nbytes), cl, Scheme(scheme, adaptive_credit=adaptive_credit),
                    warmup=TABLE1_WARMUP if adaptive_credit else 0).iteration_s


def sched_row(model: str, n: int, k: int, goodput_Bps: float, mode: str, partition: int,
              credit: int, compute_ratio: float = 1.0) -> float:
    """Simulated iteration of the scheduling workload (benchmarks/sched.py), seconds. ``mode``:
    ``fifo``, ``priority`` (priority + the fixed ``credit``) or ``adaptive`` (priority + the
    core's adaptive push window, from ``credit``)."""
    base = from_architecture(model)
    prof = base.scaled(compute_ratio * t_opt(n, k, base.nbytes, goodput_Bps))
    # `adaptive`: the core's default window (from `credit`); `priority`: the credit as set
    sch = Scheme(partition_bytes=partition, credit=credit, adaptive_credit=mode == "adaptive")
    if mode == "fifo":
        sch = Scheme(partition_bytes=partition).fifo()
    cl = Cluster(n, k, bandwidth=goodput_Bps, latency=recorded.EMULATED_LATENCY_S)
    return simulate(prof, cl, sch).iteration_s


def schemes_row(n: int, k: int, scheme: str, goodput_Bps: float, profile: Profile) -> float:
    """Simulated iteration of ``profile`` (a single tensor: one push_pull) with byteps's
    ``scheme`` (``ps``, ``ring``, ``tree``, ``hips``) on the (n, k) emulated cluster, as
    ``benchmarks/schemes_cluster.py`` runs it: each tensor its own all-reduce (byteps does not
    bucket), the core's default tree width and HiPS group (``BYTEPS_TREE_WIDTH`` and
    ``BYTEPS_HIPS_GROUP`` 0), seconds."""
    sch = Scheme("byteps" if scheme == "ps" else scheme, bucket_bytes=1,
                 tree_width=default_tree_width(n), hips_group=max(1, math.ceil(math.sqrt(n))))
    cl = Cluster(n, k, bandwidth=goodput_Bps, latency=recorded.EMULATED_LATENCY_S)
    return simulate(profile, cl, sch).iteration_s


def schemes(spec: Optional[Dict] = None) -> List[Dict]:
    """The synchronisation schemes' push_pulls: ``spec`` as :data:`recorded.SCHEMES`."""
    spec = spec or recorded.SCHEMES
    n = spec["n"]
    out = []
    for k, scheme, nbytes, meas in spec["rows"]:
        sim_s = schemes_row(n, k, scheme, spec["goodput_Bps"][k], single_tensor(nbytes))
        size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        out.append(_row(f"{scheme} n={n} k={k} {size}", meas, sim_s, kind="schemes",
                        nbytes=nbytes))
    return out


def _row(label: str, measured: float, simulated: float, **extra) -> Dict:
    return {"label": label, "measured_s": measured, "simulated_s": simulated,
            "ratio": simulated / measured if measured else float("nan"), **extra}


def table1(rows: Optional[List] = None, gloo: bool = True) -> List[Dict]:
    """The architecture table: ``rows`` as :data:`recorded.TABLE1` ``["rows"]``."""
    out = []
    for n, k, m, mbit, byteps_s, gloo_s in rows or recorded.TABLE1["rows"]:
        B = mbit * 1e6 / 8
        tag = f"n={n} k={k} {m >> 20} MiB"
        out.append(_row(f"byteps {tag}", byteps_s, table1_row(n, k, m, B, adaptive_credit=False),
                        kind="byteps",
                        t_opt_s=t_opt(n, k, m, B)))
        if gloo and gloo_s:
            out.append(_row(f"gloo (ring) {tag}", gloo_s, table1_row(n, k, m, B, "ring"),
                            kind="gloo", t_opt_s=t_opt(n, k, m, B)))
    return out


def all_rows() -> List[Dict]:
    """Every recorded configuration: the architecture table, the mixed-placement check
    (:data:`recorded.TABLE1_MIXED`) and the scheduling workload."""
    return table1() + table1(recorded.TABLE1_MIXED["rows"]) + sched()


def sched(spec: Optional[Dict] = None) -> List[Dict]:
    """The scheduling workload: ``spec`` as :data:`recorded.SCHED`."""
    spec = spec or recorded.SCHED
    B = spec["goodput_mbit"] * 1e6 / 8
    out = []
    for model, rows in spec["rows"].items():
        for mode, part, credit, meas in rows:
            sim_s = sched_row(model, spec["n"], spec["k"], B, mode, part, credit,
                              spec.get("compute_ratio", 1.0))
            label = f"{model} {'FIFO' if mode == 'fifo' else 'priority + credit'} " \
                    f"{part >> 10} KiB" + ("" if mode == "fifo" else f" credit {credit}")
            out.append(_row(label, meas, sim_s, kind="sched"))
    return out


def markdown(rows: List[Dict]) -> str:
    """A Markdown table of measured vs simulated rows."""
    lines = ["| configuration | measured (s) | simulated (s) | simulated / measured | "
             "within 10 % |", "|---|---:|---:|---:|---|"]
    for r in rows:
        ok = abs(r["ratio"] - 1) <= TOLERANCE
        lines.append(f"| {r['label']} | {r['measured_s']:.3f} | {r['simulated_s']:.3f} | "
                     f"{r['ratio']:.2f} | {'yes' if ok else '**no**'} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks.sim_compare``: the table of :func:`all_rows` and the count within
    :data:`TOLERANCE` (formerly ``python -m byteps.sim validate``). Returns 0."""
    import argparse

    argparse.ArgumentParser(prog="python -m benchmarks.sim_compare",
                            description="simulated vs the emulated cluster's recorded "
                            "times").parse_args(argv)
    rows = all_rows()
    print(markdown(rows))
    bad = [r for r in rows if abs(r["ratio"] - 1) > TOLERANCE]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} within {100 * TOLERANCE:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
