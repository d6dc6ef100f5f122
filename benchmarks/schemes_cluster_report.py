"""The report of :mod:`benchmarks.schemes_cluster`: the measured and simulated times side by
side, what ``auto`` chose, the cost model's parameters, the targets."""

from __future__ import annotations

import math

from .report import _table, fmt_size, network_sentence, target
from .schemes_cluster import FIXED, SIZE_TOLERANCE, round_counts


def _ms(seconds) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _cell(st: dict | None) -> str:
    """``measured / simulated (simulated ÷ measured)``, milliseconds."""
    if not st:
        return "–"
    if "time_s" not in st:
        return "failed"
    sim = st.get("sim_s")
    if sim is None:
        return f"{_ms(st['time_s'])} / –"
    return f"{_ms(st['time_s'])} / {_ms(sim)} ({sim / st['time_s']:.2f})"


def best_fixed(row: dict, pick) -> tuple:
    """(scheme, stats) of the fastest fixed scheme by ``pick(job) -> stats``; (None, None)."""
    best = (None, None)
    for s in FIXED:
        job = row["jobs"].get(s)
        st = pick(job) if job and "error" not in job else None
        if st and "time_s" in st and (best[1] is None or st["time_s"] < best[1]["time_s"]):
            best = (s, st)
    return best


def size_rows(row: dict, sizes) -> list:
    """Per size: {size, best scheme, best stats, auto stats, chosen, ratio best / auto,
    scatter, threshold}: 1 / 1.05, or where auto chose the best fixed scheme itself in every
    round (the jobs run the same program) 1 / (1 + the larger of the two rows' scatters) if
    lower. ``chosen``: the scheme auto chose, or ``"tree 4, ps 2"`` where its rounds (each
    measuring the cost model again) chose differently."""
    auto = row["jobs"].get("auto", {})
    out = []
    for s in sizes:
        name, st = best_fixed(row, lambda j, s=s: j["sizes"].get(str(s)))
        a = auto.get("sizes", {}).get(str(s)) if "error" not in auto else None
        ratio = st["time_s"] / a["time_s"] if st and a else float("nan")
        picks = [c[str(s)] for c in auto.get("choices_rounds", []) if str(s) in c] or \
            [auto.get("choices", {}).get(str(s))]
        chosen = picks[0] if len(set(picks)) == 1 else ", ".join(
            f"{c} {picks.count(c)}" for c in sorted(set(picks), key=picks.index))
        scatter = max(st["scatter"], a["scatter"]) if st and a else 0.0
        same = set(picks) == {name}
        out.append({"size": s, "best": name, "best_st": st, "auto": a, "chosen": chosen,
                    "ratio": ratio, "same": same, "scatter": scatter,
                    "threshold": min(1 / SIZE_TOLERANCE, 1 / (1 + scatter)) if same
                    else 1 / SIZE_TOLERANCE})
    return out


#: the cost model's profile costs of auto and of the best fixed scheme this close: "physics
#: makes them equal", and the profile's target allows the runs' scatter
EQUAL_COST = 0.02


def model_profile_costs(model: dict | None, tensors) -> dict:
    """{scheme or "auto": seconds} of the profile's bytes by the cost model (its
    ``as_dict()``): each tensor's cost without its α terms (every tensor of the profile is in
    flight at once, so the messages' latencies overlap the other tensors' bytes; the busiest
    link's bytes and the sums remain); ``auto``: each tensor with the scheme the model chooses.
    {} without a model."""
    if not model:
        return {}
    from byteps.sync.cost_model import CostModel

    m = CostModel(model["alpha"], model["beta"], model["gamma"], model["workers"],
                  model["servers"], model["tree_width"], model["hips_group"],
                  schemes=tuple(model["schemes"]),
                  partition_bound=model.get("partition_bound", 0),
                  local_size=model.get("local_size", 1), all_servers=model.get("all_servers", 0),
                  alpha_mesh=model.get("alpha_mesh"), latency=model.get("latency", {}))
    lat = {s: m.latency_seconds(s) for s in m.schemes}

    def bw(s, nb):
        return m.cost(s, nb) - lat[s]

    out = {s: sum(bw(s, int(nb)) for _, nb in tensors) for s in m.schemes}
    out["auto"] = sum(bw(m.choose(int(nb)), int(nb)) for _, nb in tensors)
    return out


