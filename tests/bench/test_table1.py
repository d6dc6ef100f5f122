"""The architecture table (benchmarks.table1): a tiny real run on the emulated cluster gives
finite positive numbers and a Markdown table with every column. Needs root and iproute2
(skipped otherwise); about 25 s (the UCX van over TCP too, where byteps has UCX)."""

from __future__ import annotations

import importlib
import math
import os

import pytest

from benchmarks import cluster as bc
from benchmarks import table1

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(bc.netns_unavailable() is not None,
                       reason=f"emulated cluster unavailable: {bc.netns_unavailable()}"),
]


def test_theory():
    assert table1.theory_speedup(4, 4) == pytest.approx(1.5)
    assert table1.theory_speedup(2, 0) == table1.theory_speedup(4, 0) == 1.0
    # at k = 0 byteps and the ring move the same bytes: t_opt == ring time
    assert bc.t_opt(4, 0, 1e6, 1e6) == pytest.approx(table1.t_ring(4, 1e6, 1e6))


def test_cluster_hooks_are_wired():
    from benchmarks import cli

    plugin = importlib.import_module(cli.PLUGINS["cluster"])
    plan = plugin.bench_settings(True)
    assert plan["sizes"] == [16 << 20]
    assert [tuple(c) for c in plan["configs"]] == list(table1.CONFIGS)
    assert plan["settings"] == ["default"]
    # cluster, byteps defaults on every van (TCP, and UCX over TCP where byteps has UCX), gloo
    assert plugin.bench_steps(plan) == 5 * (1 + len(plan["vans"]) + 1)


def test_tiny_table(tmp_path):
    plan = table1.bench_settings(False, sizes=[1 << 20], configs=[(2, 0), (2, 2)],
                                 iters={1 << 20: 2}, settings=["default", "tuned"])
    plan["link_seconds"] = 0.5
    labels = []
    before = set(bc.list_netns())
    res = table1.bench_run(plan, labels.append)
    assert len(labels) == table1.bench_steps(plan)
    rows = res["rows"]
    assert [(r["n"], r["k"]) for r in rows] == [(2, 0), (2, 2)]
    for r in rows:
        assert r["idle_s"] == pytest.approx(2 * bc.tbf_params(plan["bandwidth_mbit"] * 1e6)[0]
                                            * 8 / (plan["bandwidth_mbit"] * 1e6))
        for key in ("goodput_Bps", "t_opt_s", "t_ring_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        ucx = [table1.job_key(s, v) for s in ("default", "tuned") for v in plan["vans"][1:]]
        for job in ("default", "tuned", "gloo", *ucx):
            assert "error" not in r[job], (job, r[job])
            assert math.isfinite(r[job]["time_s"]) and r[job]["time_s"] > 0, (job, r)
    assert not [ns for ns in set(bc.list_netns()) - before
                if ns.startswith(f"bps{os.getpid() % 10000}")]  # everything torn down
    md, targets = table1.bench_markdown(res, str(tmp_path), "img")
    for col in ("n", "k", "link goodput (Mbit/s)", "t_opt (s)", "default (s)", "default / t_opt",
                "tuned (s)", "tuned / t_opt", "gloo (s)", "gloo / ring time",
                "speed-up default", "speed-up tuned", "theory", "speed-up / theory",
                "CPU busy (tuned)", "targets"):
        assert f"| {col} |" in md, col
    # the report says which qdisc shaped the links and which congestion control the hosts used
    net = rows[0]["network"]
    assert net["shaper"] and f"links shaped by `{net['shaper']}`" in md
    assert f"TCP congestion control `{net['congestion_control']}` on every host" in md
    assert f"every link was idle for {rows[0]['idle_s'] * 1e3:.1f} ms" in md
    table = [ln for ln in md.splitlines() if ln.startswith("| 2 |")]
    # the size table, and where byteps has UCX the table per van (UCX over TCP)
    assert len(table) == 2 * len(plan["vans"]) and all("failed" not in ln for ln in table)
    assert ("### The byteps jobs per van" in md) is (len(plan["vans"]) > 1)
    assert (tmp_path / "cluster_table1.png").stat().st_size > 0
    assert {t["met"] for t in targets} <= {True, False, None}
    assert all(math.isfinite(t["ratio"]) and t["ratio"] > 0 for t in targets)
