"""The compression section of ``docs/performance.md``: tables and targets of the results of
:func:`benchmarks.compression.bench_run` (see that module for what is measured)."""

from __future__ import annotations

import math

from .compression import (
    COMPRESSORS,
    LABELS,
    SPEEDUP_TARGETS,
    THROUGHPUT_TARGETS,
    TRAIN_MODELS,
)
from .report import _table, fmt_size, network_sentence, target

#: Training: the compressed run's accuracy may be this much (a fraction) below uncompressed.
ACCURACY_POINTS = 0.01


def _t(job: dict | None) -> float:
    return float((job or {}).get("time_s", math.nan))


def _f(x: float | None, fmt: str, missing: str = "n/a") -> str:
    return missing if x is None or not math.isfinite(x) else format(x, fmt)


def _label(name: str) -> str:
    base, _, ef = name.partition("+")
    return LABELS.get(base, base) + (" + EF" if ef else "")


def _kw(name: str) -> str:
    from .compression import core_kwargs

    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in core_kwargs(name).items())


# ----------------------------------------------------------------------------------- cluster --


def cluster_targets(part: dict) -> list[dict]:
    rows = part.get("rows") or []
    out = []
    names = [c for c in COMPRESSORS if any(c in r["jobs"] for r in rows)]
    for name in names:
        sp = [(_t(r["jobs"].get("none")) / _t(r["jobs"].get(name)), r) for r in rows]
        worst, wr = min(sp, key=lambda x: x[0] if math.isfinite(x[0]) else -1.0)
        worst = worst if math.isfinite(worst) else 0.0
        thr = SPEEDUP_TARGETS.get(name)
        m = fmt_size(wr["bytes"])
        out.append(target(
            f"compression on a 100 Mbit/s cluster, {m}: {_label(name)} ≥ {thr:g}× faster than "
            "uncompressed, every (n,k)" if thr else
            f"compression on a 100 Mbit/s cluster, {m}: {_label(name)} vs uncompressed (info)",
            f"uncompressed / {name} ≥ {thr:g}" if thr else "speed-up, worst (n,k)",
            f"worst n={wr['n']},k={wr['k']}: {_f(_t(wr['jobs'].get(name)), '.3f', 'failed')} s "
            f"vs {_f(_t(wr['jobs'].get('none')), '.3f', 'failed')} s", worst, thr))
    return out


def _mb(x: float | None) -> str:
    return _f(None if x is None else x / 1e6, ".2f")


