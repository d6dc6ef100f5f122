"""The pipeline benchmark (benchmarks.pipeline): wired into ``python -m benchmarks``, renders
its section and targets from a result, and its quick run on the emulated cluster (root and
iproute2; skipped otherwise, about 45 s) gives a plan, finite rates and both targets judged."""

from __future__ import annotations

import importlib
import math

import pytest

from benchmarks import cluster as bc
from benchmarks import pipeline as bpipe

pytestmark = [pytest.mark.bench]
pytest.importorskip("torch")


def test_hooks_are_wired_and_the_section_renders():
    from benchmarks import cli

    assert importlib.import_module(cli.PLUGINS["pipeline"]) is bpipe
    plan = bpipe.bench_settings(True)
    assert plan["bandwidth_Bps"] == 50e6 / 8 and plan["workers"] == 4
    assert bpipe.bench_steps(plan) == 2
    res = {"plan": {**plan, "unavailable": None}, "load_before": [1.0], "load_after": [1.0],
           "chosen": {"stages": [[0, 5, 3], [6, 9, 1]], "bottleneck": "stage 1",
                      "predicted_rate": 100.0, "predicted_dp_rate": 4.0, "profile": []},
           "pipedream": {"epoch_s": 0.3, "minibatches": 24, "rate": 80.0, "steady_rate": 95.0},
           "dp": {"epoch_s": 6.0, "minibatches": 24, "rate": 4.0}}
    md, targets = bpipe.bench_markdown(res)
    assert "layers 0-5 x3, layers 6-9 x1" in md
    assert [t["met"] for t in targets] == [True, True]
    assert targets[1]["ratio"] == pytest.approx(0.95)
    md, targets = bpipe.bench_markdown({"plan": {**plan, "unavailable": "no root"}})
    assert "Not measured: no root" in md and targets == []


@pytest.mark.skipif(bc.netns_unavailable() is not None,
                    reason=f"emulated cluster unavailable: {bc.netns_unavailable()}")
def test_quick_run():
    plan = bpipe.bench_settings(True)
    labels = []
    res = bpipe.bench_run(plan, labels.append)
    assert labels == ["pipedream", "dp"]
    stages = res["chosen"]["stages"]
    assert sum(r for _, _, r in stages) == 4 and stages[-1][1] == 9
    for key in ("rate", "steady_rate"):
        assert math.isfinite(res["pipedream"][key]) and res["pipedream"][key] > 0
    assert res["dp"]["rate"] > 0
    md, targets = bpipe.bench_markdown(res)
    assert len(targets) == 2 and all(t["met"] is not None for t in targets)
