"""The end-to-end training section of ``docs/performance.md``: the table, the plots (images/s
per configuration, the timeline of one traced iteration) and the targets of the results of
:func:`benchmarks.e2e.bench_run` (see that module for what is measured)."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile

from .e2e import BASELINE, BYTEPS_MODES, LABELS, TARGET_K0, TARGET_K4, TARGET_XBAR
from .linktest import t_opt
from .report import _have_matplotlib, _table, network_sentence, pyplot, save_figure, target

log = logging.getLogger(__name__)

TIMELINE_PNG = "e2e_timeline_{mode}_k{k}.png"
THROUGHPUT_PNG = "e2e_throughput.png"


def _ips(job: dict | None) -> float:
    return float((job or {}).get("images_per_s", math.nan))


def _f(x: float | None, fmt: str, missing: str = "n/a") -> str:
    return missing if x is None or not math.isfinite(x) else format(x, fmt)


def t_ring(n: int, model_bytes: float, bandwidth_Bps: float) -> float:
    """gloo's ring all_reduce time ``2(n-1)M / (nB)``, seconds."""
    return 2 * (n - 1) * model_bytes / (n * bandwidth_Bps) if n > 1 else 0.0


def _grad_bytes(res: dict) -> int | None:
    rows = [res.get("single") or {}] + [j for c in res.get("clusters", [])
                                        for j in c["jobs"].values()]
    return next((r["grad_bytes"] for r in rows if r.get("grad_bytes")), None)


def _baseline(res: dict) -> dict | None:
    return next((c["jobs"][BASELINE] for c in res.get("clusters", [])
                 if BASELINE in c["jobs"]), None)


def _shared(res: dict) -> dict | None:
    return next((c["jobs"]["shared"] for c in res.get("clusters", [])
                 if "shared" in c["jobs"]), None)


def _regime(res: dict, gb: int | None) -> str:
    """" (t_opt ... s against ... s of compute ...)" from the results, or ""."""
    shared = _shared(res) or {}
    bounds = [t_opt(res["plan"]["n"], c["k"], gb, c["goodput_Bps"])
              for c in res.get("clusters", [])] if gb else []
    if not bounds or "step_s" not in shared:
        return ""
    lo, hi = min(bounds), max(bounds)
    span = f"{lo:.2f}" + (f"–{hi:.2f}" if hi > lo + 0.005 else "")
    return (f" (t_opt {span} s per step, against {shared['step_s']:.2f} s of compute with "
            f"the {res['plan']['n']} workers sharing the cores)")


def _why(res: dict, k: int, mode: str) -> str:
    if mode in res.get("skipped_modes", {}):
        return f"not run: {res['skipped_modes'][mode]}"
    c = next((c for c in res.get("clusters", []) if c["k"] == k), None)
    job = (c or {}).get("jobs", {}).get(mode) or {}
    return f"failed: {job['error']}" if "error" in job else "not measured"


# ------------------------------------------------------------------------------- targets --


def targets(res: dict) -> list[dict]:
    """byteps vs torch DDP at k = 0 (≥ 1) and at the largest k (≥ 1.3 at n = k = 4, info at
    other (n, k), where the architecture's gain over the ring is smaller); CrossBarrier vs
    DistributedOptimizer at every k (≥ 1)."""
    if res.get("skipped"):
        return []
    n = res["plan"]["n"]
    base = _ips(_baseline(res))
    ks = [c["k"] for c in res["clusters"]]
    out = []
    for c in res["clusters"]:
        k = c["k"]
        if k == 0:
            thr = TARGET_K0
        elif k == max(ks):
            thr = TARGET_K4 if (n, k) == (4, 4) else None
        else:
            continue
        for mode in res["plan"]["modes"]:
            r = _ips(c["jobs"].get(mode)) / base
            measured = (f"{_f(_ips(c['jobs'].get(mode)), '.1f')} vs "
                        f"{_f(base, '.1f')} images/s")
            if not math.isfinite(r):
                measured = (_why(res, k, mode) if not math.isfinite(_ips(c["jobs"].get(mode)))
                            else f"torch DDP: {_why(res, ks[0], BASELINE)}")
            out.append(target(
                f"end-to-end training, n = {n}, k = {k}: {LABELS[mode]} "
                + (f"≥ {thr:g}× torch DDP" if thr else "vs torch DDP (info)"),
                f"images/s ratio ≥ {thr:g}" if thr else "images/s ratio",
                measured, r if math.isfinite(r) else 0.0, thr))
    if "xbar" in res["plan"]["modes"] and "optimizer" in res["plan"]["modes"]:
        for c in res["clusters"]:
            a, b = _ips(c["jobs"].get("xbar")), _ips(c["jobs"].get("optimizer"))
            r = a / b
            measured = (f"{_f(a, '.1f')} vs {_f(b, '.1f')} images/s" if math.isfinite(r)
                        else _why(res, c["k"], "xbar" if not math.isfinite(a) else "optimizer"))
            out.append(target(
                f"end-to-end training, n = {n}, k = {c['k']}: CrossBarrier ≥ "
                "DistributedOptimizer", f"images/s ratio ≥ {TARGET_XBAR:g}", measured,
                r if math.isfinite(r) else 0.0, TARGET_XBAR))
    return out


