"""Markdown tables, target verdicts and matplotlib plots for ``python -m benchmarks``.

Every ``*_markdown`` function takes a benchmark's JSON-able results and returns
``(markdown, targets)``: the section's text and a list of target dicts (``name``, ``goal``,
``measured``, ``ratio``, ``threshold``, ``met`` — ``None`` for an informational row).
:func:`render` puts the sections together under a hand-written intro and the summary of all
targets, ending with a link to the hand-written notes (``docs/performance-notes.md``, a page
of its own that is not copied); :func:`write` writes ``docs/performance.md``.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import platform
import subprocess
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import ROOT

Section = Tuple[str, List[dict]]

# ------------------------------------------------------------------------------- helpers --


def _ikeys(d: dict) -> dict:
    """JSON turns int keys into strings; turn them back."""
    return {int(k): v for k, v in d.items()}


def fmt_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _x(ratio: float) -> str:
    return f"{ratio:.2f}×"


def target(name: str, goal: str, measured: str, ratio: float,
           threshold: Optional[float]) -> dict:
    """A target row; ``threshold`` None = informational (no verdict)."""
    ok = None if threshold is None else bool(math.isfinite(ratio) and ratio >= threshold)
    return {"name": name, "goal": goal, "measured": measured, "ratio": float(ratio),
            "threshold": threshold, "met": ok}


def verdict(t: dict) -> str:
    return "—" if t["met"] is None else ("**met**" if t["met"] else "**missed**")


def _have_matplotlib() -> bool:
    """Plots need matplotlib (the ``bench`` extra); without it the report has tables only."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"
    lines = ["| " + " | ".join(header) + " |", sep]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def network_sentence(infos: Sequence[Optional[dict]]) -> str:
    """How the emulated links were built, from :meth:`EmulatedCluster.network_info` records
    (one per cluster of a section): the qdisc that shaped them and the TCP congestion control
    the hosts used, e.g. "links shaped by `tbf`; TCP congestion control `cubic` on every host
    (Linux's default)". Records of runs that predate them (None) count as `tbf` and `cubic`."""
    infos = [i or {} for i in infos] or [{}]
    shapers = sorted({i.get("shaper", "tbf") or "none (unshaped)" for i in infos})
    used = sorted({i.get("congestion_control", "cubic") or "unknown" for i in infos})
    wanted = sorted({i.get("congestion_control_requested", "cubic") or "" for i in infos} - {""})
    text = (f"links shaped by {', '.join(f'`{s}`' for s in shapers)}; TCP congestion control "
            f"{', '.join(f'`{u}`' for u in used)} on every host")
    if used == ["cubic"]:
        return text + " (Linux's default)"
    refused = [w for w in wanted if w not in used]
    if refused:
        allowed = next((i.get("congestion_control_allowed") for i in infos
                        if i.get("congestion_control_allowed")), None)
        text += (f" (the namespaces' default: this kernel does not let a network namespace "
                 f"select {', '.join(f'`{w}`' for w in refused)}"
                 + (f"; `net.ipv4.tcp_allowed_congestion_control` = `{' '.join(allowed)}`"
                    if allowed else "") + ")")
    return text


def targets_table(targets: Sequence[dict]) -> str:
    rows = [[t["name"], t["goal"], t["measured"], _x(t["ratio"]), verdict(t)] for t in targets]
    return _table(["target", "goal", "measured (same run)", "ratio", "status"], rows, "lllrl")


# --------------------------------------------------------------------------------- micro --
def _ref_size(sizes: Sequence[int], want: int = 64 << 20) -> int:
    return want if want in sizes else max(sizes)


#: Per van other than TCP (benchmarks.vans): how much faster than the TCP van the forced-
#: distributed 64 MiB push_pull must be (None: reported, not judged).
VAN_SPEEDUP_TARGETS = {"ucx-shm": 1.5}
#: The 4 KiB forced-distributed push_pull of every other van must be at least as fast as TCP's.
VAN_LATENCY_TARGET = 1.0


def dist_vans(res: dict) -> List[str]:
    """The vans other than TCP whose forced-distributed job has results ('dist:<van>')."""
    return [v for v in res.get("vans", {}) if v != "tcp" and f"dist:{v}" in res["jobs"]]