def profile_row(row: dict, tensors=()) -> dict:
    """The profile: best fixed scheme, auto, ratio best / auto, the runs' scatter and the
    threshold: 1.0, or 1 / (1 + scatter) where the cost model predicts auto's bytes within
    :data:`EQUAL_COST` of the best fixed scheme's (:func:`model_profile_costs`: physics makes
    them equal)."""
    name, st = best_fixed(row, lambda j: j.get("profile"))
    auto = row["jobs"].get("auto", {})
    a = auto.get("profile") if "error" not in auto else None
    ratio = st["time_s"] / a["time_s"] if st and a else float("nan")
    mix = auto.get("profile_choices", {})
    scatter = max(st["scatter"], a["scatter"]) if st and a else 0.0
    pred = model_profile_costs(auto.get("model"), tensors) if name else {}
    same = bool(pred) and pred["auto"] >= pred[name] * (1 - EQUAL_COST)
    return {"best": name, "best_st": st, "auto": a, "mix": mix, "ratio": ratio,
            "same": same, "scatter": scatter, "predicted": pred,
            "threshold": 1.0 / (1.0 + scatter) if same else 1.0}


def _model_lines(row: dict) -> list:
    m = row["jobs"].get("auto", {}).get("model")
    if not m:
        return []
    ivs = ", ".join(f"{iv['scheme']} from {fmt_size(iv['from_bytes'])}" for iv in m["intervals"])
    t = m.get("timings", {})
    same = row["jobs"]["auto"].get("same_on_every_rank")
    mesh = f" (worker mesh: {m['alpha_mesh'] * 1e6:.3g} µs)" if m.get("alpha_mesh") is not None \
        else ""
    if m.get("latency"):
        mesh += "; each scheme's tiny push_pull (median, its α term): " + ", ".join(
            f"{s} {x * 1e3:.3f} ms" for s, x in m["latency"].items())
    return [f"* k = {row['k']}: α = {m['alpha'] * 1e6:.3g} µs{mesh}, β = {m['beta'] * 1e9:.3g} ns/B "
            f"({1 / m['beta'] / 1e6:.3g} MB/s; the link's goodput: "
            f"{row['goodput_Bps'] / 1e6:.3g} MB/s), γ = {m['gamma'] * 1e9:.3g} ns/B, "
            f"k = {m['servers']} CPU-only server(s) ({m.get('servers_source', '?')}), tree "
            f"width {m['tree_width']}, HiPS group {m['hips_group']}, choosing among "
            f"{', '.join(m['schemes'])}: {ivs} (tiny push_pull {t.get('tiny_s', 0) * 1e3:.2f} "
            f"ms, {fmt_size(int(t.get('large_bytes', 0)))} {t.get('large_s', 0) * 1e3:.2f} ms; "
            f"{'the same on every rank' if same else '**ranks differ**'})"]


def _rounds(plan: dict) -> str:
    """What was pooled: the rounds of jobs (the schemes in turn) and the timed iterations per
    size."""

    iters = ", ".join(f"{fmt_size(int(s))} {i}" for s, i in plan["iters"].items())
    full, small = round_counts(plan)
    text = (f" Every scheme's job ran {full} time(s), the schemes in turn; the "
            f"median pools every round's timed iterations ({iters} per round)")
    if small:
        text += (f", and sizes up to {fmt_size(plan['small_max_bytes'])} pool "
                 f"{small} more rounds of jobs that time only them (a job's "
                 "median at 4 KiB moves 20–40 % between jobs on a shared 2-core host, as much "
                 "as the schemes differ; each `auto` job measures its cost model again)")
    return text + "."