# -------------------------------------------------------------------------------- plots --


def plot_throughput(res: dict, img_dir: str) -> str | None:
    """Horizontal bars: images/s of every job, each labelled with its ratio to torch DDP,
    with torch DDP x 1 and x 1.3 (the targets) as lines; n x the lone worker and the
    no-communication job are in the legend (far off this scale where communication dominates)."""
    rows = []
    for c in res["clusters"]:
        for mode in [*BYTEPS_MODES, BASELINE]:
            v = _ips(c["jobs"].get(mode))
            if math.isfinite(v):
                label = LABELS[mode] + ("" if mode == BASELINE else f", k = {c['k']}")
                rows.append((label, v))
    if not rows:
        return None
    plt = pyplot(img_dir)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.6))
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [v for _, v in rows], color=["#d62728" if lb.startswith("torch") else "#1f77b4"
                                             for lb, _ in rows])
    ax.set_yticks(ys)
    ax.set_yticklabels([lb for lb, _ in rows], fontsize=8)
    base = _ips(_baseline(res))
    for y, (_, v) in zip(ys, rows):
        text = f"{v:.1f}" + (f" ({v / base:.2f}×)" if math.isfinite(base) else "")
        ax.text(v, y, " " + text, va="center", fontsize=7)
    if math.isfinite(base):
        ax.axvline(base, color="#d62728", ls="--", lw=1, label="torch DDP")
        ax.axvline(TARGET_K4 * base, color="k", ls=":", lw=1,
                   label=f"{TARGET_K4:g} × torch DDP (target at k = 4)")
    n = res["plan"]["n"]
    single, shared = _ips(res.get("single")), _ips(_shared(res))
    if math.isfinite(single):
        ax.plot([], [], " ", label=f"{n} × 1 worker alone: {n * single:.0f} images/s")
    if math.isfinite(shared):
        ax.plot([], [], " ", label=f"{n} workers, no communication: {shared:.0f} images/s")
    ax.set_xlim(0, 1.35 * max(max(v for _, v in rows), TARGET_K4 * base if
                              math.isfinite(base) else 0.0))
    ax.set_xlabel("images/s (all workers)")
    ax.set_title(f"Training on {n} worker hosts, {res['plan']['bandwidth_mbit']:g} Mbit/s links")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2,
              frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, img_dir, THROUGHPUT_PNG)


def trace_stats(tr: dict, step: int) -> dict | None:
    """From the traced job's Chrome traces (``push_pull`` events, µs): per worker host, the
    span of step ``step``'s push_pulls (first start to last end) and the gap before it (from
    the end of step ``step - 1``'s last push_pull), seconds; means over the hosts, or None
    when the traces lack the steps."""
    spans, gaps, firsts = [], [], []
    for text in (tr.get("files") or {}).values():
        if not isinstance(text, str):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        events = data.get("traceEvents", []) if isinstance(data, dict) else data
        by_step: dict = {}
        for e in events:
            if e.get("cat") == "push_pull" and e.get("ph") == "X":
                st = (e.get("args") or {}).get("step")
                lo, hi = by_step.get(st, (math.inf, -math.inf))
                by_step[st] = (min(lo, e["ts"]), max(hi, e["ts"] + e.get("dur", 0.0)))
        if step in by_step:
            firsts.append(by_step[step][0] / 1e6)
            spans.append((by_step[step][1] - by_step[step][0]) / 1e6)
            if step - 1 in by_step:
                gaps.append((by_step[step][0] - by_step[step - 1][1]) / 1e6)
    if not spans:
        return None
    return {"span_s": sum(spans) / len(spans),
            "gap_s": sum(gaps) / len(gaps) if gaps else None, "hosts": len(spans),
            "skew_s": max(firsts) - min(firsts)}


