"""The scheduling workload (benchmarks.sched) on the emulated cluster: a tiny real run gives
exact sums, finite iteration times no better than the ideal bound allows, and a Markdown
section. Needs root and iproute2 (skipped otherwise); about 20 s."""

from __future__ import annotations

import importlib
import math
import os

import pytest

from benchmarks import cluster as bc
from benchmarks import sched
from benchmarks.models import Layer

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(bc.netns_unavailable() is not None,
                       reason=f"emulated cluster unavailable: {bc.netns_unavailable()}"),
]


def test_hooks_are_wired():
    from benchmarks import cli

    plugin = importlib.import_module(cli.PLUGINS["sched"])
    plan = plugin.bench_settings(True)
    assert plan["models"] == ["resnet50"]
    assert plan["sweep"] == [] and plan["defaults"] == list(sched.core_defaults())
    assert plugin.bench_steps(plan) == 1 + 2  # cluster, FIFO, defaults (adaptive window)
    full = plugin.bench_settings(False)
    assert full["models"] == ["vgg16", "resnet50"]
    assert plan["defaults"] in full["sweep"]
    assert full["autotune"] and not plan["autotune"]
    assert plugin.bench_steps(full) == 1 + 2 * (2 + len(full["sweep"]) + 1)


def test_tiny_workload_fifo_and_priority(tmp_path):
    # 3 MB of gradients in 5 tensors; 40 ms of compute per iteration
    layers = [Layer("conv1", 4 * 1000, 0.004, 0.008), Layer("conv2", 4 * 50_000, 0.004, 0.008),
              Layer("fc1", 4 * 700_000, 0.002, 0.004), Layer("fc1.bias", 4 * 10, 0.0, 0.0),
              Layer("fc2", 4 * 4000, 0.001, 0.002)]
    before = set(bc.list_netns())
    B = 400e6
    with bc.EmulatedCluster(2, 0, B) as c:
        times = {mode: sched.run_workload(c, layers, mode,
                                          {"BYTEPS_PARTITION_BYTES": "65536",
                                           "BYTEPS_SCHEDULING_CREDIT": "4"},
                                          iters=3, warmup=1, timeout=120)
                 for mode in ("fifo", "priority")}
    assert not [ns for ns in set(bc.list_netns()) - before
                if ns.startswith(f"bps{os.getpid() % 10000}")]  # everything torn down
    total = sum(x.nbytes for x in layers)
    # the ideal at the set rate (the goodput is a little lower) bounds every schedule
    ideal = sched.ideal_iteration(layers, bc.t_opt(2, 0, total, B / 8) / total)
    for mode, t in times.items():
        assert math.isfinite(t) and t >= 0.95 * ideal, (mode, t, ideal)
        assert t < 20 * ideal + 1.0, (mode, t, ideal)


def test_markdown_and_targets_from_results(tmp_path):
    plan = sched.bench_settings(False, ["vgg16"], [(262144, 4), (4096000, 4)])
    plan["unavailable"] = None
    res = {"plan": plan, "goodput_Bps": 95e6, "elapsed_s": 10.0, "models": {"vgg16": {
        "bytes": 553430176, "tensors": 32, "t_comm_opt_s": 5.8, "compute_s": 5.8,
        "ideal_s": 5.9, "sequential_s": 11.8, "jobs": [
            {"mode": "fifo", "partition": 4096000, "credit": 0, "time_s": 7.8},
            {"mode": "adaptive", "partition": 262144, "credit": 4, "time_s": 6.0},
            {"mode": "priority", "partition": 262144, "credit": 4, "time_s": 6.1},
            {"mode": "priority", "partition": 4096000, "credit": 4, "error": "boom"},
            {"mode": "autotune", "partition": 262144, "credit": 8, "time_s": 6.2,
             "tune_iters": 60, "error_tuning": "",
             "trials": [{"partition_bytes": 262144, "credit": 4, "iteration_s": 6.3},
                        {"partition_bytes": 262144, "credit": 8, "iteration_s": 6.2}]}]}}}
    md, targets = sched.bench_markdown(res, str(tmp_path), "img")
    assert "| FIFO | 4096000 | ∞ | 7.800 | 1.32 |" in md
    assert "| priority + credit | 4096000 | 4 | failed |  |" in md
    assert "| priority + adaptive window (default) | 262144 | from 4 | 6.000 | 1.02 |" in md
    defaults = [t for t in targets if "(defaults:" in t["name"]]
    assert len(defaults) == 1 and "adaptive window from credit 4" in defaults[0]["name"]
    assert (tmp_path / "sched_iteration.png").stat().st_size > 1000
    best = [t for t in targets if "best of sweep" in t["name"]]
    assert len(best) == 1 and best[0]["met"] is True
    assert best[0]["ratio"] == pytest.approx(5.9 / 6.1)
    assert "| autotune (chosen) | 262144 | 8 | 6.200 | 1.05 |" in md
    assert "chose 262144 B, credit 8 after 2 trials in 60 iterations" in md
    auto = [t for t in targets if "autotune" in t["name"]]
    assert len(auto) == 1 and auto[0]["ratio"] == pytest.approx(6.1 / 6.2)
    assert auto[0]["met"] is True  # within 5 %


def test_tiny_workload_autotune(tmp_path):
    """Quick: the autotune row on a tiny workload: the tuner finishes, every worker agrees,
    the log has one line per trial and the choice, and the sums stay exact (the worker checks
    them)."""
    layers = [Layer("conv1", 4 * 1000, 0.002, 0.004), Layer("conv2", 4 * 50_000, 0.002, 0.004),
              Layer("fc1", 4 * 700_000, 0.001, 0.002), Layer("fc2", 4 * 4000, 0.001, 0.002)]
    log = tmp_path / "tune.jsonl"
    with bc.EmulatedCluster(2, 0, 400e6) as c:
        a = sched.run_autotune(c, layers, sched.autotune_env(str(log), steps=2), iters=2,
                               warmup=1, timeout=240)
    st = a["autotune"]
    assert st["done"] and not st["error"] and st["choice"] is not None
    assert math.isfinite(a["time_s"]) and a["time_s"] > 0
    lines = log.read_text().splitlines()
    assert len(lines) == len(st["trials"]) + 1 and '"choice"' in lines[-1]
    assert a["tune_iters"] >= len(st["trials"]) * 4
