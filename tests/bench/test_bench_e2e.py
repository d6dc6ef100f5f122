"""The end-to-end training benchmark (benchmarks.e2e): the worker really trains (the loss falls,
the workers end with identical parameters), byteps and torch DDP jobs on a tiny emulated
cluster give finite images/s, and the section renders with its targets. The cluster needs root
and iproute2 (skipped otherwise); about 90 s in all on 2 cores."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math

import pytest

from benchmarks import cluster as bc
from benchmarks import e2e, e2e_report
from benchmarks import e2e_worker as ew

pytestmark = [pytest.mark.bench]

netns = pytest.mark.skipif(bc.netns_unavailable() is not None,
                           reason=f"emulated cluster unavailable: {bc.netns_unavailable()}")

# a smaller model than the benchmark's (1.2 MB of gradients) so the tiny jobs stay fast
TINY = {"widths": [8, 16, 32, 64], "hidden": 256, "batch": 8, "warmup": 1, "steps": 3}


def test_hooks_are_wired():
    from benchmarks import cli

    plugin = importlib.import_module(cli.PLUGINS["e2e"])
    assert plugin is e2e
    full = e2e.bench_settings(False)
    assert full["n"] == 4 and full["ks"] == [0, 4] and full["bandwidth_mbit"] == 100
    assert full["modes"] == ["optimizer", "ddp", "xbar"]
    quick = e2e.bench_settings(True)
    netns_ok = quick["unavailable"] is None
    # single; per k: build + 3 modes; torch DDP + no-communication once; the trace
    assert e2e.bench_steps(quick) == (1 + 2 * 4 + 2 + 1 if netns_ok else 2)
    assert full["autotune"]["k"] == 0 and quick["autotune"] is None
    assert full["autotune"]["env"]["BYTEPS_AUTOTUNE"] == "1"
    netns_full = full["unavailable"] is None
    # the full plan: per k build + 2 rounds of 3 modes, 2 rounds of torch DDP, no
    # communication, autotune, 2 traces
    assert full["rounds"] == 2 and quick["rounds"] == 1
    assert e2e.bench_steps(full) == (1 + 2 * (1 + 2 * 3) + 2 + 1 + 1 + 2 if netns_full else 2)
    assert [(t["mode"], t["k"]) for t in full["traces"]] == [("optimizer", 4), ("optimizer", 0)]
    assert cli.parse_args(["--e2e"]).e2e is True
    argv = e2e.worker_argv(full, "torch-ddp")
    assert argv[1:3] == ["-m", "benchmarks.e2e_worker"] and "--widths" in argv


def test_model_shape_and_size():
    import torch

    model = ew.make_model()
    out = model(torch.zeros(2, *ew.IMAGE))
    assert out.shape == (2, ew.CLASSES)
    params = sum(p.numel() for p in model.parameters())
    assert params == 2_598_746  # the docstring's figure: 10.4 MB of float32 gradients
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_local_worker_trains(capsys):
    # 9 steps over 4 cycled batches: the last step sees the first step's batch again
    assert ew.main(["--mode", "local", "--steps", "8", "--warmup", "1", "--batch", "8",
                    "--batches", "4", "--widths", "8", "16", "32", "64", "--hidden", "128",
                    "--lr", "0.01"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")][-1]
    r = json.loads(line[7:])
    assert r["mode"] == "local" and r["size"] == 1 and len(r["times"]) == 8
    assert all(t > 0 for t in r["times"]) and r["images_per_s"] > 0
    assert r["loss_last"] < 0.6 * r["loss_first"], r  # it learns the class templates
    assert len(r["digest"]) == 64


def test_report_without_cluster(tmp_path):
    """The section renders from results that only have the lone worker (no root)."""
    plan = e2e.bench_settings(True, **TINY, unavailable="no root (test)")
    res = e2e.bench_run(plan)
    assert res["skipped"] == "no root (test)" and "error" not in res["single"], res
    md, targets = e2e.bench_markdown(json.loads(json.dumps(res)), str(tmp_path), "img")
    assert "## End-to-end training" in md and "Cluster not measured: no root (test)." in md
    assert "| 1 worker alone (no network) |" in md and targets == []


@netns
def test_cluster_tiny(tmp_path):
    modes = [m for m in ("optimizer", "ddp", "xbar") if e2e.mode_unavailable(m) is None]
    plan = e2e.bench_settings(True, **TINY, ks=[0], modes=modes, bandwidth_mbit=400.0,
                              shared=False, link_seconds=0.3,
                              traces=[{"mode": "optimizer", "k": 0, "steps": 2},
                                      {"mode": "nosuch", "k": 0, "steps": 2}])
    before = set(bc.list_netns())
    labels = []
    res = e2e.bench_run(plan, labels.append)
    assert len(labels) == e2e.bench_steps(plan)
    assert not bc.own_netns_left(before)
    (c,) = res["clusters"]
    assert c["k"] == 0 and set(c["jobs"]) == {*modes, "torch-ddp"}
    for key, j in c["jobs"].items():
        assert "error" not in j, (key, j)
        assert j["workers"] == 2 and math.isfinite(j["images_per_s"]) and j["images_per_s"] > 0
        assert j["identical"], key  # gradients really averaged: the same parameters everywhere
        assert j["grad_bytes"] == res["single"]["grad_bytes"]
        assert j["loss_last"] == pytest.approx(c["jobs"]["torch-ddp"]["loss_last"], rel=1e-3)
    tr, other = res["traces"]
    assert other["skipped"] == "not among the plan's modes"
    assert tr["job"].get("identical"), tr
    # one Chrome trace per worker host, with the push_pulls of the shown step and the one before
    assert sorted(tr["files"]) == ["w0", "w1"]
    st = e2e_report.trace_stats(tr, e2e_report.traced_step(tr))
    assert st and st["hosts"] == 2 and 0 < st["span_s"] < 5 and st["gap_s"] is not None, st
    md, targets = e2e.bench_markdown(json.loads(json.dumps(res)), str(tmp_path), "img")
    assert "| torch DDP (gloo) | — |" in md and "| byteps DistributedOptimizer | 0 |" in md
    assert "failed" not in md and "**no**" not in md
    assert (tmp_path / "e2e_throughput.png").stat().st_size > 1000
    assert "### Timeline of one iteration: byteps DistributedOptimizer, n = 2, k = 0" in md
    if importlib.util.find_spec("benchmarks.timeline_plot") is not None:
        assert (tmp_path / "e2e_timeline_optimizer_k0.png").stat().st_size > 1000
        assert "](img/e2e_timeline_optimizer_k0.png)" in md
    # k = 0: byteps >= torch DDP per mode, and CrossBarrier vs DistributedOptimizer
    assert [t["threshold"] for t in targets] == [1.0] * len(modes) + (
        [1.0] if "xbar" in modes else [])
    assert all(t["ratio"] > 0 and t["met"] is not None for t in targets), targets


def _job(ips: float) -> dict:
    return {"images_per_s": ips, "per_worker": [ips / 4] * 4, "step_s": 64 / ips,
            "loss_first": 2.3, "loss_last": 1.0, "identical": True, "grad_bytes": 10394984,
            "params": 2598746, "workers": 4}


def test_targets_at_n4():
    """The judged targets of the full configuration, from given images/s: byteps vs torch DDP
    at k = 0 (>= 1) and k = 4 (>= 1.3), CrossBarrier vs DistributedOptimizer per k; a mode
    that was not run is missed and says why."""
    plan = e2e.bench_settings(False, unavailable=None)
    res = {"plan": plan, "cores": 2, "single": _job(100.0), "skipped_modes": {
        "ddp": "byteps.torch.parallel is not in this build"}, "clusters": [
        {"n": 4, "k": 0, "goodput_Bps": 24e6, "network": None,
         "jobs": {"optimizer": _job(80.0), "xbar": _job(84.0), "torch-ddp": _job(75.0)}},
        {"n": 4, "k": 4, "goodput_Bps": 24e6, "network": None,
         "jobs": {"optimizer": _job(93.0), "xbar": _job(100.0)}}]}
    md, targets = e2e.bench_markdown(res)
    got = {(t["name"].split(": ", 1)[1], t["threshold"]): (round(t["ratio"], 3), t["met"])
           for t in targets}
    assert got[("byteps DistributedOptimizer ≥ 1× torch DDP", 1.0)] == (round(80 / 75, 3), True)
    assert got[("byteps DistributedOptimizer ≥ 1.3× torch DDP", 1.3)] == (round(93 / 75, 3),
                                                                          False)
    assert got[("byteps CrossBarrier ≥ 1.3× torch DDP", 1.3)] == (round(100 / 75, 3), True)
    assert got[("byteps DistributedDataParallel ≥ 1× torch DDP", 1.0)] == (0.0, False)
    assert got[("CrossBarrier ≥ DistributedOptimizer", 1.0)] in {(1.05, True), (1.075, True)}
    assert len(targets) == 8
    ddp = [t for t in targets if "DistributedDataParallel" in t["name"]]
    assert all("not in this build" in t["measured"] for t in ddp)
    assert "| byteps DistributedOptimizer | 4 | 93.0 |" in md


def test_rounds_are_averaged_and_a_failed_round_fails_the_row():
    a = {"images_per_s": 40.0, "per_worker": [10.0, 30.0], "step_s": 1.5, "times": [[1.5]],
         "identical": True, "phases_s": [0.1, 0.2, 1.2], "loss_first": 2.3}
    b = dict(a, images_per_s=44.0, per_worker=[12.0, 32.0], step_s=1.3, identical=True,
             phases_s=[0.1, 0.2, 1.0])
    row = e2e.combine_rounds([a, b])
    assert row["images_per_s"] == 42.0 and row["per_worker"] == [11.0, 31.0]
    assert row["step_s"] == pytest.approx(1.4) and row["rounds"] == [40.0, 44.0]
    assert row["phases_s"] == pytest.approx([0.1, 0.2, 1.1]) and row["identical"]
    assert not e2e.combine_rounds([a, dict(b, identical=False)])["identical"]
    failed = {"error": "boom"}
    assert e2e.combine_rounds([a, failed]) is failed