def van_targets(res: dict) -> List[dict]:
    """The forced-distributed job on each other van against the TCP van's: the 64 MiB time
    (:data:`VAN_SPEEDUP_TARGETS`) and the 4 KiB latency (:data:`VAN_LATENCY_TARGET`)."""
    jobs, out = res["jobs"], []
    if "dist" not in jobs:
        return out
    tcp = _ikeys(jobs["dist"]["latency"])
    for v in dist_vans(res):
        lat = _ikeys(jobs[f"dist:{v}"]["latency"])
        sizes = sorted(set(tcp) & set(lat))
        if not sizes:
            continue
        small, big = sizes[0], _ref_size(sizes)
        thr = VAN_SPEEDUP_TARGETS.get(v)
        goal = f"TCP / {v} ≥ {thr:g}" if thr else "TCP / van (info)"
        out.append(target(f"{fmt_size(big)} forced-distributed push_pull, {v} van vs TCP van"
                          + (f" (≥ {thr:g}× faster)" if thr else " (info)"), goal,
                          f"{_ms(lat[big])} ms ({big / lat[big] / 1e9:.2f} GB/s) vs TCP "
                          f"{_ms(tcp[big])} ms ({big / tcp[big] / 1e9:.2f} GB/s)",
                          tcp[big] / lat[big], thr))
        out.append(target(f"{fmt_size(small)} forced-distributed push_pull latency, {v} van ≤ "
                          "TCP van", f"TCP / {v} ≥ {VAN_LATENCY_TARGET:g}",
                          f"{_ms(lat[small])} ms vs TCP {_ms(tcp[small])} ms",
                          tcp[small] / lat[small], VAN_LATENCY_TARGET))
    return out


def micro_targets(res: dict) -> List[dict]:
    jobs = res["jobs"]
    out: List[dict] = []
    gloo = jobs.get("gloo")
    if gloo:
        glat = _ikeys(gloo["latency"])
        small = min(glat)
        big = _ref_size(list(glat))
        for job, label in (("local", "local (shared memory)"), ("dist", "forced-distributed")):
            if job not in jobs:
                continue
            lat = _ikeys(jobs[job]["latency"])
            out.append(target(f"{fmt_size(small)} push_pull latency ≤ gloo, {label}",
                              "gloo / byteps ≥ 1",
                              f"{_ms(lat[small])} ms vs gloo {_ms(glat[small])} ms",
                              glat[small] / lat[small], 1.0))
        if "local" in jobs:
            lat = _ikeys(jobs["local"]["latency"])
            out.append(target(f"{fmt_size(big)} local push_pull ≥ 3× gloo all_reduce",
                              "gloo / byteps ≥ 3",
                              f"{_ms(lat[big])} ms vs gloo {_ms(glat[big])} ms",
                              glat[big] / lat[big], 3.0))
        if "dist" in jobs:
            lat = _ikeys(jobs["dist"]["latency"])
            out.append(target(f"{fmt_size(big)} forced-distributed push_pull vs gloo (info)",
                              "no loopback target (see the emulated cluster)",
                              f"{_ms(lat[big])} ms vs gloo {_ms(glat[big])} ms",
                              glat[big] / lat[big], None))
    if "dist" in jobs and "tcp" in jobs:
        lat = _ikeys(jobs["dist"]["latency"])
        big = _ref_size(list(lat))
        sock = 2 * res.get("world", 2) * big / lat[big]
        tcp = jobs["tcp"]
        raw = max(tcp["single_Bps"], tcp["dual_Bps"])
        out.append(target(f"forced-distributed socket throughput ≥ 80 % raw TCP ({fmt_size(big)})",
                          "socket / raw TCP ≥ 0.8",
                          f"{sock / 1e9:.2f} GB/s vs raw TCP {raw / 1e9:.2f} GB/s",
                          sock / raw, 0.8))
    if gloo:
        g = gloo["one_at_a_time"]
        g_rate = g["count"] / g["seq_s"]
        for job, label in (("local", "local"), ("dist", "forced-distributed")):
            if job not in jobs:
                continue
            o = jobs[job]["one_at_a_time"]
            rate = o["count"] / o["seq_s"]
            out.append(target(f"one-tensor-at-a-time throughput ≥ gloo, {label}",
                              "byteps / gloo ≥ 1",
                              f"{rate:,.0f} vs gloo {g_rate:,.0f} tensors/s", rate / g_rate, 1.0))
    return out + van_targets(res)


def _first_use(seconds: float) -> str:
    """First-use cost in µs; at or below the noise (≤ 0) shows as '≈ 0'."""
    return f"{seconds * 1e6:.0f}" if seconds > 0 else "≈ 0"