def traced_step(tr: dict) -> int:
    """The step the timeline shows: the traced job's last (warm-up and first use behind it)."""
    return tr.get("warmup", 0) + tr.get("steps", 1) - 1


def render_timeline(tr: dict, img_dir: str, title: str) -> str | None:
    """The traced iteration as a picture via ``benchmarks.timeline_plot.render`` (None when
    that module or the traces are missing; logged)."""
    files = {h: t for h, t in (tr.get("files") or {}).items() if isinstance(t, str)}
    if not files:
        return None
    try:
        from .timeline_plot import render
    except ImportError as exc:
        log.warning("timeline not rendered: %s", exc)
        return None
    os.makedirs(img_dir, exist_ok=True)
    out = os.path.join(img_dir, TIMELINE_PNG.format(mode=tr["mode"], k=tr["k"]))
    with tempfile.TemporaryDirectory(prefix="bps-e2e-render-") as tmp:
        paths = []
        for host, text in sorted(files.items()):
            path = os.path.join(tmp, f"{host}.json")
            with open(path, "w") as f:
                f.write(text)
            paths.append(path)
        try:
            render(paths, out, step=traced_step(tr), title=title)
        except Exception as exc:  # a renderer failure must not lose the section
            log.warning("timeline not rendered: %s: %s", type(exc).__name__, exc)
            return None
    return out if os.path.exists(out) else None


# ------------------------------------------------------------------------------ section --


def markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    """``(markdown, targets)`` of the end-to-end section."""
    plan = res["plan"]
    n, mbit = plan["n"], plan["bandwidth_mbit"]
    md = ["## End-to-end training: byteps against torch DDP", ""]
    if res.get("date"):
        md += [f"Measured {res['date']}" + (f" at commit {res['commit']}" if res.get("commit")
                                             else "")
               + " (this section alone: `python -m benchmarks --e2e`, or "
               "`python -m benchmarks.e2e`)"
               + (f". This section took {res['elapsed_s'] / 60:.1f} min." if res.get("elapsed_s")
                  else "."), ""]
    single = res.get("single") or {}
    gb = _grad_bytes(res)
    md.append(
        "Real training on the emulated cluster: every worker trains the benchmark's CNN "
        "(`benchmarks/e2e_worker.py`: a 3×3 stem and four residual stages of channels "
        f"{', '.join(map(str, plan['widths']))} at 32, 16, 8 and 4 pixels with BatchNorm, then "
        f"fully connected {plan['widths'][-1] * 16}→{plan['hidden']}→10"
        + (f"; {single.get('params', 0):,} parameters, {gb / 1e6:.1f} MB of float32 "
           "gradients per step" if gb and single.get("params") else "")
        + f") with SGD (momentum 0.9) on synthetic 3×32×32 images (fixed seeds, "
        f"{plan['batch']} per step per worker, a different stream per worker), a real forward "
        "and backward pass on the CPU with `torch.set_num_threads(1)`, no sleeping. "
        f"n = {n} worker hosts, each link shaped to {mbit:g} Mbit/s in both directions: "
        "the gradients' transfer at the physical optimum then takes several times a step's "
        f"compute{_regime(res, gb)}, the communication-bound regime the (n, k) architecture "
        "is about, while staying far below the rate at which this machine's CPU would bound "
        "push_pull (about 800 Mbit/s, the emulated cluster's probe). "
        f"**This machine has {res.get('cores', '?')} cores for all {n} worker hosts (and the "
        "servers)**: the workers' compute slows down as they share them, which the row "
        "*n workers, no communication* (every worker training alone, all at once) measures; "
        "scaling efficiency cannot exceed that row's images/s / (n × 1 worker alone).")
    md.append("")
    if res.get("skipped"):
        md += [f"Cluster not measured: {res['skipped']}.", ""]
    md.append(
        "Configurations: **byteps** `DistributedOptimizer`, `parallel.DistributedDataParallel` "
        "and `CrossBarrier`, one worker process per worker host, the scheduler on w0; "
        "k = 0: a server colocated on every worker host; k > 0: a server on each of the k "
        "CPU-server hosts only. **torch DDP**: `torch.nn.parallel.DistributedDataParallel`, "
        "gloo backend, `env://` rendezvous at w0's address, `GLOO_SOCKET_IFNAME=eth0`, on the "
        "same worker hosts and links (default buckets). Every setting is the library's "
        f"default. images/s: the sum over the workers of {plan['batch']} × {plan['steps']} "
        f"timed steps / the worker's time for them (after {plan['warmup']} warm-up; a step "
        "is forward, backward, communication and update, start to start); step: the slowest "
        "worker's mean step time; forward / backward / step: where a step's time goes, "
        "measured around `model(x)` and the loss, `loss.backward()` and `optimizer.step()` "
        "(mean over workers and steps: a DistributedOptimizer waits for the reductions in "
        "`step()`, torch DDP at the end of `backward()`, CrossBarrier in the forward pass, "
        "module by module, for the updates it needs)"
        + (f"; every compared configuration ran {plan['rounds']} times, interleaved, and its "
           "row is the mean" if plan.get("rounds", 1) > 1 else "")
        + ". Scaling efficiency = images/s(n) / (n × "
        "images/s(1 worker alone)"
        + (f", the best of {single['repeats']} runs" if single.get("repeats", 1) > 1 else "")
        + "). Every job checks that the workers end with bit-identical "
        f"parameters. {network_sentence([c.get('network') for c in res.get('clusters', [])])}.")
    md.append("")
    base = _ips(_baseline(res))
    s1 = _ips(single)
    header = ["configuration", "k", "images/s", "per worker", "step (s)",
              "forward / backward / step (s)", "comm. bound (s)", "step − bound (s)",
              "vs torch DDP", "scaling efficiency", "loss first → last", "identical"]
    body = []

    def row(label: str, k: str, job: dict | None, bound: float | None, workers: int,
            compare: bool = True) -> None:
        job = job or {}
        if "error" in job or "images_per_s" not in job:
            body.append([label, k, "failed" if "error" in job else "not run"] + [""] * 9)
            return
        v = job["images_per_s"]
        vs = (_f(v / base, ".2f") + ("×" if math.isfinite(v / base) else "")) if compare else "—"
        body.append([
            label, k, f"{v:.1f}", f"{v / workers:.1f}", f"{job['step_s']:.3f}",
            " / ".join(f"{x:.3f}" for x in job["phases_s"]) if job.get("phases_s") else "—",
            _f(bound, ".3f", "—"),
            _f(None if bound is None else job["step_s"] - bound, ".3f", "—"), vs,
            _f(v / (workers * s1), ".2f"), f"{job['loss_first']:.2f} → {job['loss_last']:.2f}",
            "yes" if job.get("identical") else "**no**"])

    row(LABELS["local"], "—", single, None, 1, compare=False)
    good = {}
    for c in res.get("clusters", []):
        k = c["k"]
        good[k] = c["goodput_Bps"]
        if "shared" in c["jobs"]:
            row(LABELS["shared"], "—", c["jobs"]["shared"], None, n, compare=False)
        if BASELINE in c["jobs"]:
            row(LABELS[BASELINE], "—", c["jobs"][BASELINE],
                t_ring(n, gb, c["goodput_Bps"]) if gb else None, n)
        for mode in plan["modes"]:
            if mode in c["jobs"]:
                row(LABELS[mode], str(k), c["jobs"][mode],
                    t_opt(n, k, gb, c["goodput_Bps"]) if gb else None, n)
            else:
                body.append([LABELS[mode], str(k), _why(res, k, mode)] + [""] * 9)
        if "autotune" in c["jobs"]:
            row(LABELS["autotune"], str(k), c["jobs"]["autotune"],
                t_opt(n, k, gb, c["goodput_Bps"]) if gb else None, n)
    md += [f"### n = {n} worker hosts, {mbit:g} Mbit/s links", "",
           _table(header, body, "llrrrrrrrrrl"), ""]
    if good:
        md.append(
            "comm. bound: the gradients' transfer time at the measured link goodput ("
            + ", ".join(f"k = {k}: {g * 8 / 1e6:.0f} Mbit/s" for k, g in good.items())
            + "): `t_opt = 2n(n−1)M / ((n²+kn−2k)·B)` for byteps, the ring's "
            "`2(n−1)M / (nB)` for gloo; a step cannot be shorter unless the transfer overlaps "
            "the compute. step − bound: what the step holds beyond that (compute the "
            "transfer does not overlap, and communication slower than the bound). "
            "Every timed step runs from its start to the start of the next, and one untimed "
            "step follows the timed ones, so each mode's timed window holds one reduction per "
            "step (CrossBarrier's final wait for the updates in flight, once per training, "
            "falls outside it).")
        md.append("")
    md += autotune_lines(res)
    if res.get("skipped_modes"):
        md += ["Not run: " + "; ".join(f"{LABELS[m]}: {why}" for m, why in
                                       res["skipped_modes"].items()) + ".", ""]
    errors = [f"- k = {c['k']}, {LABELS.get(m, m)}: `{j['error']}`"
              for c in res.get("clusters", []) for m, j in c["jobs"].items() if "error" in j]
    if "error" in single:
        errors.append(f"- {LABELS['local']}: `{single['error']}`")
    if errors:
        md += ["Failures:", "", *errors, ""]
    if img_dir and _have_matplotlib() and res.get("clusters"):
        png = plot_throughput(res, img_dir)
        if png:
            md += [f"![images/s per configuration]({img_rel}/{os.path.basename(png)})", ""]
    for tr in res.get("traces") or []:
        tc = next((c for c in res.get("clusters", []) if c["k"] == tr.get("k")), None)
        bound = t_opt(n, tr["k"], gb, tc["goodput_Bps"]) if gb and tc else None
        md += timeline_section(tr, n, mbit, img_dir, img_rel, bound)
    return "\n".join(md), targets(res)


