"""Tables and plots of the simulator: the model table, the scaling picture, the what-if table.

Plots need matplotlib (the ``bench`` extra: ``pip install byteps[bench]``); it is imported
only when a plot is asked for.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from . import profiles
from .simulate import SCHEME_NAMES, Cluster, Scheme, simulate

#: The seed talk's ideal communication times at 100 GbE, milliseconds.
SEED_COMM_MS = {"resnet50": 8.32, "vgg16": 44.6, "transformer": 19.52, "bert_base": 23.68,
                "bert_large": 61.92}


def ideal_comm_ms(params: int, bandwidth_bps: float = 100e9, dtype_bytes: int = 4,
                  directions: int = 1) -> float:
    """The seed table's convention: float32 gradient bits / (100 x 10^9 bit/s), one direction
    (``params x 32 / 1e11`` s), milliseconds."""
    return params * dtype_bytes * 8 * directions / bandwidth_bps * 1e3


def model_table(tflops: float = profiles.DEFAULT_TFLOPS) -> List[Dict]:
    """Per shipped profile: parameters, forward / backward ms (derived at ``tflops``), ideal
    communication ms at 100 GbE and the seed talk's number with the parameter count it
    implies under the same convention."""
    out = []
    for name in profiles.shipped():
        p = profiles.from_architecture(name, tflops=tflops)
        row = {"model": name, "params": p.params, "batch": p.meta["batch"],
               "fwd_ms": p.fwd_s * 1e3, "bwd_ms": p.bwd_s * 1e3,
               "comm_ms": ideal_comm_ms(p.params)}
        if name in SEED_COMM_MS:
            row["seed_ms"] = SEED_COMM_MS[name]
            row["seed_params"] = SEED_COMM_MS[name] * 1e-3 * 100e9 / 32
        out.append(row)
    return out


def model_markdown(rows: List[Dict]) -> str:
    lines = ["| model | parameters | batch / GPU | forward (ms) | backward (ms) | ideal comm. at "
             "100 GbE (ms) | seed talk (ms) | parameters the seed's time implies |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        seed = f"{r['seed_ms']:g}" if "seed_ms" in r else "—"
        implied = f"{r['seed_params'] / 1e6:.2f} M" if "seed_params" in r else "—"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['batch']} | {r['fwd_ms']:.1f} | "
                     f"{r['bwd_ms']:.1f} | {r['comm_ms']:.2f} | {seed} | {implied} |")
    return "\n".join(lines)


#: The scaling picture's configurations: label -> (scheme, CPU machines per worker machine)
SCALING = {"BytePS, k = n": ("byteps", 1.0), "BytePS, k = n/2": ("byteps", 0.5),
           "BytePS, k = 0": ("byteps", 0.0), "ring all-reduce": ("ring", 0.0),
           "native PS": ("ps", 0.0)}


def scaling(profile: profiles.Profile, gpus: Sequence[int] = (8, 16, 32, 64, 128, 256),
            gpus_per_machine: int = 8, bandwidth: float = 100e9 / 8,
            partition_bytes: int = 4 << 20, credit: int = 4, method: str = "auto",
            adaptive_credit: bool = True, **cluster_kw) -> List[Dict]:
    """Iteration time, scaling efficiency and bound per configuration of :data:`SCALING`
    and GPU count (``gpus_per_machine`` GPUs per worker machine; bandwidth in bytes/s).
    Partitions of ``partition_bytes`` (default 4 MiB) with ``credit`` (the adaptive window's
    start, or fixed with ``adaptive_credit=False``); ``method``: see
    :func:`byteps.sim.simulate` (native PS is always simulated in full).

    Returns rows ``{"config", "gpus", "machines", "cpu_machines", "iteration_s",
    "efficiency", "bound", "busiest", "busiest_share"}`` (busiest: the busiest resource's
    name, busiest_share: its busy share of the iteration)."""
    out = []
    for label, (scheme, kfrac) in SCALING.items():
        for g in gpus:
            n = max(1, g // gpus_per_machine)
            cl = Cluster(n, int(round(kfrac * n)), gpus_per_machine, bandwidth, **cluster_kw)
            r = simulate(profile, cl, Scheme(scheme, partition_bytes=partition_bytes,
                                             credit=credit, adaptive_credit=adaptive_credit),
                         method=method if scheme == "byteps" else "auto")
            top = max(r.busy, key=lambda k: r.busy[k]) if r.busy else "compute"
            out.append({"config": label, "gpus": g, "machines": n, "cpu_machines":
                        cl.cpu_machines, "iteration_s": r.iteration_s,
                        "efficiency": r.efficiency, "bound": r.bound, "busiest": top,
                        "busiest_share": r.busy.get(top, 0.0) / r.iteration_s})
    return out


def _short(resource: str) -> str:
    """A resource's name for a table cell: ``w3.tx`` -> ``worker NIC tx``."""
    if resource.startswith(("w", "c")) and resource[1:2].isdigit() and "." in resource:
        kind = {"w": "worker", "c": "CPU machine"}[resource[0]]
        return f"{kind} {resource.split('.', 1)[1]}"
    return resource.split(" (")[0] if "all-reduce" in resource else resource


