"""The schemes benchmark (benchmarks.schemes_cluster): its plans, and the quick plan on a tiny
emulated cluster (n = 2; k = 0 with a server colocated on each worker host, k = 2 with two
CPU-server hosts): every job finishes, the times are finite and positive, the simulator's
stand beside them, the ``auto`` rows are there with the cost model's k taken from the address
book, the section renders. The cluster needs root and iproute2 (skipped otherwise)."""

from __future__ import annotations

import importlib
import json
import math

import pytest

from benchmarks import cluster as bc
from benchmarks import schemes_cluster as sc
from benchmarks import schemes_cluster_report as scr

pytestmark = [pytest.mark.bench]

netns = pytest.mark.skipif(bc.netns_unavailable() is not None,
                           reason=f"emulated cluster unavailable: {bc.netns_unavailable()}")


def test_plans_and_hook():
    from benchmarks import cli

    assert importlib.import_module(cli.PLUGINS["schemes"]) is sc
    full = sc.bench_settings(False)
    assert (full["n"], full["ks"], full["sizes"]) == (4, [0, 4], list(sc.SIZES))
    assert sc.plan_jobs(full, 0) == ["ps", "ring", "tree", "hips", "auto"]  # 4 colocated
    assert sc.plan_jobs(full, 4) == ["ps", "ring", "tree", "hips", "auto"]  # 4 CPU-only
    assert sc.schemes_for(4, 2) == ["ps", "ring", "tree"]  # hips needs ceil(4/2) + 1 = 3
    assert (sc.job_servers(4, 0), sc.job_servers(4, 4), sc.job_servers(4, 2)) == (4, 4, 6)
    assert len(full["profile"]["tensors"]) == 161  # every ResNet-50 gradient
    assert sum(b for _, b in full["profile"]["tensors"]) == 4 * 25_557_032
    quick = sc.bench_settings(True)
    assert quick["n"] in (2, 3) and len(quick["sizes"]) == 2
    assert sum(b for _, b in quick["profile"]["tensors"]) <= sc.QUICK_PROFILE_BYTES
    if full["unavailable"] is None:
        assert sc.bench_steps(full) == 2 * (1 + (2 + 4) * 5)  # 2 rounds, 4 of small sizes
    assert sc.small_sizes(full) == [4 << 10, 256 << 10] and quick["small_rounds"] == 0


def test_report_without_cluster():
    plan = sc.bench_settings(True)
    plan["unavailable"] = "no root (test)"
    res = sc.bench_run(plan)
    md, targets = sc.bench_markdown(json.loads(json.dumps(res)))
    assert "Not measured: no root (test)." in md and targets == []


def test_targets_from_results():
    # auto at 0.9 of the best fixed scheme's time (a win), and 10 % slower at the larger size
    def st(t):
        return {"time_s": t, "min_s": t, "max_s": t, "scatter": 0.0, "sim_s": t}

    plan = sc.bench_settings(True)
    row = {"k": 0, "n": 2, "goodput_Bps": 1e8, "jobs": {
        "ps": {"sizes": {"4096": st(1e-3), "262144": st(2e-3)}, "profile": st(0.1)},
        "ring": {"sizes": {"4096": st(2e-3), "262144": st(3e-3)}, "profile": st(0.2)},
        "auto": {"sizes": {"4096": st(0.9e-3), "262144": st(2.2e-3)}, "profile": st(0.1),
                 "choices": {"4096": "ps", "262144": "ps"}, "profile_choices": {"ps": 3}}}}
    md, targets = scr.markdown({"plan": plan, "rows": [row], "cores": 2})
    size_t, prof_t = targets
    assert size_t["ratio"] == pytest.approx(2 / 2.2) and size_t["met"] is False
    assert prof_t["ratio"] == pytest.approx(1.0) and prof_t["met"] is True
    assert "| 0 | 4 KiB | 1.00 / 1.00 (1.00) | 2.00 / 2.00 (1.00) | – | – |" in md


