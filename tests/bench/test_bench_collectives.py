"""The collectives benchmark (benchmarks.collectives_bench): wired into ``python -m benchmarks``,
and its section and targets rendered from a result (the bench session's quick run measures)."""

from __future__ import annotations

import importlib

import pytest

from benchmarks import collectives_bench as bcoll

pytestmark = [pytest.mark.bench]


def test_hooks_are_wired_and_the_section_renders():
    from benchmarks import cli

    assert importlib.import_module(cli.PLUGINS["collectives"]) is bcoll
    plan = bcoll.bench_settings(True)
    assert plan["sizes"] == [4 << 20] and plan["mode"] == "loopback"
    assert bcoll.bench_steps(plan) == 2
    size = 4 << 20
    byteps = {f"{op}@{size}": 0.010 for op in bcoll.OPS}
    byteps[f"allreduce.max@{size}"] = 0.0110  # 10 % slower than Sum: missed
    gloo = {f"{op}@{size}": 0.020 for op in bcoll.OPS}
    gloo[f"reducescatter@{size}"] = None
    gloo[f"reducescatter@{size}.error"] = "not supported by gloo"
    md, targets = bcoll.bench_markdown(
        {"plan": plan, "runs": [{"config": [2, 1], "byteps": byteps, "gloo": gloo}]}, "", "")
    assert "| reducescatter | 4 MiB | 10.00 | — | — |" in md
    assert "| alltoall | 4 MiB | 10.00 | 20.00 | 2.00x |" in md
    assert "gloo lacks: reducescatter@4194304 (not supported by gloo)" in md
    met = {t["name"]: t["met"] for t in targets}
    assert met == {"allreduce Min vs Sum, 4 MiB": True, "allreduce Max vs Sum, 4 MiB": False,
                   "grouped_allreduce of 200 x 4 KiB vs gloo": True}


def test_a_result_is_the_median_of_the_slowest_rank():
    reports = [{"rank": 0, "times": {"a@1": [1.0, 5.0, 2.0], "b@1": None},
                "errors": {"b@1": "unsupported"}},
               {"rank": 1, "times": {"a@1": [3.0, 1.0, 1.0], "b@1": None},
                "errors": {"b@1": "unsupported"}}]
    agg = bcoll._aggregate(reports)
    assert agg["a@1"] == 3.0  # slowest per iteration: 3, 5, 2 -> median 3
    assert agg["b@1"] is None and agg["b@1.error"] == "unsupported"
    text = "[worker 0] RESULT " + '{"rank": 0}' + "\nnoise\n"
    assert bcoll._reports(text) == [{"rank": 0}]


def test_cluster_targets_judge_the_optimum_gloo_and_the_servers_speed_up():
    """On the emulated cluster: each mesh collective against (n-1)/n M/B (broadcast: M/B) with
    1.15 x slack and against gloo; allreduce Sum's speed-up over gloo against the theory's where
    k > 0; SyncBatchNorm's step against BatchNorm's at k = 0."""
    size, n = 64 << 20, 4
    bound = (n - 1) / n * size / (800e6 / 8)  # 0.503 s
    byteps = {f"{op}@{size}": bound * 1.1 for op in bcoll.OPS}
    byteps[f"allgather@{size}"] = bound * 1.2  # over 1.15 x: missed
    byteps[f"broadcast@{size}"] = size / 100e6 * 1.1
    byteps["bn_step@step"], byteps["syncbn_step@step"] = 0.100, 0.125  # 1.25 x: missed
    gloo = {f"{op}@{size}": bound * 1.15 for op in bcoll.OPS}
    gloo[f"allreduce.sum@{size}"] = bound * 1.1 * 1.5 * 0.96  # 0.96 of the theory's 1.5x
    plan = {"mode": "cluster", "sizes": [size], "bandwidth_mbit": 800.0}
    md, targets = bcoll.bench_markdown(
        {"plan": plan, "runs": [{"config": [4, 0], "byteps": byteps, "gloo": gloo},
                                {"config": [4, 4], "byteps": byteps, "gloo": gloo}]}, "", "")
    met = {t["name"]: t["met"] for t in targets}
    assert met["allgather 64 MiB vs its optimum, n=4 k=0"] is False
    assert met["reducescatter 64 MiB vs its optimum, n=4 k=0"] is True
    assert met["broadcast 64 MiB vs its optimum, n=4 k=4"] is True
    assert met["alltoall 64 MiB vs gloo, n=4 k=0"] is True
    assert met["allgather 64 MiB vs gloo, n=4 k=4"] is False
    assert "broadcast 64 MiB vs gloo, n=4 k=0" not in met  # no tie: the chain beats a tree
    assert met["allreduce Sum 64 MiB speed-up over gloo, n=4 k=4"] is True
    assert "allreduce Sum 64 MiB speed-up over gloo, n=4 k=0" not in met
    assert met["SyncBatchNorm step vs BatchNorm step, n=4 k=0"] is False
    assert "SyncBatchNorm step vs BatchNorm step, n=4 k=4" not in met
    assert "| training step, SyncBatchNorm | CNN, batch 32 | 125.00 | — | — |" in md