def scaling_markdown(rows: List[Dict]) -> str:
    """Efficiency per configuration and GPU count, and where each becomes
    communication-bound (efficiency below 0.97) with its busiest resource there."""
    gpus = sorted({r["gpus"] for r in rows})
    lines = ["| configuration | " + " | ".join(f"{g} GPUs" for g in gpus) +
             " | communication-bound from (busiest resource there) |",
             "|---|" + "---:|" * len(gpus) + "---|"]
    for cfg in dict.fromkeys(r["config"] for r in rows):
        rs = {r["gpus"]: r for r in rows if r["config"] == cfg}
        first = next((g for g in gpus if rs[g]["bound"] != "compute"), None)
        if first:
            r = rs[first]
            why = f"{first} GPUs ({_short(r['busiest'])}, {100 * r['busiest_share']:.0f} % busy)"
        else:
            why = "compute-bound throughout"
        lines.append(f"| {cfg} | " + " | ".join(f"{rs[g]['efficiency']:.2f}" for g in gpus)
                     + f" | {why} |")
    return "\n".join(lines)


def whatif(profile: profiles.Profile, cluster: Cluster, ratios: Sequence[float] = (2, 4, 8),
           partition_bytes: int = 262144, credit: int = 4, method: str = "auto",
           adaptive_credit: bool = True) -> List[Dict]:
    """BytePS (with the given CPU machines and ``credit`` -- the adaptive window's start, or
    fixed with ``adaptive_credit=False`` --, with a fixed 4 x the credit, and without CPU
    machines), ring all-reduce, native PS and BytePS with each compression ratio on
    ``cluster`` (partitions of ``partition_bytes``; ``method``: see
    :func:`byteps.sim.simulate`). Rows ``{"config", "iteration_s", "efficiency", "bound",
    "scheme"}``."""
    from dataclasses import replace

    cases = [(f"BytePS, {cluster.cpu_machines} CPU machines", cluster, Scheme("byteps")),
             ("BytePS, no CPU machines", replace(cluster, cpu_machines=0), Scheme("byteps")),
             ("ring all-reduce", cluster, Scheme("ring")),
             ("native PS", cluster, Scheme("ps"))]
    cases += [(f"BytePS + compression {r:g}x", cluster, Scheme("byteps", compression=r))
              for r in ratios]
    if credit:  # a fixed window 4 x deeper than the adaptive one starts at (25 Gbit/s and up)
        cases.insert(1, (f"BytePS, {cluster.cpu_machines} CPU machines, fixed credit "
                         f"{4 * credit}", cluster,
                         Scheme("byteps", credit=4 * credit, adaptive_credit=False)))
    out = []
    for label, cl, sch in cases:
        sch = replace(sch, partition_bytes=partition_bytes)
        if sch.adaptive_credit:  # every row but the fixed-credit one takes the caller's credit
            sch = replace(sch, credit=credit, adaptive_credit=adaptive_credit)
        r = simulate(profile, cl, sch, method=method if sch.name == "byteps" else "auto")
        out.append({"config": label, "iteration_s": r.iteration_s, "efficiency": r.efficiency,
                    "bound": r.bound, "scheme": SCHEME_NAMES[sch.name]})
    return out


def whatif_markdown(rows: List[Dict]) -> str:
    """The what-if table: iteration, scaling efficiency, speed-up over ring all-reduce and
    what bounds each configuration."""
    ring = next((r["iteration_s"] for r in rows if r["config"] == "ring all-reduce"), None)
    lines = ["| configuration | iteration (ms) | scaling efficiency | vs ring all-reduce | "
             "bound by |", "|---|---:|---:|---:|---|"]
    for r in rows:
        vs = f"{ring / r['iteration_s']:.2f} x" if ring and r["iteration_s"] else "—"
        lines.append(f"| {r['config']} | {r['iteration_s'] * 1e3:.1f} | {r['efficiency']:.2f} "
                     f"| {vs} | {r['bound']} |")
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot with the Agg backend.

    Raises:
        byteps.errors.ConfigError: matplotlib is missing (install the ``bench`` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from ..errors import ConfigError

        raise ConfigError("plots need matplotlib: pip install 'byteps[bench]' (or "
                          "matplotlib)") from exc
    return plt


def plot_scaling_grid(panels: Sequence, path: str, cols: int = 2) -> str:
    """One panel per ``(title, rows)`` (rows as :func:`scaling` returns), scaling efficiency
    vs GPUs (log scale); writes the PNG ``path``."""
    plt = pyplot()
    panels = list(panels)
    cols = min(cols, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), dpi=110,
                             squeeze=False)
    style = {"BytePS, k = n": "o-", "BytePS, k = n/2": "o--", "BytePS, k = 0": "o:",
             "ring all-reduce": "s-", "native PS": "^-"}
    for ax, (title, rows) in zip(axes.flat, panels):
        for cfg in dict.fromkeys(r["config"] for r in rows):
            rs = [r for r in rows if r["config"] == cfg]
            ax.plot([r["gpus"] for r in rs], [r["efficiency"] for r in rs],
                    style.get(cfg, "o-"), label=cfg)
        ax.set_xscale("log", base=2)
        gp = sorted({r["gpus"] for r in rows})
        ax.set_xticks(gp)
        ax.set_xticklabels([str(g) for g in gp])
        ax.set_xlabel("GPUs (8 per worker machine)")
        ax.set_ylabel("scaling efficiency")
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
        if title:
            ax.set_title(title, fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