def cluster_section(res: dict) -> list[str]:
    plan, part = res["plan"], res["cluster"]
    md = [f"### push_pull of {fmt_size(plan['bytes'])} float32 on a "
          f"{plan['bandwidth_mbit']:g} Mbit/s emulated cluster", ""]
    if part.get("skipped"):
        return md + [f"Not measured: {part['skipped']}.", ""]
    rows = part["rows"]
    md.append(
        "The emulated cluster of the architecture table (n worker hosts, k CPU-server hosts, "
        f"network namespaces behind one switch) with every link shaped to "
        f"{plan['bandwidth_mbit']:g} Mbit/s; {network_sentence([r.get('network') for r in rows])}"
        "; one byteps worker per worker host, the scheduler on w0, default `BYTEPS_*` "
        f"settings and `BYTEPS_MIN_COMPRESS_BYTES={plan['min_compress_bytes']}`. Each worker "
        "declares its tensor with the compressor (`byteps.basics.declare(name, compression="
        "kwargs)`) and sends standard-normal values; the uncompressed job sends exact integers "
        "and checks every sum. Time: median over the timed iterations (uncompressed: "
        f"{plan['iters']['none']}, compressed: {plan['iters']['compressed']}; after "
        f"{plan['warmup']} warm-up) of the slowest worker, each iteration after a barrier. "
        "Speed-up = uncompressed time / compressed time in the same cluster. Sent / received: "
        "the bytes of every frame (headers included) a worker host's `eth0` sent and received "
        "per push_pull, mean over the worker hosts. Network-bound time = `t_opt` of the "
        "uncompressed tensor (measured goodput) × sent bytes / uncompressed sent bytes: what "
        "the compressed job would take if only the links limited it. Worker CPU: the CPU "
        "time of a worker process (all its threads) during its push_pull, mean over the "
        "workers; servers' CPU: the CPU time of all server processes per push_pull over the "
        "timed iterations (`/proc/<pid>/stat`, 10 ms ticks); CPU-bound time = (n × worker "
        f"CPU + servers' CPU) / {res.get('cores')} cores: what the job would take if only the "
        "machine's cores limited it, since every process of the emulated cluster shares them "
        "(a real cluster gives every host its own). CPU busy: the whole machine during the "
        "timed iterations.")
    md.append("")
    md.append("Compressors (core kwargs): " + "; ".join(
        f"**{LABELS[c]}** = `{_kw(c)}`" for c in plan["compressors"]) + ".")
    md.append("")
    header = ["n", "k", "link goodput (Mbit/s)", "compressor", "time (s)", "speed-up", "target",
              "sent / worker (MB)", "received / worker (MB)", "network-bound time (s)",
              "worker CPU (ms)", "servers' CPU (ms)", "CPU-bound time (s)", "CPU busy"]
    cores = res.get("cores") or 1
    body = []
    for r in rows:
        none = r["jobs"].get("none") or {}
        for name in ["none", *plan["compressors"]]:
            j = r["jobs"].get(name) or {}
            t = _t(j)
            sp = _t(none) / t
            thr = SPEEDUP_TARGETS.get(name)
            share = (j.get("tx_bytes") / none["tx_bytes"]
                     if j.get("tx_bytes") and none.get("tx_bytes") else None)
            bound = r["t_opt_s"] * share if share is not None else None
            cpu = j.get("cpu_busy")
            wc, sc = j.get("worker_cpu_s"), j.get("server_cpu_s")
            cpu_bound = (r["n"] * wc + sc) / cores if wc is not None and sc is not None \
                else None
            body.append([
                str(r["n"]), str(r["k"]), f"{r['goodput_Bps'] * 8 / 1e6:.0f}",
                "uncompressed" if name == "none" else LABELS[name], _f(t, ".3f", "failed"),
                _f(sp, ".2f") + ("×" if math.isfinite(sp) else ""),
                "—" if thr is None else (f"≥ {thr:g}× " + ("✓" if sp >= thr else "✗")),
                _mb(j.get("tx_bytes")), _mb(j.get("rx_bytes")), _f(bound, ".3f"),
                _f(None if wc is None else wc * 1e3, ".0f"),
                _f(None if sc is None else sc * 1e3, ".0f"), _f(cpu_bound, ".3f"),
                "n/a" if cpu is None else f"{100 * cpu:.0f} %"])
    md += [_table(header, body, "rrrlrrl" + "r" * 7), ""]
    md.append("`t_opt` of the uncompressed tensor: " + "; ".join(
        f"n={r['n']},k={r['k']}: {r['t_opt_s']:.3f} s" for r in rows) + ".")
    md.append("")
    errors = [f"- n={r['n']}, k={r['k']}, {name}: failed: `{j['error']}`"
              for r in rows for name, j in r["jobs"].items() if "error" in j]
    return md + (errors + [""] if errors else [])


# -------------------------------------------------------------------------------- throughput --


def throughput_targets(res: dict) -> list[dict]:
    part = res["throughput"]
    if part.get("skipped"):
        return []
    bw = part["membw"]["best"]
    big = str(res["plan"]["tp_bytes"])
    out = []
    for name, thr in THROUGHPUT_TARGETS.items():
        row = (part["rows"].get(name) or {}).get(big) or {}
        for op in ("compress", "decompress"):
            v = row.get(op, math.nan)
            out.append(target(
                f"{_label(name)} {op} ≥ {100 * thr:.0f} % of memory bandwidth (float32, "
                f"{fmt_size(int(big))}, 1 thread)", f"{op} GB/s / membw ≥ {thr:g}",
                f"{_f(v, '.2f', 'failed')} vs {bw:.1f} GB/s", v / bw if math.isfinite(v) else 0.0,
                thr))
    return out


