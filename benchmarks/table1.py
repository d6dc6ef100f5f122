"""The architecture table (the BytePS paper's Table 1, measured) on the emulated cluster.

For every (n, k) of :data:`CONFIGS` -- n worker hosts, k CPU-server hosts (k = 0: servers
colocated on the worker hosts; for 0 < k < n a server is colocated on every worker host too,
see :func:`benchmarks.cluster.run_byteps_job`) -- one :class:`EmulatedCluster` at B is built,
the goodput of one of its links measured (:func:`measure_link`, w0 -> s0 or w0 -> w1), and for
every model size M, in the same cluster, one after another:

* byteps push_pull with the core's default ``BYTEPS_*`` settings,
* byteps push_pull with the probe's settings (:data:`benchmarks.cluster.PROBE_ENV`),
* each of those on every van of the plan (:mod:`benchmarks.vans`; default: the TCP van, and
  where byteps has UCX the UCX van over TCP, ``UCX_TLS=tcp,self UCX_NET_DEVICES=eth0``) at
  the plan's ``van_sizes``; results ``default`` (TCP van) and ``default:ucx-tcp``,
* ``torch.distributed`` gloo ``all_reduce``, one process per worker host
  (``MASTER_ADDR`` = w0's address, ``GLOO_SOCKET_IFNAME=eth0``).

Each time is the median over the timed iterations of the slowest process's time; every
iteration starts after the links were idle for :func:`benchmarks.cluster.idle_before_iteration`
(so each starts with its shaper's bucket full, whichever direction carried the last bytes of
the iteration before) and a barrier (byteps: a 4-byte push_pull; gloo: ``dist.barrier()``), so
checking the previous result is not timed as waiting. ``t_opt =
2n(n-1)M / ((n^2+kn-2k) B)`` and gloo's ring time ``2(n-1)M / (nB)`` use the MEASURED goodput
as B, so the ratios are against what the links really carry. The theoretical speed-up of
byteps over a ring all-reduce is their quotient, ``(n^2+kn-2k) / n^2``.

Hooked into ``python -m benchmarks`` (:mod:`benchmarks.cli`) through ``bench_*``, and runnable
alone: ``python -m benchmarks.table1 [--quick] [--sizes-mib 16] [--configs 2,0 4,4]
[--vans tcp,ucx-tcp]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from . import child_env
from . import cluster as bc
from . import vans as bv
from .report import pyplot, run_standalone, save_figure

log = logging.getLogger(__name__)

#: (n worker hosts, k CPU-server hosts) of the paper's Table 1.
CONFIGS = ((2, 0), (2, 2), (4, 0), (4, 2), (4, 4))
#: Link rate: the probe's recommendation (``python -m benchmarks.cluster --probe``).
BANDWIDTH_MBIT = 800.0
#: byteps settings that may be compared: the core's defaults (no ``BYTEPS_*`` knob set) and the
#: probe's; a run measures :data:`DEFAULT_SETTINGS` unless told otherwise.
SETTINGS = {"default": {}, "tuned": dict(bc.PROBE_ENV)}
#: Since the defaults come from the scheduling sweep, the full run measures them alone (time).
DEFAULT_SETTINGS = ("default",)
_KNOBS = ("BYTEPS_PARTITION_BYTES", "BYTEPS_SCHEDULING_CREDIT")
PUSHPULL_TARGET = 1.05  # push_pull <= 1.05 x t_opt
SPEEDUP_TARGET = 0.95  # speed-up over gloo >= 0.95 x theory
VAN_TARGET = 1.05  # another van's push_pull <= 1.05 x the TCP van's
SMALL_BYTES = 4 << 20  # small tensors: sizes up to this one are judged against ...
SMALL_TARGET = 1.15  # ... push_pull <= 1.15 x t_opt and never slower than gloo, on every van

# --------------------------------------------------------------------------------- theory --


def theory_speedup(n: int, k: int) -> float:
    """Ring all-reduce time / ``t_opt`` = ``(n^2 + kn - 2k) / n^2``."""
    return (n * n + k * n - 2 * k) / (n * n)


def t_ring(n: int, model_bytes: float, bandwidth_Bps: float) -> float:
    """Ring all-reduce time ``2(n-1)M / (nB)``, seconds."""
    return 2 * (n - 1) * model_bytes / (n * bandwidth_Bps) if n > 1 else 0.0


# ----------------------------------------------------------------------------- gloo worker --


def _gloo_main(nbytes: int, iters: int, warmup: int) -> int:
    """One gloo rank (``RANK``/``WORLD_SIZE``/``MASTER_*`` from the environment): all_reduce a
    float32 tensor ``warmup + iters`` times, check every sum, print ``RESULT {json}``."""
    import datetime

    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=300))
    r, size = dist.get_rank(), dist.get_world_size()
    nelem = max(nbytes // 4, 1)
    idle_s = float(os.environ.get(bc.IDLE_ENV) or 0)
    base = (np.arange(nelem, dtype=np.int64) % 251).astype(np.float32)
    x = torch.from_numpy(base + np.float32(1000 * r))
    want = torch.from_numpy(base * np.float32(size) + np.float32(1000 * size * (size - 1) // 2))
    buf = torch.empty_like(x)
    times = []
    for it in range(warmup + iters):
        buf.copy_(x)
        time.sleep(idle_s)  # as the byteps workers (benchmarks.cluster.idle_before_iteration)
        dist.barrier()  # as the byteps workers: start together, the check is not timed
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        dt = time.perf_counter() - t0
        if not torch.equal(buf, want):
            print(f"FAIL rank {r} iter {it}: wrong sum", flush=True)
            return 1
        if it >= warmup:
            times.append(dt)
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": r, "size": size, "times": times}), flush=True)
    return 0


def run_gloo(cluster: bc.EmulatedCluster, nbytes: int, iters: int, warmup: int = 1,
             timeout: float = 180.0) -> float:
    """gloo all_reduce of ``nbytes`` float32 on ``cluster``'s worker hosts: median over the
    timed iterations of the slowest rank's time, seconds. Raises RuntimeError on failure."""
    n = cluster.num_workers
    port = random.randint(20000, 59999)
    env = {**child_env(), "MASTER_ADDR": cluster.workers[0].address, "MASTER_PORT": str(port),
           "WORLD_SIZE": str(n), "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", bc.IDLE_ENV: str(bc.idle_before_iteration(cluster))}
    argv = [sys.executable, "-m", "benchmarks.table1", "--gloo-worker", str(nbytes),
            str(iters), str(warmup)]
    outs, codes = bc.run_on_worker_hosts(cluster, argv, env, timeout, "gloo job")
    reports = []
    for out in outs:
        found = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if found:
            reports.append(json.loads(found[-1][7:]))
    if len(reports) != n or any(c != 0 for c in codes):
        tail = "\n".join(outs[0].splitlines()[-15:])
        raise RuntimeError(f"gloo job failed (exit codes {codes}):\n"
                           f"{tail}")
    return statistics.median(max(ts) for ts in zip(*(r["times"] for r in reports)))


