"""The compression benchmarks (benchmarks.compression): each part at a tiny size gives finite
positive numbers, the wire bytes shrink with the compressor, and the section renders with its
targets. The cluster and training parts need root and iproute2 (skipped otherwise); about 60 s
in all."""

from __future__ import annotations

import importlib
import json
import math

import pytest

from benchmarks import cluster as bc
from benchmarks import compression as bcomp

pytestmark = [pytest.mark.bench]

netns = pytest.mark.skipif(bc.netns_unavailable() is not None,
                           reason=f"emulated cluster unavailable: {bc.netns_unavailable()}")


def test_hooks_are_wired():
    from benchmarks import cli

    plugin = importlib.import_module(cli.PLUGINS["compression"])
    assert plugin is bcomp
    plan = plugin.bench_settings(True)
    assert plan["parts"] == ["cluster", "throughput", "training"]
    netns_ok = plan["unavailable"] is None
    # cluster: build + uncompressed + onebit; throughput: probe + 2; training: build + 2
    assert plugin.bench_steps(plan) == (3 if netns_ok else 1) + 3 + (3 if netns_ok else 1)
    full = plugin.bench_settings(False)
    assert [tuple(c) for c in full["configs"]] == [(2, 2), (4, 4)]
    assert full["bytes"] == 64 << 20 and full["bandwidth_mbit"] == 100
    assert full["compressors"] == ["onebit", "topk", "dithering", "randomk", "fp16"]
    assert set(full["train_models"]) == {"mlp", "cnn"}
    # --compression PARTS chooses the parts; --compression alone runs the section alone
    args = cli.parse_args(["--compression", "throughput"])
    plans = cli._plans(args, {"compression": cli.available()["compression"]})
    assert plans["compression"]["parts"] == ["throughput"]
    assert cli.parse_args(["--compression"]).compression == ""
    assert bcomp.core_kwargs("topk+ef") == {"compressor_type": "topk", "compressor_k": 0.01,
                                            "ef_type": "vanilla"}


def test_throughput_tiny():
    plan = bcomp.bench_settings(False, parts=["throughput"], tp_bytes=1 << 20,
                                tp_partition_bytes=256 << 10, tp_seconds=0.02,
                                tp_entries=["onebit", "fp16", "topk+ef", "dithering"],
                                probe_bytes=8 << 20, probe_repeats=1)
    labels = []
    res = bcomp.bench_run(plan, labels.append)
    assert len(labels) == bcomp.bench_steps(plan)
    part = res["throughput"]
    assert part["membw"]["best"] > 0
    for name, row in part["rows"].items():
        assert set(row) == {str(1 << 20), str(256 << 10)}, name
        for v in row.values():
            assert "error" not in v, (name, v)
            assert all(math.isfinite(x) and 0.001 < x < 10_000 for x in v.values()), (name, v)
    md, targets = bcomp.bench_markdown(json.loads(json.dumps(res)))
    assert "### Compressor throughput" in md and "| onebit (scaled) |" in md
    assert "| dithering k = 4 |" in md and "| top-k 1 % + EF |" in md
    names = [t["name"] for t in targets]
    assert len(targets) == 4 and all("memory bandwidth" in n for n in names)
    assert all(t["met"] in (True, False) and t["ratio"] > 0 for t in targets)


