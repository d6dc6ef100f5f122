"""The end-to-end training benchmark (benchmarks.e2e): the worker really trains (the loss falls,
the workers end with identical parameters), byteps and torch DDP jobs on a tiny emulated
cluster give finite images/s, and the section renders with its targets. The cluster needs root
and iproute2 (skipped otherwise); about 90 s in all on 2 cores."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os

import pytest

from benchmarks import cluster as bc
from benchmarks import e2e, e2e_report
from benchmarks import e2e_worker as ew

pytestmark = [pytest.mark.bench]

netns = pytest.mark.skipif(bc.netns_unavailable() is not None,
                           reason=f"emulated cluster unavailable: {bc.netns_unavailable()}")

# a smaller model than the benchmark's (1.2 MB of gradients) so the tiny jobs stay fast
TINY = {"widths": [8, 16, 32, 64], "hidden": 256, "batch": 8, "warmup": 1, "steps": 3}


def _ours_left(before: set) -> list:
    return [ns for ns in set(bc.list_netns()) - before
            if ns.startswith(f"bps{os.getpid() % 10000}")]


def test_hooks_are_wired():
    from benchmarks import cli

    plugin = importlib.import_module(cli.PLUGINS["e2e"])
    assert plugin is e2e
    full = e2e.bench_settings(False)
    assert full["n"] == 4 and full["ks"] == [0, 4] and full["bandwidth_mbit"] == 200
    assert full["modes"] == ["optimizer", "ddp", "xbar"]
    quick = e2e.bench_settings(True)
    netns_ok = quick["unavailable"] is None
    # single; per k: build + 3 modes; torch DDP + no-communication once; the trace
    assert e2e.bench_steps(quick) == (1 + 2 * 4 + 2 + 1 if netns_ok else 2)
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
    plan = e2e.bench_settings(True, **TINY, ks=[0, 2], modes=modes, bandwidth_mbit=400.0,
                              link_seconds=0.3, trace={"mode": "optimizer", "k": 2, "steps": 2})
    before = set(bc.list_netns())
    labels = []
    res = e2e.bench_run(plan, labels.append)
    assert len(labels) == e2e.bench_steps(plan)
    assert not _ours_left(before)
    assert [c["k"] for c in res["clusters"]] == [0, 2]
    jobs = {(c["k"], m): j for c in res["clusters"] for m, j in c["jobs"].items()}
    want = {(k, m) for k in (0, 2) for m in modes} | {(0, "torch-ddp"), (0, "shared")}
    assert set(jobs) == want
    for key, j in jobs.items():
        assert "error" not in j, (key, j)
        assert j["workers"] == 2 and math.isfinite(j["images_per_s"]) and j["images_per_s"] > 0
        assert j["identical"], key  # gradients really averaged: the same parameters everywhere
        assert j["grad_bytes"] == res["single"]["grad_bytes"]
    tr = res["trace"]
    assert tr["job"].get("identical"), tr
    # one Chrome trace per worker host, with the push_pulls of the shown step and the one before
    assert sorted(tr["files"]) == ["w0", "w1"]
    st = e2e_report.trace_stats(tr, e2e_report.traced_step(tr))
    assert st and st["hosts"] == 2 and 0 < st["span_s"] < 5 and st["gap_s"] is not None, st
    md, targets = e2e.bench_markdown(json.loads(json.dumps(res)), str(tmp_path), "img")
    assert "| torch DDP (gloo) | — |" in md and "| byteps DistributedOptimizer | 2 |" in md
    assert "failed" not in md and "**no**" not in md
    assert (tmp_path / "e2e_throughput.png").stat().st_size > 1000
    assert "### Timeline of one iteration: byteps DistributedOptimizer, n = 2, k = 2" in md
    if importlib.util.find_spec("benchmarks.timeline_plot") is not None:
        assert (tmp_path / "e2e_timeline.png").stat().st_size > 1000
        assert "](img/e2e_timeline.png)" in md
    names = [t["name"] for t in targets]
    # k = 0: >= 1 per mode; k = 2 at n = 2: information only; CrossBarrier vs optimizer per k
    assert sum("k = 0" in nm and "torch DDP" in nm for nm in names) == len(modes)
    k2 = [t for t in targets if "k = 2" in t["name"] and "torch DDP" in t["name"]]
    assert len(k2) == len(modes) and all(t["met"] is None for t in k2)
    assert all(t["ratio"] > 0 for t in targets), targets
