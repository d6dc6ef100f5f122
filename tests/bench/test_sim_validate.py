"""The simulator's validation section (benchmarks.sim_validate) simulates the jobs the same run's
emulated-cluster and scheduling sections measured, instead of running the cluster twice: the
CLI hands it their results, and its rows compare those measurements with ``byteps.sim``. No
cluster is needed (the measurements are given)."""

from __future__ import annotations

import pytest

from benchmarks import cli, sim_validate
from benchmarks import sim_compare as validate

pytestmark = pytest.mark.bench

GOODPUT = 12e6  # bytes/s, a 100 Mbit/s link's goodput


def _measured(time_s: float, gloo_s: float) -> dict:
    table1 = {"plan": {"sizes": [16 << 20]}, "rows": [
        {"n": 2, "k": 0, "bytes": 16 << 20, "goodput_Bps": GOODPUT,
         "default": {"time_s": time_s}, "gloo": {"time_s": gloo_s}}]}
    sched = {"plan": {"n": 4, "k": 4, "compute_ratio": 1.0}, "goodput_Bps": GOODPUT,
             "models": {}}
    return {"cluster": table1, "sched": sched}


def test_cli_hands_the_sections_results_only_when_the_run_has_them():
    bench = cli.available()["sim"]
    assert bench.reuses == ["cluster", "sched"]
    assert cli._reuses(bench, ["e2e", "cluster", "sched"]) == ["cluster", "sched"]
    assert cli._reuses(bench, ["cluster"]) == []  # sched not measured: sim measures both itself


def test_recorded_bucket_is_the_emulated_clusters():
    """benchmarks.sim_recorded keeps the number rather than importing netns: its bucket is the
    emulator's rule at the architecture table's rate, checked here."""
    from benchmarks import netns, table1
    from benchmarks import sim_recorded as recorded

    assert netns.tbf_params(table1.BANDWIDTH_MBIT * 1e6)[0] == recorded.EMULATED_SHAPER_BURST


def test_reused_results_are_simulated_not_measured_again():
    plan = sim_validate.bench_settings(True)
    plan["reused"] = ["cluster", "sched"]
    assert sim_validate.bench_steps(plan) == 0
    sim_s = validate.table1_row(2, 0, 16 << 20, GOODPUT)
    ring_s = validate.table1_row(2, 0, 16 << 20, GOODPUT, "ring")
    res = sim_validate.bench_run(plan, reused=_measured(sim_s * 1.25, ring_s))
    assert res["plan"]["table1"] == {"sizes": [16 << 20]}  # the measuring section's plan
    byteps_row, gloo_row = res["rows"]
    assert byteps_row["label"] == "byteps n=2 k=0 16 MiB"
    assert byteps_row["ratio"] == pytest.approx(0.8)  # simulated / measured
    assert gloo_row["label"] == "gloo (ring) n=2 k=0 16 MiB" and gloo_row["ratio"] == 1.0
    md, targets = sim_validate.bench_markdown(res)
    assert "not run again" in md and "byteps n=2 k=0 16 MiB" in md
    (t,) = targets
    assert t["measured"].startswith("1 of 2; worst byteps n=2 k=0 16 MiB: 0.80")