def test_small_rounds_pool_with_the_full_ones():
    # a small round times only the small sizes and no profile; the sizes pool every round that
    # timed them, the profile the full rounds; auto's per-round choices show where they differ
    def job(sizes, profile, choice):
        model = {"alpha": 1e-4, "beta": 1e-8, "gamma": 1e-10, "latency": {"ps": 2e-4},
                 "intervals": []}
        return {"raw": {"sizes": sizes, "profile": profile}, "wall_s": 1.0, "model": model,
                "choices": {"4096": choice}, "profile_choices": {choice: 1} if profile else {},
                "same_on_every_rank": True}

    full = job({"4096": [1.0, 3.0], "67108864": [9.0]}, [5.0], "ps")
    small = [job({"4096": [t]}, [], c) for t, c in ((2.0, "tree"), (4.0, "ps"))]
    out = sc._pool([full, *small, {"error": "boom", "wall_s": 1.0}])
    assert (out["rounds"], out["failed_rounds"]) == (3, 1)
    assert out["sizes"]["4096"]["time_s"] == 2.5 and out["sizes"]["4096"]["rounds"] == 3
    assert out["sizes"]["67108864"]["rounds"] == 1 and out["profile"]["rounds"] == 1
    assert out["choices_rounds"] == [{"4096": c} for c in ("ps", "tree", "ps")]
    assert out["profile_choices_rounds"] == [{"ps": 1}]
    st = {"time_s": 2.5, "min_s": 1.0, "max_s": 4.0, "scatter": 0.1}
    row = {"k": 0, "jobs": {"ps": {"sizes": {"4096": st}}, "auto": out}}
    (sr,) = scr.size_rows(row, [4096])
    assert sr["chosen"] == "ps 2, tree 1" and not sr["same"]
    assert sr["threshold"] == pytest.approx(1 / sc.SIZE_TOLERANCE)


@netns
def test_quick_plan_on_a_tiny_cluster():
    plan = sc.bench_settings(True, ks=[0, 2], schemes=sc.FIXED)
    plan["small_rounds"] = 1  # the small sizes' round too (the quick plan runs none)
    plan["link_seconds"] = 0.3
    before = set(bc.list_netns())
    labels = []
    res = sc.bench_run(plan, labels.append)
    assert len(labels) == sc.bench_steps(plan)
    assert not bc.own_netns_left(before)
    res = json.loads(json.dumps(res))
    assert [r["k"] for r in res["rows"]] == [0, 2]
    for row in res["rows"]:
        assert set(row["jobs"]) == {"ps", "ring", "tree", "hips", "auto"}, row["jobs"].keys()
        for sync, job in row["jobs"].items():
            assert "error" not in job, (row["k"], sync, job)
            stats = [*job["sizes"].values(), job["profile"]]
            assert sorted(job["sizes"]) == sorted(str(s) for s in plan["sizes"])
            for s in stats:
                assert math.isfinite(s["time_s"]) and s["time_s"] > 0, (sync, s)
            for s in job["sizes"].values():
                assert math.isfinite(s["sim_s"]) and s["sim_s"] > 0, (sync, s)
        auto = row["jobs"]["auto"]
        m = auto["model"]
        # the address book: k = 0 has its servers on the worker hosts, k = 2 two CPU-only
        assert (m["servers"], m["servers_source"]) == (row["k"], "address book"), m
        assert auto["same_on_every_rank"]
        assert set(auto["choices"].values()) <= set(sc.FIXED)
        # every scheme the job runs had its tiny push_pull timed
        assert set(m["latency"]) == set(m["schemes"]) and min(m["latency"].values()) > 0, m
        assert len(auto["choices_rounds"]) == 2 and auto["sizes"]["4096"]["rounds"] == 2
        assert sum(auto["profile_choices"].values()) == len(plan["profile"]["tensors"])
    md, targets = sc.bench_markdown(res)
    assert "## The synchronisation schemes on the emulated cluster" in md
    assert "failed" not in md and "auto chose" in md and "(address book)" in md
    assert len(targets) == 4 and all(t["ratio"] > 0 for t in targets), targets
