"""The architecture table's byteps jobs per van (:mod:`benchmarks.table1`, plan ``vans``):
the targets that compare the vans, and the section's table of them.

* every van other than TCP within 5 % of the TCP van, every (n, k), at the reference sizes
  (M >= 64 MiB among the plan's ``van_sizes``, else the largest);
* on every van, small tensors (M <= 4 MiB): push_pull <= 1.15 x ``t_opt`` and no slower than
  gloo, every (n, k).
"""

from __future__ import annotations

import math

from .report import _table, fmt_size, target
from .table1 import (
    SMALL_BYTES,
    SMALL_TARGET,
    VAN_TARGET,
    _f,
    _ref_sizes,
    _t,
    _vans_at,
    job_key,
)


def _worst(pairs: list) -> tuple:
    """The (ratio, row) of ``pairs`` with the lowest ratio, a failed job (NaN) counting as 0."""
    ratio, row = min(pairs, key=lambda p: p[0] if math.isfinite(p[0]) else -1.0)
    return (ratio if math.isfinite(ratio) else 0.0), row


def _judged(plan: dict) -> str:
    return "tuned" if "tuned" in plan["settings"] else plan["settings"][-1]


def van_targets(res: dict) -> list[dict]:
    """Each other van within 5 % of the TCP van at the reference sizes, every (n,k); and on
    every van, small tensors (<= 4 MiB): push_pull <= 1.15 x t_opt and no slower than gloo."""
    rows, plan = res.get("rows", []), res["plan"]
    s = _judged(plan)
    out: list[dict] = []
    others = [v for v in plan.get("vans", ["tcp"]) if v != "tcp"]
    if others and plan.get("van_sizes"):
        for m in _ref_sizes(plan["van_sizes"]):
            rs = [r for r in rows if r["bytes"] == m]
            for v in others if rs else []:
                key = job_key(s, v)
                worst, wr = _worst([(_t(r, s) / _t(r, key), r) for r in rs])
                out.append(target(
                    f"emulated cluster {fmt_size(m)}: {v} van within 5 % of the TCP van, every "
                    f"(n,k) ({s} settings)", "TCP time / van time ≥ 0.952",
                    f"worst n={wr['n']},k={wr['k']}: {_f(_t(wr, key), '.3f')} s vs TCP "
                    f"{_f(_t(wr, s), '.3f')} s", worst, 1 / VAN_TARGET))
    for m in sorted({r["bytes"] for r in rows if r["bytes"] <= SMALL_BYTES}):
        rs = [r for r in rows if r["bytes"] == m]
        for v in _vans_at(plan, m):
            key = job_key(s, v)
            worst, wr = _worst([(r["t_opt_s"] / _t(r, key), r) for r in rs])
            out.append(target(
                f"emulated cluster {fmt_size(m)}: push_pull ≤ {SMALL_TARGET:g} × t_opt, every "
                f"(n,k) ({v} van, {s} settings)", f"t_opt / time ≥ {1 / SMALL_TARGET:.3f}",
                f"worst n={wr['n']},k={wr['k']}: {_f(_t(wr, key), '.3f')} s vs t_opt "
                f"{wr['t_opt_s']:.3f} s", worst, 1 / SMALL_TARGET))
            if plan["gloo"]:
                worst, wr = _worst([(_t(r, "gloo") / _t(r, key), r) for r in rs])
                out.append(target(
                    f"emulated cluster {fmt_size(m)}: push_pull no slower than gloo, every "
                    f"(n,k) ({v} van, {s} settings)", "gloo time / time ≥ 1",
                    f"worst n={wr['n']},k={wr['k']}: {_f(_t(wr, key), '.3f')} s vs gloo "
                    f"{_f(_t(wr, 'gloo'), '.3f')} s", worst, 1.0))
    return out


def van_section(res: dict) -> list[str]:
    """The byteps jobs per van at the van sizes (Markdown lines; none with the TCP van alone)."""
    plan, rows = res["plan"], res.get("rows", [])
    vans = plan.get("vans", ["tcp"])
    if len(vans) < 2 or not plan.get("van_sizes"):
        return []
    s = _judged(plan)
    ref = _ref_sizes(plan["van_sizes"])
    md = ["### The byteps jobs per van", ""]
    md.append(
        f"The byteps jobs ({s} settings) on each van, in the same cluster one after another: "
        + "; ".join(f"**{v}** = {d}" for v, d in res.get("vans", {}).items()) + ". A namespace "
        "host has `lo` and `eth0`; `UCX_NET_DEVICES=eth0` keeps UCX on the shaped link (its "
        "only route to the other hosts). tcp / van > 1: the van is faster. Targets per van, "
        f"in this order (✓ met, ✗ missed): within {100 * (VAN_TARGET - 1):.0f} % of the TCP van "
        f"(every other van, judged at {', '.join(fmt_size(m) for m in ref)}); at M ≤ "
        f"{fmt_size(SMALL_BYTES)}: ≤ {SMALL_TARGET:g} × `t_opt`, and no slower than gloo.")
    md.append("")
    header = ["n", "k", "M", "t_opt (s)"]
    for v in vans:
        header += [f"{v} (s)", f"{v} / t_opt"] + ([f"tcp / {v}"] if v != "tcp" else [])
        header += [f"gloo / {v}"] if plan["gloo"] else []
    header.append("targets")
    body = []
    for m in plan["van_sizes"]:
        for r in (r for r in rows if r["bytes"] == m):
            cells = [str(r["n"]), str(r["k"]), fmt_size(m), f"{r['t_opt_s']:.3f}"]
            marks = []
            for v in vans:
                ok = []
                t = _t(r, job_key(s, v))
                cells += [_f(t, ".3f"), _f(t / r["t_opt_s"], ".2f")]
                if v != "tcp":
                    cells.append(_f(_t(r, s) / t, ".2f") + "×")
                    if m in ref:
                        ok.append(t <= VAN_TARGET * _t(r, s))
                if plan["gloo"]:
                    cells.append(_f(_t(r, "gloo") / t, ".2f") + "×")
                if m <= SMALL_BYTES:
                    ok.append(t <= SMALL_TARGET * r["t_opt_s"])
                    if plan["gloo"]:
                        ok.append(t <= _t(r, "gloo"))
                if ok:
                    marks.append(f"{v} " + "".join("✓" if o else "✗" for o in ok))
            cells.append(", ".join(marks) or "—")
            body.append(cells)
    return md + [_table(header, body, "r" * len(header)), ""]