# ------------------------------------------------------------------------------ the bench --


def job_key(setting: str, van: str = "tcp") -> str:
    """A byteps job's key in a row: the settings' name on the TCP van ('default'), else
    'default:ucx-tcp'."""
    return setting if van == "tcp" else f"{setting}:{van}"


def bench_settings(quick: bool, sizes: Sequence[int] | None = None,
                   configs: Sequence[Sequence[int]] | None = None,
                   iters: Mapping[int, int] | None = None, bandwidth_mbit: float | None = None,
                   settings: Sequence[str] | None = None, gloo: bool = True,
                   vans: Sequence[str] | None = None,
                   van_sizes: Sequence[int] | None = None) -> dict:
    """The plan. Quick: 16 MiB, 2 timed iterations (about 90 s on 2 cores). Full: 4, 64 and
    256 MiB (15, 3 and 2 timed iterations; about 8 minutes).

    ``vans`` (default :func:`benchmarks.vans.default_vans`, ``netns=True``; the TCP van is
    always measured, the table's main columns are its): the byteps jobs run on each; the vans
    other than TCP only at ``van_sizes`` (default: every size up to
    64 MiB -- at 256 MiB both vans are as network-bound as at 64 MiB, and the run would take
    a minute longer)."""
    if sizes is None:
        sizes = [16 << 20] if quick else [4 << 20, 64 << 20, 256 << 20]
    if van_sizes is None:
        van_sizes = [s for s in sizes if s <= 64 << 20] or [min(sizes)]
    # A 4 MiB push_pull takes about 45 ms: 15 timed iterations (under a second per job) give
    # a median that 2-3 iterations slowed by other load do not move, where 5 did.
    default_iters = {s: (2 if quick else 15 if s <= 8 << 20 else 3 if s <= 64 << 20 else 2)
                     for s in sizes}
    return {
        "quick": quick,
        "sizes": [int(s) for s in sizes],
        "configs": [list(c) for c in (configs or CONFIGS)],
        "iters": {str(s): int((iters or {}).get(s, default_iters[s])) for s in sizes},
        "warmup": 1,
        "bandwidth_mbit": float(bandwidth_mbit or BANDWIDTH_MBIT),
        "link_seconds": 1.0 if quick else 2.0,
        "settings": list(settings or DEFAULT_SETTINGS),
        "gloo": bool(gloo),
        "vans": bv.check(["tcp", *(vans or bv.default_vans(netns=True))], netns=True),
        "van_sizes": sorted(int(s) for s in van_sizes if s in sizes),
        "unavailable": bc.netns_unavailable(),
    }