def micro_markdown(res: dict, img_dir: Optional[str] = None,
                   img_rel: str = "img") -> Section:
    """The loopback section: size sweep, socket vs raw TCP, one-tensor-at-a-time, first use."""
    jobs, plan = res["jobs"], res["plan"]
    world = res.get("world", 2)
    names = [j for j in ("local", "dist", "gloo") if j in jobs]
    lat = {j: _ikeys(jobs[j]["latency"]) for j in names}
    sizes = sorted(next(iter(lat.values()))) if lat else []
    md = ["## Loopback microbenchmarks", ""]
    md.append(f"{world} worker processes in every job, float32, in place, sum; median time per "
              f"operation, best of {plan['repeats']} run(s) of every job (jobs interleaved). "
              "Algorithm bandwidth = tensor bytes / time.")
    md.append("")
    van_jobs = [f"dist:{v}" for v in dist_vans(res)]
    order = [j for j in ("local", "dist") if j in jobs] + van_jobs
    for j in order + [j for j in ("gloo", "tcp") if j in jobs]:
        md.append(f"- **{j}**: {res['descriptions'][j]}")
    md.append("")
    if sizes:
        header = ["size"] + [f"{j} ms" for j in names] + [f"{j} GB/s" for j in names]
        if "gloo" in lat:
            header += [f"gloo / {j}" for j in names if j != "gloo"]
        rows = []
        for n in sizes:
            r = [fmt_size(n)] + [_ms(lat[j][n]) for j in names]
            r += [f"{n / lat[j][n] / 1e9:.2f}" for j in names]
            if "gloo" in lat:
                r += [_x(lat["gloo"][n] / lat[j][n]) for j in names if j != "gloo"]
            rows.append(r)
        md += ["### push_pull vs gloo all_reduce versus size", "", _table(header, rows), ""]
    if img_dir is not None and _have_matplotlib():
        for fname, alt in plot_micro(res, img_dir):
            md += [f"![{alt}]({img_rel}/{fname})", ""]
    md += van_section(res)
    if "dist" in jobs and "tcp" in jobs:
        tcp = jobs["tcp"]
        raw = max(tcp["single_Bps"], tcp["dual_Bps"])
        md += ["### Forced-distributed socket throughput vs raw TCP", ""]
        md.append(
            f"Raw TCP on loopback: one Python sender/receiver pair moving "
            f"{fmt_size(tcp['bytes'])} with `sendall`/`recv_into` of {fmt_size(tcp['chunk'])} "
            f"buffers: **{tcp['single_Bps'] / 1e9:.2f} GB/s**; two pairs in parallel: "
            f"**{tcp['dual_Bps'] / 1e9:.2f} GB/s** aggregate (best of {tcp['repeats']}). The "
            "reference is the better of the two. Every byteps push_pull of M bytes with "
            f"{world} workers and one server moves {2 * world}·M bytes through sockets (each "
            "worker pushes M and pulls M), all through the same loopback and the same cores, "
            "so socket throughput = 4·M / time is compared with the aggregate raw figure.")
        md.append("")
        dl = _ikeys(jobs["dist"]["latency"])
        rows = [[fmt_size(n), _ms(dl[n]), f"{2 * world * n / dl[n] / 1e9:.2f}",
                 f"{100 * 2 * world * n / dl[n] / raw:.0f} %"] for n in sorted(dl) if n >= 1 << 20]
        md += [_table(["size", "dist ms", "socket GB/s", "of raw TCP"], rows), ""]
    oat = {j: jobs[j]["one_at_a_time"] for j in order + [j for j in names if j not in order]}
    if oat:
        o0 = next(iter(oat.values()))
        md += ["### One tensor at a time, and first-use (declare) cost", ""]
        md.append(
            f"{o0['count']} distinct {fmt_size(o0['nbytes'])} tensors, each a new name used "
            "once. *sequential*: each push_pull/all_reduce is waited on before the next starts; "
            "*all at once*: all are started, then all waited on. *steady state*: the same "
            f"{fmt_size(o0['nbytes'])} operation repeated on one name. First-use cost = "
            "sequential time per tensor − steady-state time per operation; `declare()` = "
            f"declaring {o0['count']} new names alone (byteps only).")
        md.append("")
        rows = []
        for j, o in oat.items():
            per = o["seq_s"] / o["count"]
            decl = jobs[j].get("declare_per_call_s")
            rows.append([j, f"{o['count'] / o['seq_s']:,.0f}", f"{per * 1e6:.0f}",
                         f"{o['steady_per_op_s'] * 1e6:.0f}",
                         _first_use(per - o["steady_per_op_s"]),
                         f"{o['count'] / o['batched_s']:,.0f}",
                         "n/a" if decl is None else f"{decl * 1e6:.1f}"])
        md += [_table(["job", "sequential tensors/s", "µs per tensor", "steady state µs/op",
                       "first-use cost µs", "all at once tensors/s", "declare() µs"], rows), ""]
    return "\n".join(md), micro_targets(res)