def throughput_section(res: dict) -> list[str]:
    plan, part = res["plan"], res["throughput"]
    md = ["### Compressor throughput", ""]
    bw = part["membw"]
    big, small = plan["tp_bytes"], plan["tp_partition_bytes"]
    sizes = [big] + ([small] if small != big else [])
    md.append(
        "`byteps._core_testing.compressor_throughput(kwargs, \"float32\", count, seconds)`: one "
        "worker-side compressor chain of `count` elements on one thread, standard-normal "
        f"data, {plan['tp_seconds']:g} s in all (half compressing, half decompressing); GB/s "
        f"of raw float32 input (4 bytes per element) per second, at {fmt_size(big)} and at "
        "one partition of the core's "
        f"default size ({fmt_size(small)}, `BYTEPS_PARTITION_BYTES`), where µs per partition = "
        "the time to compress (or decompress) one partition. Memory bandwidth probe "
        f"(`benchmarks.sumbench.memory_bandwidth`, {fmt_size(plan['probe_bytes'])}, 1 thread, "
        f"2 streams): copy {bw['copy']:.1f}, in-place scale {bw['scale']:.1f} → "
        f"**{bw['best']:.1f} GB/s** (bytes read + written; the compressors' GB/s count input "
        "bytes only). EF = error feedback (`ef_type=vanilla`).")
    md.append("")
    header = ["compressor", "kwargs"]
    for s in sizes:
        header += [f"{fmt_size(s)} compress GB/s", f"{fmt_size(s)} decompress GB/s"]
    header += ["compress / membw", "decompress / membw"]
    if small != big:
        header += [f"µs per {fmt_size(small)} compress", f"µs per {fmt_size(small)} decompress"]
    body = []
    for name, row in part["rows"].items():
        cells = [_label(name), f"`{_kw(name)}`"]
        for s in sizes:
            v = row.get(str(s)) or {}
            cells += [_f(v.get("compress"), ".2f", "failed"),
                      _f(v.get("decompress"), ".2f", "failed")]
        v = row.get(str(big)) or {}
        cells += [_f(v.get(op, math.nan) / bw["best"] * 100, ".0f") + " %"
                  for op in ("compress", "decompress")]
        if small != big:
            v = row.get(str(small)) or {}
            cells += [_f(small / v[op] / 1e3 if v.get(op) else None, ".0f")
                      for op in ("compress", "decompress")]
        body.append(cells)
    md += [_table(header, body, "ll" + "r" * (len(header) - 2)), ""]
    errors = [f"- {name}, {fmt_size(int(s))}: failed: `{v['error']}`"
              for name, row in part["rows"].items() for s, v in row.items() if "error" in v]
    return md + (errors + [""] if errors else [])


# ---------------------------------------------------------------------------------- training --


def _pairs(part: dict):
    """(model, uncompressed row, compressed row) for every model with both runs."""
    rows = part.get("rows") or []
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {r["variant"]: r for r in rows if r["model"] == model}
        yield model, by.get("none") or {}, by.get("onebit+ef") or {}


def training_targets(res: dict) -> list[dict]:
    part = res["training"]
    if part.get("skipped"):
        return []
    out = []
    for model, u, c in _pairs(part):
        au, ac = u.get("accuracy", math.nan), c.get("accuracy", math.nan)
        ratio = (ac + ACCURACY_POINTS) / au
        out.append(target(
            f"training {model}: onebit + EF test accuracy within 1 point of uncompressed "
            f"(100 Mbit/s, n={res['plan']['train_config'][0]})",
            "(accuracy + 0.01) / uncompressed ≥ 1",
            f"{_f(ac, '.3f', 'failed')} vs {_f(au, '.3f', 'failed')}",
            ratio if math.isfinite(ratio) else 0.0, 1.0))
        su, sc = u.get("step_s", math.nan), c.get("step_s", math.nan)
        out.append(target(f"training {model}: time per step, uncompressed / onebit + EF (info)",
                          "the gain", f"{_f(sc * 1e3, '.1f', 'failed')} ms vs "
                          f"{_f(su * 1e3, '.1f', 'failed')} ms",
                          su / sc if math.isfinite(su / sc) else 0.0, None))
    return out