def _vans_at(plan: dict, nbytes: int) -> list[str]:
    """The vans the byteps jobs of size ``nbytes`` run on."""
    return [v for v in plan.get("vans", ["tcp"])
            if v == "tcp" or nbytes in plan.get("van_sizes", [])]


def bench_steps(plan: dict) -> int:
    """Progress steps: one per (n, k) cluster (build + link) and one per job."""
    if plan["unavailable"]:
        return 1
    jobs = sum(len(plan["settings"]) * len(_vans_at(plan, m)) + (1 if plan["gloo"] else 0)
               for m in plan["sizes"])
    return len(plan["configs"]) * (1 + jobs)


def _timeout(n: int, nbytes: int, bandwidth_Bps: float, runs: int) -> float:
    per = max(t_ring(n, nbytes, bandwidth_Bps), nbytes / bandwidth_Bps)
    return 60.0 + 4.0 * runs * per


def bench_run(plan: dict, progress: Callable[[str], None] = lambda label: None) -> dict:
    """Measure the table; JSON-able results (a failed job becomes ``{"error": ...}``)."""
    res = {"plan": plan, "cores": os.cpu_count(), "rows": [],
           "env_knobs": {k: os.environ[k] for k in _KNOBS if k in os.environ},
           "vans": {v: bv.describe(v, bv.job_env(v, netns=True)) for v in plan["vans"]}}
    if plan["unavailable"]:
        progress("cluster: skipped")
        res["skipped"] = plan["unavailable"]
        return res
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        bc.install_signal_cleanup()
    B = plan["bandwidth_mbit"] * 1e6
    t_start = time.monotonic()
    for n, k in plan["configs"]:
        progress(f"cluster n={n} k={k}: build + link")
        with bc.EmulatedCluster(n, k, B) as c:
            good = bc.table_goodput(c, plan["link_seconds"])
            for m in plan["sizes"]:
                iters, warm = plan["iters"][str(m)], plan["warmup"]
                tmo = _timeout(n, m, B / 8 * 0.9, iters + warm)
                row = {"n": n, "k": k, "bytes": m, "goodput_Bps": good,
                       "t_opt_s": bc.t_opt(n, k, m, good), "t_ring_s": t_ring(n, m, good),
                       "network": c.network_info(), "idle_s": bc.idle_before_iteration(c)}
                for name in plan["settings"]:
                    for van in _vans_at(plan, m):
                        key = job_key(name, van)
                        progress(f"cluster n={n} k={k} {m >> 20} MiB: byteps {key}")
                        env = {**SETTINGS[name], **bv.job_env(van, netns=True)}
                        try:
                            st = bc.run_pushpull(c, m, iters=iters, warmup=warm, env=env,
                                                 timeout=tmo)
                            row[key] = {"time_s": st.seconds, "cpu_busy": st.cpu_busy}
                        except RuntimeError as exc:
                            log.warning("byteps %s n=%d k=%d M=%d failed: %s", key, n, k, m,
                                        exc)
                            row[key] = {"error": str(exc).splitlines()[0]}
                if plan["gloo"]:
                    progress(f"cluster n={n} k={k} {m >> 20} MiB: gloo")
                    try:
                        row["gloo"] = {"time_s": run_gloo(c, m, iters, warm, timeout=tmo)}
                    except RuntimeError as exc:
                        log.warning("gloo n=%d k=%d M=%d failed: %s", n, k, m, exc)
                        row["gloo"] = {"error": str(exc).splitlines()[0]}
                log.info("n=%d k=%d M=%d: %s", n, k, m, row)
                res["rows"].append(row)
    res["elapsed_s"] = time.monotonic() - t_start
    return res