def autotune_lines(res: dict) -> list[str]:
    """What the auto-tuned job tried and chose (its rank 0's ``autotune_status()``)."""
    at = (res["plan"].get("autotune") or {})
    for c in res.get("clusters", []):
        job = c["jobs"].get("autotune") or {}
        st = job.get("autotune")
        if not st:
            continue
        ch = st.get("choice") or {}
        trials = ", ".join(f"{t['partition_bytes'] // 1024} KiB/{t['credit']}: "
                           f"{t.get('iteration_s', float('nan')):.3f} s"
                           for t in st.get("trials", []))
        return [f"{LABELS['autotune']} (k = {c['k']}): the same job with "
                f"`BYTEPS_AUTOTUNE=1` and nothing else set; the tuner ran during the first "
                f"{at.get('warmup', '?')} (untimed) steps and chose partitions of "
                f"{ch.get('partition_bytes', 0) // 1024} KiB and credit {ch.get('credit', '?')} "
                f"(defaults: 256 KiB, 4). Trials (partition/credit: iteration): {trials}.", ""]
    return []


def timeline_section(tr: dict, n: int, mbit: float, img_dir: str | None,
                     img_rel: str, bound: float | None = None) -> list[str]:
    label = f"{LABELS.get(tr['mode'], tr['mode'])}, n = {n}, k = {tr['k']}"
    md = [f"### Timeline of one iteration: {label}", ""]
    if tr.get("skipped"):
        return md + [f"Not traced: {tr['skipped']}.", ""]
    job = tr.get("job") or {}
    if "error" in job:
        return md + [f"The traced job failed: `{job['error']}`.", ""]
    md.append(
        f"The same job run once more with `BYTEPS_TRACE_ON=1` ({tr['warmup']} warm-up + "
        f"{tr['steps']} steps; tracing is not part of the timed jobs above), every worker "
        "host writing its own Chrome trace (`comm.json`, open it in `chrome://tracing` or "
        "Perfetto); the picture shows the last traced step"
        + (f" (that job: {job['images_per_s']:.1f} images/s)" if "images_per_s" in job else "")
        + ".")
    st = trace_stats(tr, traced_step(tr))
    if st:
        step_s = (job.get("step_s") if "images_per_s" in job else None)
        md[-1] += (
            f" In that step, communication (a worker's first push to its last pull, mean over "
            f"the {st['hosts']} worker hosts) took {st['span_s']:.3f} s"
            + (f" against t_opt = {bound:.3f} s" if bound else "")
            + (f", and no push_pull was in flight for {st['gap_s']:.3f} s before it (the "
               "update, the forward pass and the backward pass up to the first gradient)"
               if st.get("gap_s") is not None else "")
            + (f"; the job's step: {step_s:.3f} s" if step_s else "")
            + (f". The workers' first pushes of that step were up to {st['skew_s']:.3f} s "
               "apart (the workers share the cores, so they drift out of phase, and a "
               "partition's sum waits for the last worker's push)" if st["hosts"] > 1 else "")
            + ".")
    md.append("")
    png = render_timeline(tr, img_dir, f"{label}, {mbit:g} Mbit/s") if img_dir else None
    if png:
        md += [f"![timeline of one iteration]({img_rel}/{os.path.basename(png)})", ""]
    elif not any(isinstance(t, str) for t in (tr.get("files") or {}).values()):
        md += ["No trace files were written (this build's byteps has no tracing).", ""]
    elif img_dir is None:
        md += ["Not drawn in a run without an image directory (the results keep the "
               "traces; `--from-json` draws them).", ""]
    else:
        md += ["Not rendered here (`benchmarks/timeline_plot.py` missing or failed; the "
               "results keep the traces).", ""]
    return md