def markdown(res: dict):
    """(Markdown section, targets)."""
    plan = res["plan"]
    md = ["## The synchronisation schemes on the emulated cluster", ""]
    if res.get("skipped") or plan.get("unavailable"):
        return "\n".join(md + [f"Not measured: {res.get('skipped') or plan['unavailable']}."]), []
    n = plan["n"]
    tensors = plan["profile"]["tensors"]
    md += [f"n = {n} worker hosts at {plan['bandwidth_mbit']:g} Mbit/s per link; k = 0: a "
           "server colocated on every worker host; k > 0: k CPU-server hosts and no server on "
           f"the workers. One job per `BYTEPS_SYNC` ({res.get('cores', '?')} CPU cores for "
           "every process of the cluster). Cells: **measured / simulated** milliseconds "
           "(simulated ÷ measured): the median over the timed iterations of the slowest "
           "worker's push_pull of one float32 tensor (after a warm-up, every sum checked), and "
           "`byteps.sim` for the same configuration with the link goodput measured in the "
           "same cluster; `auto`'s simulated time is that of the scheme it chose." + _rounds(plan),
           "", _capital(network_sentence([r.get("network") for r in res["rows"]])) + ".", ""]
    header = ["k", "size", *[f"{s}" for s in FIXED], "auto", "auto chose",
              "best fixed / auto"]
    rows, targets = [], []
    for row in res["rows"]:
        for sr in size_rows(row, plan["sizes"]):
            rows.append([str(row["k"]), fmt_size(sr["size"])] +
                        [_cell(_size_st(row, s, sr["size"])) for s in FIXED] +
                        [_cell(sr["auto"]), sr["chosen"] or "–",
                         f"{sr['ratio']:.2f} (vs {sr['best']}; scatter "
                         f"{sr['scatter'] * 100:.0f} %)" if sr["best"] else "–"])
    md += [_table(header, rows), ""]
    prof_rows = []
    for row in res["rows"]:
        pr = profile_row(row, tensors)
        mix = ", ".join(f"{s} {c}" for s, c in sorted(pr["mix"].items())) or "–"
        prof_rows.append([str(row["k"])] +
                         [_cell((row["jobs"].get(s) or {}).get("profile")) for s in FIXED] +
                         [_cell(pr["auto"]), mix,
                          f"{pr['ratio']:.2f} (vs {pr['best']}; scatter "
                          f"{pr['scatter'] * 100:.0f} %)" if pr["best"] else "–"])
    nbytes = sum(b for _, b in tensors)
    md += [f"The {plan['profile']['model']} profile: its {len(tensors)} gradient tensors "
           f"({nbytes / 1e6:.1f} MB) push_pulled per iteration in backward order, priority = "
           "minus the forward index, no compute; the iteration time (median of "
           f"{plan['profile']['iters']} after {plan['profile']['warmup']} warm-up). The "
           "simulator runs one scheme per job, so `auto` has a simulated time only where it "
           "chose one scheme for every tensor.", "",
           _table(["k", *FIXED, "auto", "auto chose (tensors)", "best fixed / auto"],
                  prof_rows), ""]
    md += ["The cost model of the `auto` jobs (rank 0's; measured at start-up):", ""]
    for row in res["rows"]:
        md += _model_lines(row)
        pred = model_profile_costs(row["jobs"].get("auto", {}).get("model"), tensors)
        if pred:
            md += ["  its costs of the profile's bytes (ms; α terms left out: every tensor is "
                   "in flight at once): " + ", ".join(
                f"{s} {_ms(v)}" for s, v in pred.items())]
        fails = [f"{s}: {j['error']}" for s, j in row["jobs"].items() if "error" in j]
        if fails:
            md += [f"* k = {row['k']}: failed jobs: " + "; ".join(fails)]
    md.append("")
    for row in res["rows"]:
        srs = [sr for sr in size_rows(row, plan["sizes"]) if math.isfinite(sr["ratio"])]
        if srs:  # the size furthest below its threshold
            worst = min(srs, key=lambda sr: sr["ratio"] / sr["threshold"])
            loose = [f"{fmt_size(sr['size'])} ≥ {sr['threshold']:.2f}" for sr in srs
                     if sr["threshold"] < 1 / SIZE_TOLERANCE]
            strict = [sr for sr in srs if sr["ratio"] < 1 / SIZE_TOLERANCE]
            targets.append(target(
                f"`auto` ≤ 1.05 × the best fixed scheme at every size (n={n}, k={row['k']})",
                "best fixed / auto ≥ 0.95" + (
                    " (where auto chose the best scheme itself, within the runs' scatter: "
                    + ", ".join(loose) + ")" if loose else ""),
                f"worst {fmt_size(worst['size'])}: {worst['ratio']:.2f} (auto chose "
                f"{worst['chosen']}, best {worst['best']}); without the scatter allowance: "
                + (", ".join(f"{fmt_size(sr['size'])} {sr['ratio']:.2f}" for sr in strict)
                   + " below 0.95" if strict else "every size ≥ 0.95"),
                worst["ratio"], worst["threshold"]))
        pr = profile_row(row, tensors)
        if math.isfinite(pr["ratio"]):
            goal = "best fixed / auto ≥ 1.0" + (
                f" (the cost model predicts auto as fast as {pr['best']}, not faster: within "
                f"the runs' scatter, ≥ {pr['threshold']:.2f})" if pr["same"] else "")
            targets.append(target(
                f"`auto` ≤ every fixed scheme on the {plan['profile']['model']} profile "
                f"(n={n}, k={row['k']})", goal,
                f"{pr['ratio']:.2f} vs {pr['best']}", pr["ratio"], pr["threshold"]))
    if targets:
        from .report import targets_table

        md += [targets_table(targets), ""]
    return "\n".join(md), targets


def _size_st(row: dict, scheme: str, size: int):
    job = row["jobs"].get(scheme)
    if job is None:
        return None
    if "error" in job:
        return {"error": job["error"]}
    return job["sizes"].get(str(size))