def van_section(res: dict) -> List[str]:
    """The forced-distributed job per van (Markdown lines; none without a second van)."""
    jobs, vans = res["jobs"], dist_vans(res)
    if "dist" not in jobs or not vans:
        return []
    tcp = _ikeys(jobs["dist"]["latency"])
    lat = {v: _ikeys(jobs[f"dist:{v}"]["latency"]) for v in vans}
    md = ["### Forced-distributed push_pull per van", ""]
    md.append("The **dist** job (2 worker machines + 1 server, every process on this host) on "
              "each van, in the same run, jobs interleaved: "
              + "; ".join(f"**{v}** = {d}" for v, d in res.get("vans", {}).items())
              + ". Median time per push_pull; GB/s = tensor bytes / time; TCP / van > 1: the "
              "van is faster.")
    md.append("")
    header = ["size", "tcp ms", "tcp GB/s"]
    for v in vans:
        header += [f"{v} ms", f"{v} GB/s", f"tcp / {v}"]
    rows = []
    for n in sorted(tcp):
        r = [fmt_size(n), _ms(tcp[n]), f"{n / tcp[n] / 1e9:.2f}"]
        for v in vans:
            t = lat[v].get(n)
            r += (["n/a"] * 3 if t is None else
                  [_ms(t), f"{n / t / 1e9:.2f}", _x(tcp[n] / t)])
        rows.append(r)
    return md + [_table(header, rows), ""]