@netns
def test_cluster_tiny():
    plan = bcomp.bench_settings(False, parts=["cluster"], configs=[[2, 2]], bytes=1 << 20,
                                compressors=["onebit", "fp16"],
                                iters={"none": 1, "compressed": 1}, link_seconds=0.5)
    before = set(bc.list_netns())
    labels = []
    res = bcomp.bench_run(plan, labels.append)
    assert len(labels) == bcomp.bench_steps(plan)
    assert not bc.own_netns_left(before)
    (row,) = res["cluster"]["rows"]
    jobs = row["jobs"]
    for name in ("none", "onebit", "fp16"):
        assert "error" not in jobs[name], (name, jobs[name])
        assert math.isfinite(jobs[name]["time_s"]) and jobs[name]["time_s"] > 0
        assert jobs[name]["worker_cpu_s"] > 0, jobs[name]
    # the wire: 1 MiB pushed uncompressed, ~1/32 with onebit, ~1/2 with fp16 (frames included)
    sent = {n: jobs[n]["tx_bytes"] for n in jobs}
    assert (1 << 20) <= sent["none"] < 1.2 * (1 << 20), sent
    assert sent["onebit"] < sent["none"] / 15, sent
    assert 0.4 * sent["none"] < sent["fp16"] < 0.6 * sent["none"], sent
    md, targets = bcomp.bench_markdown(json.loads(json.dumps(res)))
    for col in ("compressor", "time (s)", "speed-up", "sent / worker (MB)",
                "received / worker (MB)", "network-bound time (s)", "worker CPU (ms)",
                "servers' CPU (ms)", "CPU-bound time (s)", "CPU busy"):
        assert f"| {col} |" in md, col
    assert "| 2 | 2 |" in md and "failed" not in md
    (t_onebit, t_fp16) = targets
    assert t_onebit["threshold"] == 8.0 and t_fp16["met"] is None
    assert t_onebit["ratio"] > 0


@netns
def test_training_tiny():
    # 800 Mbit/s: the uncompressed CNN's 4 MiB per step must not make the smoke test slow
    plan = bcomp.bench_settings(False, parts=["training"], bandwidth_mbit=800.0,
                                train_models={"mlp": {"epochs": 2}, "cnn": {"epochs": 2}})
    before = set(bc.list_netns())
    res = bcomp.bench_run(plan, lambda label: None)
    assert not bc.own_netns_left(before)
    rows = res["training"]["rows"]
    assert [(r["model"], r["variant"]) for r in rows] == [
        ("mlp", "none"), ("mlp", "onebit+ef"), ("cnn", "none"), ("cnn", "onebit+ef")]
    for r in rows:
        assert "error" not in r, r
        assert 0.5 < r["accuracy"] <= 1.0 and 0 < r["step_s"] < 5.0, r
    md, targets = bcomp.bench_markdown(json.loads(json.dumps(res)))
    assert "| mlp | onebit + EF | 2 | 4096 |" in md and "| cnn | none | 2 | 65536 |" in md
    assert len(targets) == 4 and [t["met"] is None for t in targets] == [False, True] * 2


def test_from_json_merges_files(tmp_path):
    """--from-json with several files renders every file's sections (later files win)."""
    from benchmarks import cli

    plan = bcomp.bench_settings(False, parts=["throughput"], tp_bytes=1 << 20,
                                tp_seconds=0.02, tp_entries=["onebit", "fp16"],
                                probe_bytes=8 << 20, probe_repeats=1)
    comp = bcomp.bench_run(plan)
    first = tmp_path / "full.json"
    first.write_text(json.dumps({"command": "python -m benchmarks", "elapsed_s": 60.0,
                                 "date": "d", "machine": {"cpu": "X"},
                                 "results": {"cluster": {"plan": {}, "skipped": "no root"}}}))
    second = tmp_path / "comp.json"
    second.write_text(json.dumps({"command": "python -m benchmarks --compression",
                                  "elapsed_s": 30.0, "date": "e", "machine": {"cpu": "Y"},
                                  "results": {"compression": comp}}))
    out = tmp_path / "p.md"
    assert cli.main(["--from-json", str(first), str(second), "--out", str(out)]) == 0
    page = out.read_text()
    assert "## Emulated cluster" in page and "Not measured: no root." in page
    assert "## Gradient compression" in page and "### Compressor throughput" in page
    assert "Regenerate: `python -m benchmarks` (1.5 min)." in page and "on X," in page
    assert page.index("## Emulated cluster") < page.index("## Gradient compression")