def training_section(res: dict) -> list[str]:
    plan, part = res["plan"], res["training"]
    n, k = plan["train_config"]
    md = [f"### Training on a {plan['bandwidth_mbit']:g} Mbit/s cluster (n = {n}, k = {k})", ""]
    if part.get("skipped"):
        return md + [f"Not measured: {part['skipped']}.", ""]
    comp = ", ".join(f'"{k}": {str(v).lower() if isinstance(v, bool) else repr(v)}'
                     for k, v in plan["train_compression"].items()).replace("'", '"')
    md.append(
        f"Each model trained on sklearn's digits (1347 training, 450 test images; every worker "
        f"its shard) by {n} worker hosts with {k} server hosts, links shaped to "
        f"{plan['bandwidth_mbit']:g} Mbit/s ({network_sentence([part.get('network')])}), "
        "once uncompressed and once with the torch adapter's "
        f"`DistributedOptimizer(..., compression_params={{{comp}}})` (onebit with error "
        "feedback, the same seeds and hyper-parameters). Models: " + "; ".join(
            f"**{m}** = {TRAIN_MODELS[m]['label']}" for m in plan["train_models"]) +
        ". Accuracy: the whole test set after the last epoch; time per step: median over the "
        "steps after the first epoch (zero_grad to the end of step, rank 0); job: the whole "
        "byteps job (start of Python and torch in every process included).")
    md.append("")
    header = ["model", "compression", "epochs", "BYTEPS_MIN_COMPRESS_BYTES", "test accuracy",
              "time per step (ms)", "speed-up per step", "job (s)"]
    body = []
    for model, u, c in _pairs(part):
        for r in (u, c):
            if not r:
                continue
            sp = u.get("step_s", math.nan) / r.get("step_s", math.nan)
            body.append([model, "none" if r["variant"] == "none" else "onebit + EF",
                         str(r["epochs"]), str(r["min_compress_bytes"]),
                         _f(r.get("accuracy"), ".3f", "failed"),
                         _f(r.get("step_s", math.nan) * 1e3, ".1f", "failed"),
                         _f(sp, ".2f") + ("×" if math.isfinite(sp) else ""),
                         _f(r.get("job_s"), ".0f")])
    md += [_table(header, body, "llrrrrrr"), ""]
    errors = [f"- {r['model']} {r['variant']}: failed: `{r['error']}`"
              for r in part.get("rows") or [] if "error" in r]
    return md + (errors + [""] if errors else [])


# ------------------------------------------------------------------------------------- page --


def markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    """The section (Markdown) and its targets."""
    md = ["## Gradient compression", ""]
    when = f"Measured {res.get('date', '?')}" + (
        f" at commit {res['commit']}" if res.get("commit") else "") + (
        " (with uncommitted core sources in the tree)" if res.get("dirty") else "")
    md.append(
        f"{when} (this section alone: `python -m benchmarks --compression`, or `python -m "
        "benchmarks.compression`). Two-level compression (docs/compression.md): each worker "
        "compresses every partition of a declared tensor before its push, the server "
        "decompresses the pushes, sums, compresses the sum, and the workers decompress what "
        "they pull." + (f" This section took {res['elapsed_s']:.0f} s." if res.get("elapsed_s")
                        else ""))
    md.append("")
    targets: list[dict] = []
    if "cluster" in res:
        md += cluster_section(res)
        targets += cluster_targets(res["cluster"])
    if "throughput" in res:
        md += throughput_section(res)
        targets += throughput_targets(res)
    if "training" in res:
        md += training_section(res)
        targets += training_targets(res)
    return "\n".join(md), targets