# ---------------------------------------------------------------------------------- report --


def _t(row: dict, job: str) -> float:
    """A job's time, NaN when it failed or was not run."""
    v = row.get(job) or {}
    return float(v.get("time_s", math.nan))


def _f(x: float, fmt: str) -> str:
    return "failed" if not math.isfinite(x) else format(x, fmt)


def _ref_sizes(sizes: Sequence[int]) -> list[int]:
    """Sizes the targets are judged on: M >= 64 MiB, else the largest measured."""
    big = [s for s in sizes if s >= 64 << 20]
    return big or [max(sizes)]


def table1_targets(res: dict) -> list[dict]:
    from .report import fmt_size, target

    rows, plan = res.get("rows", []), res["plan"]
    out: list[dict] = []
    if not rows:
        return out
    tuned = "tuned" if "tuned" in plan["settings"] else plan["settings"][-1]
    for m in _ref_sizes(sorted({r["bytes"] for r in rows})):
        rs = [r for r in rows if r["bytes"] == m]
        ratios = [(r["t_opt_s"] / _t(r, tuned), r) for r in rs]
        worst, wr = min(ratios, key=lambda x: x[0] if math.isfinite(x[0]) else -1.0)
        worst = worst if math.isfinite(worst) else 0.0
        out.append(target(
            f"emulated cluster {fmt_size(m)}: push_pull ≤ 1.05 × t_opt, every (n,k) "
            f"({tuned} settings)", "t_opt / time ≥ 0.952",
            f"worst n={wr['n']},k={wr['k']}: {_f(_t(wr, tuned), '.3f')} s vs t_opt "
            f"{wr['t_opt_s']:.3f} s", worst, 1 / PUSHPULL_TARGET))
        if plan["gloo"]:
            sp = [(_t(r, "gloo") / _t(r, tuned) / theory_speedup(r["n"], r["k"]), r) for r in rs]
            worst, wr = min(sp, key=lambda x: x[0] if math.isfinite(x[0]) else -1.0)
            worst = worst if math.isfinite(worst) else 0.0
            out.append(target(
                f"emulated cluster {fmt_size(m)}: speed-up over gloo ≥ 0.95 × theory, every "
                f"(n,k) ({tuned})", "measured / theoretical speed-up ≥ 0.95",
                f"worst n={wr['n']},k={wr['k']}: "
                f"{_f(_t(wr, 'gloo') / _t(wr, tuned), '.2f')}× vs theory "
                f"{theory_speedup(wr['n'], wr['k']):.2f}×", worst, SPEEDUP_TARGET))
        if "default" in plan["settings"] and tuned != "default":
            worst = min((r["t_opt_s"] / _t(r, "default") for r in rs),
                        key=lambda x: x if math.isfinite(x) else -1.0)
            out.append(target(f"emulated cluster {fmt_size(m)}: push_pull with the default "
                              "settings vs t_opt (info)", "t_opt / time, worst (n,k)",
                              f"worst {_f(1 / worst if worst else math.nan, '.2f')} × t_opt",
                              worst if math.isfinite(worst) else 0.0, None))
    from .table1_vans import van_targets

    return out + van_targets(res)