def pyplot(img_dir: str):
    """``matplotlib.pyplot`` on the non-interactive Agg backend, with ``img_dir`` created."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(img_dir, exist_ok=True)
    return plt


def save_figure(fig, img_dir: str, fname: str) -> str:
    """Write ``fig`` as ``img_dir/fname`` (PNG), close it; returns ``fname``."""
    import matplotlib.pyplot as plt

    fig.savefig(os.path.join(img_dir, fname))
    plt.close(fig)
    return fname


def plot_micro(res: dict, img_dir: str) -> List[Tuple[str, str]]:
    """latency and bandwidth versus size (PNG); returns [(file name, alt text)]."""
    plt = pyplot(img_dir)
    jobs = res["jobs"]
    names = [j for j in ("local", "dist", "gloo") if j in jobs]
    names += [f"dist:{v}" for v in dist_vans(res)]
    style = {"local": "o-", "dist": "s-", "gloo": "^--"}
    out = []
    for kind in ("latency", "bandwidth"):
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        for j in names:
            lat = _ikeys(jobs[j]["latency"])
            xs = sorted(lat)
            ys = [lat[n] * 1e3 if kind == "latency" else n / lat[n] / 1e9 for n in xs]
            ax.plot(xs, ys, style.get(j, "D-."), label=res["descriptions"][j].replace("`", ""))
            ticks = xs
        if kind == "bandwidth" and "tcp" in jobs and "dist" in jobs:
            raw = max(jobs["tcp"]["single_Bps"], jobs["tcp"]["dual_Bps"]) / 1e9
            w = res.get("world", 2)
            ax.axhline(raw / (2 * w), color="grey", ls=":",
                       label=f"raw TCP / {2 * w} (dist's socket limit)")
        ax.set_xscale("log", base=2)
        if names:
            ax.set_xticks(ticks)
            ax.set_xticklabels([fmt_size(n).replace(" ", "\n") for n in ticks], fontsize=7)
            ax.minorticks_off()
        ax.set_xlabel("tensor size")
        if kind == "latency":
            ax.set_yscale("log")
            ax.set_ylabel("time per operation (ms, median)")
        else:
            ax.set_ylabel("algorithm bandwidth (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"push_pull vs gloo all_reduce, {kind} (loopback)")
        fig.tight_layout()
        out.append((save_figure(fig, img_dir, f"micro_{kind}.png"), f"{kind} versus size"))
    return out


# ----------------------------------------------------------------------------------- sum --
def sum_targets(res: dict) -> List[dict]:
    isa, out = res["default_isa"], []
    rows = res["rows"]
    membw = _ikeys(res["membw"])
    dt = "float32" if "float32" in rows else next(iter(rows))
    for th in res["threads"]:
        row = _ikeys(rows[dt])[th]
        label = "1 thread" if th == 1 else f"{th} threads"
        if "numpy" in row:
            out.append(target(f"summation ≥ NumPy `a += b` ({dt}, {label})",
                              "byteps / NumPy ≥ 1",
                              f"{row[isa]:.1f} vs {row['numpy']:.1f} GB/s",
                              row[isa] / row["numpy"], 1.0))
        bw = membw[th]["best"]
        out.append(target(f"summation ≥ 90 % memory bandwidth ({dt}, {label})",
                          "byteps / membw ≥ 0.9", f"{row[isa]:.1f} vs {bw:.1f} GB/s",
                          row[isa] / bw, 0.9))
        if "numpy" in row:
            out.append(target(f"NumPy `a += b` vs memory bandwidth ({dt}, {label}; context)",
                              "what the 3-stream pattern reaches",
                              f"{row['numpy']:.1f} vs {bw:.1f} GB/s", row["numpy"] / bw, None))
    # every dtype NumPy has, at the highest thread count: the worst ratio
    th = max(res["threads"])
    ratios = [(d, _ikeys(r)[th][isa] / _ikeys(r)[th]["numpy"]) for d, r in rows.items()
              if "numpy" in _ikeys(r)[th]]
    if len(ratios) > 1:
        d, worst = min(ratios, key=lambda x: x[1])
        out.append(target(f"summation ≥ NumPy, every dtype ({th} threads; worst: {d})",
                          "min byteps / NumPy ≥ 1",
                          ", ".join(f"{d}: {r:.2f}" for d, r in ratios), worst, 1.0))
    return out


def sum_markdown(res: dict, img_dir: Optional[str] = None, img_rel: str = "img") -> Section:
    plan, isas, isa = res["plan"], res["isas"], res["default_isa"]
    membw = _ikeys(res["membw"])
    md = ["## Summation kernels", ""]
    md.append(
        f"`byteps._core.reduce.sum_into(a, b)` (`a += b`, the servers' kernel) for every ISA of "
        f"this CPU ({', '.join(isas)}; the server uses **{isa}**), next to NumPy "
        f"`np.add(a, b, out=a)` on the same {fmt_size(plan['size'])} buffers. GB/s count every "
        "byte read and written (3 streams per `a += b`). Multi-threaded: the buffers are split "
        "into one contiguous slice per Python thread (the kernels and NumPy release the GIL). "
        f"Best of {plan['repeats']} calls, the ISAs and NumPy timed in turn in every round.")
    md.append("")
    md.append(
        f"Memory bandwidth probe ({fmt_size(int(plan.get('probe_size') or plan['size']))} "
        "buffer, 2 streams each, the better counts): " + "; ".join(
            f"{th} thread(s): copy {membw[th]['copy']:.1f}, in-place scale "
            f"{membw[th]['scale']:.1f} → **{membw[th]['best']:.1f} GB/s**"
            for th in res["threads"]) + ".")
    md.append("")
    for th in res["threads"]:
        md += [f"### {th} thread{'s' if th > 1 else ''}", ""]
        header = ["dtype"] + isas + ["NumPy", f"{isa} / NumPy", f"{isa} / membw"]
        rows = []
        for dtype, r in res["rows"].items():
            row = _ikeys(r)[th]
            cells = [dtype] + [f"{row[i]:.1f}" for i in isas]
            cells.append(f"{row['numpy']:.1f}" if "numpy" in row else "n/a")
            cells.append(_x(row[isa] / row["numpy"]) if "numpy" in row else "n/a")
            cells.append(f"{100 * row[isa] / membw[th]['best']:.0f} %")
            rows.append(cells)
        md += [_table(header, rows), ""]
    if img_dir is not None and _have_matplotlib():
        fname = plot_sum(res, img_dir)
        md += [f"![summation throughput]({img_rel}/{fname})", ""]
    return "\n".join(md), sum_targets(res)


def plot_sum(res: dict, img_dir: str) -> str:
    plt = pyplot(img_dir)
    th = max(res["threads"])
    dtypes = list(res["rows"])
    cols = res["isas"] + ["numpy"]
    fig, ax = plt.subplots(figsize=(7.2, 4.2), dpi=110)
    width = 0.8 / len(cols)
    for k, c in enumerate(cols):
        ys = [_ikeys(res["rows"][d])[th].get(c, 0.0) for d in dtypes]
        ax.bar([i + k * width for i in range(len(dtypes))], ys, width, label=c)
    ax.axhline(_ikeys(res["membw"])[th]["best"], color="grey", ls=":",
               label="memory bandwidth probe")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(dtypes))])
    ax.set_xticklabels(dtypes)
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(f"a += b throughput, {th} thread(s)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, img_dir, "sum_throughput.png")


# ---------------------------------------------------------------------------------- page --


def run_standalone(plan: dict, run: Callable, markdown: Callable,
                   json_path: Optional[str] = None) -> int:
    """A bench plugin run alone (``python -m benchmarks.<name>``): log progress, measure
    ``plan`` with ``run(plan, progress)``, save the raw results to ``json_path`` if given,
    print the section ``markdown(results, None)`` and one line per target. Returns 0."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    log = logging.getLogger(__package__)
    res = run(plan, lambda label: log.info("%s", label))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1)
    md, targets = markdown(res, None)
    print(md)
    for t in targets:
        print(t["met"], f"{t['ratio']:.3f}", t["name"], t["measured"])
    return 0