def bench_markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    """The section (Markdown) and its targets."""
    from .report import _have_matplotlib, _table, fmt_size, network_sentence

    plan = res["plan"]
    md = ["## Emulated cluster: the architecture table (the paper's Table 1, measured)", ""]
    if res.get("skipped"):
        md.append(f"Not measured: {res['skipped']}.")
        return "\n".join(md), []
    rows = res["rows"]
    sets = plan["settings"]
    judged = "tuned" if "tuned" in sets else sets[-1]
    described = ["**default** = no `BYTEPS_*` knob set (the core's defaults, chosen by the "
                 "scheduling sweep below)"]
    idles = sorted({r["idle_s"] for r in rows if r.get("idle_s") is not None})
    idle = (f"every link was idle for {' / '.join(f'{x * 1e3:.1f}' for x in idles)} ms (twice "
            "its shaper bucket's refill time: each iteration starts with every bucket full, "
            "whichever direction carried the last bytes of the one before) and "
            if idles else "")
    described += [f"**{s}** = " + " ".join(f"`{k}={v}`" for k, v in SETTINGS[s].items())
                  for s in sets if s != "default" and s in SETTINGS]
    md.append(
        f"n worker hosts and k CPU-server hosts, each a network namespace behind one emulated "
        f"switch, every link shaped to B = {plan['bandwidth_mbit']:g} Mbit/s in both "
        "directions (the recommendation of `python -m benchmarks.cluster --probe`); "
        f"{network_sentence([r.get('network') for r in rows])}; one byteps worker process per "
        "worker host; the scheduler on w0. k = 0: one server colocated on every worker host; "
        "0 < k < n: a server on every CPU-server host and one colocated on every worker host "
        "(docs/architecture.md §4, what `t_opt` assumes); k ≥ n: CPU-server hosts only. "
        "`t_opt = 2n(n−1)M / ((n²+kn−2k)·B)` and gloo's ring time `2(n−1)M / (nB)` are "
        "computed with the **measured** TCP goodput of one link (w0 → s0, or w0 → w1 when "
        "k = 0) as B. gloo: `torch.distributed` all_reduce, one process per worker host, "
        "`MASTER_ADDR` = w0, `GLOO_SOCKET_IFNAME=eth0`, in the same cluster right after the "
        "byteps jobs. Times: median over the timed iterations "
        f"({', '.join(f'{fmt_size(int(s))}: {i}' for s, i in plan['iters'].items())}; after "
        f"{plan['warmup']} warm-up) of the slowest process; every iteration starts after "
        f"{idle}a barrier (a 4-byte push_pull / `dist.barrier()`), so checking the previous "
        "sum is not timed. byteps settings: "
        f"{'; '.join(described)}. Speed-up = gloo time / byteps time; theory = "
        f"`(n²+kn−2k)/n²`. Targets: byteps ≤ {PUSHPULL_TARGET:g} × `t_opt`, speed-up ≥ "
        f"{SPEEDUP_TARGET:g} × theory (✓ met, ✗ missed; judged on the {judged} settings). "
        f"{res.get('cores')} CPU "
        "cores run every process of the cluster; the machine is shared, so other load may "
        "inflate any figure.")
    if res.get("env_knobs"):
        md.append("")
        md.append("Note: the environment of this run set "
                  + ", ".join(f"`{k}={v}`" for k, v in res["env_knobs"].items())
                  + ", which the *default* columns inherited.")
    md.append("")
    for m in sorted({r["bytes"] for r in rows}):
        header = ["n", "k", "link goodput (Mbit/s)", "t_opt (s)"]
        for s in sets:
            header += [f"{s} (s)", f"{s} / t_opt"]
        if plan["gloo"]:
            header += ["gloo (s)", "gloo / ring time"]
            header += [f"speed-up {s}" for s in sets]
            header += ["theory", "speed-up / theory"]
        header += [f"CPU busy ({judged})", "targets"]
        body = []
        for r in (r for r in rows if r["bytes"] == m):
            cells = [str(r["n"]), str(r["k"]), f"{r['goodput_Bps'] * 8 / 1e6:.0f}",
                     f"{r['t_opt_s']:.3f}"]
            for s in sets:
                cells += [_f(_t(r, s), ".3f"), _f(_t(r, s) / r["t_opt_s"], ".2f")]
            tuned = "tuned" if "tuned" in sets else sets[-1]
            ok = [_t(r, tuned) <= PUSHPULL_TARGET * r["t_opt_s"]]
            if plan["gloo"]:
                th = theory_speedup(r["n"], r["k"])
                g = _t(r, "gloo")
                cells += [_f(g, ".3f"), _f(g / r["t_ring_s"], ".2f")]
                cells += [_f(g / _t(r, s), ".2f") + "×" for s in sets]
                sp = g / _t(r, tuned) / th
                cells += [f"{th:.2f}×", _f(sp, ".2f")]
                ok.append(sp >= SPEEDUP_TARGET)
            cpu = (r.get(tuned) or {}).get("cpu_busy")
            cells.append("n/a" if cpu is None else f"{100 * cpu:.0f} %")
            cells.append(" ".join("✓" if o else "✗" for o in ok))
            body.append(cells)
        md += [f"### M = {fmt_size(m)} float32", "", _table(header, body, "r" * len(header)), ""]
    errors = [(r, j, v["error"]) for r in rows for j, v in r.items()
              if isinstance(v, dict) and "error" in v]
    for r, j, e in errors:
        md.append(f"- n={r['n']}, k={r['k']}, {fmt_size(r['bytes'])}, {j}: failed: `{e}`")
    if errors:
        md.append("")
    from .table1_vans import van_section

    md += van_section(res)
    if img_dir is not None and _have_matplotlib() and rows:
        fname = plot_table1(res, img_dir)
        md += [f"![time / t_opt per (n,k)]({img_rel}/{fname})", ""]
    if res.get("elapsed_s"):
        md += [f"This section took {res['elapsed_s']:.0f} s.", ""]
    return "\n".join(md), table1_targets(res)