def machine() -> Dict[str, str]:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cores": str(os.cpu_count()), "kernel": f"{platform.system()} {platform.release()}"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            info["memory"] = f"{kb / (1 << 20):.0f} GiB"
    except OSError:
        pass
    try:
        from byteps._core import reduce

        info["isas"] = ", ".join(reduce.available_isas())
    except Exception:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:
        pass
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, timeout=5,
                                        cwd=os.path.dirname(os.path.abspath(__file__))
                                        ).stdout.strip()
    except Exception:
        pass
    return info


#: The hand-written notes (what was found, tried and measured by hand), a page of their own that
#: the generated ``docs/performance.md`` links to and does not repeat.
NOTES_PATH = os.path.join(ROOT, "docs", "performance-notes.md")


def render(sections: Sequence[Section], command: str, elapsed_s: Optional[float] = None,
           info: Optional[Dict[str, str]] = None, date: Optional[str] = None) -> str:
    """The whole page: header (machine, command), the targets of every section, the sections,
    then a link to the hand-written notes (:data:`NOTES_PATH`, not copied into the page)."""
    info = info or machine()
    date = date or datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    all_targets = [t for _, ts in sections for t in ts]
    md = ["# Performance", ""]
    md.append("<!-- Generated by `python -m benchmarks` (benchmarks/report.py); edit that, or the "
              "notes in docs/performance-notes.md, not this file. -->")
    md.append("")
    md.append(
        f"Measured {date} on {info.get('cpu', 'an unknown CPU')}, {info.get('cores', '?')} "
        f"cores, {info.get('memory', '?')} memory, SIMD: {info.get('isas', '?')}"
        + (f", {info['kernel']}" if info.get("kernel") else "") + "; Python "
        f"{info.get('python', '?')}, torch {info.get('torch', 'n/a')}"
        + (f", commit {info['commit']}" if info.get("commit") else "") + ". Every process of a "
        "job shares these cores and the loopback interface, so the loopback numbers are not "
        "cluster numbers. Other jobs may have run on the machine at the same time: every "
        "figure is the best of several repeats (stated per section).")
    md.append("")
    md.append(f"Regenerate: `{command}`" + (f" ({elapsed_s / 60:.1f} min)." if elapsed_s else "."))
    md.append("")
    if all_targets:
        met = sum(1 for t in all_targets if t["met"])
        judged = sum(1 for t in all_targets if t["met"] is not None)
        md += ["## Targets, measured in this run", "",
               f"{met} of {judged} targets met.", "", targets_table(all_targets), ""]
    for text, _ in sections:
        md += [text.rstrip(), ""]
    md += ["## Notes and history", "",
           f"What was found, tried and measured by hand while reaching these targets, with "
           f"before/after numbers, is in [performance-notes.md]"
           f"({os.path.basename(NOTES_PATH)}) (hand-written; this page is generated).", ""]
    return "\n".join(md)


def write(path: str, page: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(page)