def plot_table1(res: dict, img_dir: str) -> str:
    """Bars of time / t_opt per (n,k), one panel per size; PNG file name."""
    from .report import fmt_size

    plt = pyplot(img_dir)
    plan, rows = res["plan"], res["rows"]
    sizes = sorted({r["bytes"] for r in rows})
    jobs = [job_key(s, v) for s in plan["settings"] for v in plan.get("vans", ["tcp"])]
    jobs += ["gloo"] if plan["gloo"] else []
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes) + 1, 4.2), dpi=110,
                             sharey=True, squeeze=False)
    width = 0.8 / len(jobs)
    for ax, m in zip(axes[0], sizes):
        rs = [r for r in rows if r["bytes"] == m]
        for j, job in enumerate(jobs):
            ys = [_t(r, job) / r["t_opt_s"] for r in rs]
            ys = [y if math.isfinite(y) else 0.0 for y in ys]
            label = f"byteps {job}" if job != "gloo" else "gloo all_reduce"
            ax.bar([i + j * width for i in range(len(rs))], ys, width, label=label)
        if plan["gloo"]:
            ax.plot([i + 0.4 - width / 2 for i in range(len(rs))],
                    [theory_speedup(r["n"], r["k"]) for r in rs], "k_", ms=18, mew=2,
                    label="ring theory / t_opt")
        ax.axhline(1.0, color="grey", lw=1)
        ax.axhline(PUSHPULL_TARGET, color="red", ls=":", lw=1, label="target 1.05")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rs))])
        ax.set_xticklabels([f"n={r['n']}\nk={r['k']}" for r in rs], fontsize=8)
        ax.set_title(f"M = {fmt_size(m)}")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("time / t_opt (measured goodput)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"Emulated cluster at {plan['bandwidth_mbit']:g} Mbit/s: time / t_opt")
    fig.tight_layout()
    return save_figure(fig, img_dir, "cluster_table1.png")


# ------------------------------------------------------------------------------------ main --


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.table1``: measure and print the section."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.table1", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="16 MiB, 2 iterations")
    p.add_argument("--sizes-mib", type=float, nargs="+", help="model sizes in MiB")
    p.add_argument("--configs", nargs="+", metavar="N,K", help="(n,k) pairs, e.g. 2,0 4,4")
    p.add_argument("--iters", type=int, help="timed iterations for every size")
    p.add_argument("--bandwidth", type=float, help=f"Mbit/s (default {BANDWIDTH_MBIT:g})")
    p.add_argument("--vans", help="comma-separated vans of the byteps jobs (benchmarks.vans; "
                   "default: tcp, plus ucx-tcp where byteps has UCX)")
    p.add_argument("--van-sizes-mib", type=float, nargs="+",
                   help="sizes at which the vans other than TCP run (default: up to 64 MiB)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--gloo-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.gloo_worker:
        return _gloo_main(*args.gloo_worker)
    sizes = [int(s * 2**20) for s in args.sizes_mib] if args.sizes_mib else None
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs \
        else None
    van_sizes = [int(s * 2**20) for s in args.van_sizes_mib] if args.van_sizes_mib else None
    plan = bench_settings(args.quick, sizes, configs, bandwidth_mbit=args.bandwidth,
                          vans=args.vans.split(",") if args.vans else None, van_sizes=van_sizes)
    if args.iters:
        plan["iters"] = {s: args.iters for s in plan["iters"]}
    return run_standalone(plan, bench_run, bench_markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
