"""The timeline (BYTEPS_TRACE_*) and push_pull telemetry (docs/timeline.md).

Jobs run tests/workers/trace_worker.py under bpslaunch: three tensors (1 000, 300 000 and
70 000 float32 elements, several partitions) push_pulled for a number of steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from jobs import PY, TESTS, assert_ok, clean_job_env, launch_config, run_job, tail, worker_lines

from byteps.launch.local import build_local_plan

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux /proc and /dev/shm"
)

TRACE_WORKER = str(TESTS / "workers" / "trace_worker.py")
TENSORS = {"trace.small": 1_000, "trace.large": 300_000, "trace.mid": 70_000}

#: the stage plan of each layout (docs/architecture.md §3)
PLAN_ONE = ["COPY_OUT"]
PLAN_ROOT = ["COPY_IN", "LOCAL_REDUCE", "PUSH", "PULL", "COPY_OUT"]
PLAN_OTHER = ["COPY_IN", "LOCAL_REDUCE", "COPY_OUT"]


def load_trace(path: Path) -> dict:
    with open(path) as f:
        data = json.load(f)
    assert isinstance(data.get("traceEvents"), list), f"{path}: no traceEvents list"
    assert data.get("displayTimeUnit") in ("ms", "ns"), f"{path}: no displayTimeUnit"
    for e in data["traceEvents"]:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert e["ts"] > 0 and e["dur"] >= 0, e
    return data


def check_trace(path: Path, plan, steps, rank, partitions=None, server_times=False):
    """The file has, for every tensor and step of `steps`, one push_pull event and, for every
    partition of it, one event per stage of `plan` inside the push_pull's span; nothing else."""
    data = load_trace(path)
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {rank}
    # Tracks of one pid never overlap (Perfetto shows overlapping slices of a track badly).
    by_tid = defaultdict(list)
    for e in xs:
        by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for tid, spans in by_tid.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-3, f"{path}: overlapping events on track {tid}"
    tensor_events = {(e["args"]["tensor"], e["args"]["step"]): e
                     for e in xs if e["cat"] == "push_pull"}
    assert len(tensor_events) == sum(e["cat"] == "push_pull" for e in xs), "duplicate events"
    assert set(tensor_events) == {(t, s) for t in TENSORS for s in steps}, sorted(tensor_events)
    stage_events = defaultdict(list)
    for e in xs:
        if e["cat"] == "push_pull":
            continue
        a = e["args"]
        assert a["stage"] == e["cat"]
        stage_events[(a["tensor"], a["step"], a["partition"])].append(e)
    seen = set()
    for (tensor, step), te in tensor_events.items():
        assert te["args"]["bytes"] == TENSORS[tensor] * 4
        nparts = te["args"]["partitions"]
        if partitions is not None:
            partitions.setdefault(tensor, nparts)
            assert partitions[tensor] == nparts
        for p in range(nparts):
            evs = stage_events.get((tensor, step, p), [])
            seen.add((tensor, step, p))
            assert sorted(e["cat"] for e in evs) == sorted(plan), (tensor, step, p, evs)
            lo, hi = te["ts"], te["ts"] + te["dur"]
            for e in evs:
                assert lo - 1 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1, (te, e)
                assert e["args"]["key"] == (te["args"]["key"] << 16) + p
                if server_times and e["cat"] == "PULL":
                    assert e["args"]["server_sum_us"] >= 0 and "server_wait_us" in e["args"]
    assert set(stage_events) == seen, "stage events outside the traced push_pulls"
    return xs


def telemetry_of(out: str, rank: int) -> dict:
    for line in worker_lines(out, rank):
        if line.startswith("TELEMETRY "):
            return json.loads(line[len("TELEMETRY "):])
    raise AssertionError(f"rank {rank} printed no TELEMETRY line:\n{tail(out)}")


def check_telemetry(tel: dict, steps: int, expect_samples: bool) -> None:
    assert tel["before"] == [0, -5.0]
    assert set(tel["tensors"]) == set(TENSORS)
    for name, t in tel["tensors"].items():
        assert t["count"] == steps
        assert t["bytes"] == TENSORS[name] * 4 * steps
        assert 0 < t["mean_ms"] < 10_000
        assert t["MB_per_s"] > 0
        # bytes / total time: consistent with mean_ms
        assert t["MB_per_s"] == pytest.approx(TENSORS[name] * 4 / t["mean_ms"] / 1e3, rel=1e-6)
    if expect_samples:
        assert tel["speeds"], "no get_pushpull_speed sample after the traffic"
        for ms, speed in tel["speeds"]:
            assert ms > 1.5e12 and speed > 0


@pytest.mark.timeout(300)
def test_trace_two_machines_local_two(tmp_path):
    """2 worker machines x 2 local processes + 1 server on this host: one file per worker
    machine and local rank (bpslaunch gives each machine its own directory), every stage of
    each layout's plan for every partition in the window [2, 4), server times under PULL."""
    trace = tmp_path / "trace"
    steps = 6
    rc, out, _ = run_job(
        launch_config(2, 1, local_size=2), "steps", str(steps), script=TRACE_WORKER,
        env=["BYTEPS_TRACE_ON=1", "BYTEPS_TRACE_START_STEP=2", "BYTEPS_TRACE_END_STEP=4",
             f"BYTEPS_TRACE_DIR={trace}", "BYTEPS_TELEMETRY_INTERVAL=0.01"])
    assert_ok(rc, out, 4)
    files = sorted(p.relative_to(trace).as_posix() for p in trace.rglob("*") if p.is_file())
    assert files == ["worker0/0/comm.json", "worker0/1/comm.json", "worker1/0/comm.json",
                     "worker1/1/comm.json"], files
    partitions = {}
    for w in range(2):
        for lr in range(2):
            rank = w * 2 + lr
            path = trace / f"worker{w}" / str(lr) / "comm.json"
            check_trace(path, PLAN_ROOT if lr == 0 else PLAN_OTHER, {2, 3}, rank, partitions,
                        server_times=lr == 0)
            assert f"TRACE_PATH {path}" in worker_lines(out, rank)
            check_telemetry(telemetry_of(out, rank), steps, expect_samples=True)
    assert partitions["trace.large"] > 1 and partitions["trace.small"] == 1


@pytest.mark.timeout(200)
def test_trace_single_machine_written_at_shutdown_and_off(tmp_path):
    """One process: the COPY_OUT plan; a window that never closes ([3, 100) of 5 steps) is
    written at shutdown with steps 3 and 4; with BYTEPS_TRACE_ON=0 nothing is written."""
    trace = tmp_path / "on"
    rc, out, _ = run_job(
        launch_config(1), "steps", "5", script=TRACE_WORKER,
        env=["BYTEPS_TRACE_ON=1", "BYTEPS_TRACE_START_STEP=3", "BYTEPS_TRACE_END_STEP=100",
             f"BYTEPS_TRACE_DIR={trace}"])
    assert_ok(rc, out, 1)
    assert [p.relative_to(trace).as_posix() for p in trace.rglob("*")] == ["0", "0/comm.json"]
    check_trace(trace / "0" / "comm.json", PLAN_ONE, {3, 4}, 0)
    # the default 10 s sample period has not passed: no sample, and telemetry still counts
    check_telemetry(telemetry_of(out, 0), 5, expect_samples=False)
    assert telemetry_of(out, 0)["speeds"] == []

    off = tmp_path / "off"
    rc, out, _ = run_job(launch_config(1), "steps", "5", script=TRACE_WORKER,
                         env=[f"BYTEPS_TRACE_DIR={off}", "BYTEPS_TELEMETRY_ON=0"])
    assert_ok(rc, out, 1)
    assert not off.exists()
    tel = telemetry_of(out, 0)
    assert tel["tensors"] == {} and tel["speeds"] == [] and tel["before"] == [0, -5.0]


def test_trace_window_must_not_be_empty():
    code = ("import byteps.basics as b\nfrom byteps import errors\n"
            "try:\n    b.init()\nexcept errors.ConfigError as e:\n    print('CONFIG', e)\n")
    env = clean_job_env({"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "5",
                         "BYTEPS_TRACE_END_STEP": "5"})
    r = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "CONFIG" in r.stdout and "BYTEPS_TRACE_END_STEP=5" in r.stdout, r.stdout + r.stderr


def test_launcher_gives_each_worker_machine_its_trace_dir():
    specs = build_local_plan(3, 1, ["true"], local_size=2, port=1234,
                             base_env={"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_DIR": "/t"})
    dirs = {(s.env["DMLC_WORKER_ID"], s.env["BYTEPS_LOCAL_RANK"]): s.env["BYTEPS_TRACE_DIR"]
            for s in specs if s.env["DMLC_ROLE"] == "worker"}
    assert dirs == {(str(w), str(lr)): f"/t/worker{w}" for w in range(3) for lr in range(2)}
    # one worker machine, or the timeline off: the directory is left as given
    for workers, on in ((1, "1"), (2, "0")):
        specs = build_local_plan(workers, 1, ["true"], port=1234,
                                 base_env={"BYTEPS_TRACE_ON": on, "BYTEPS_TRACE_DIR": "/t"})
        assert {s.env["BYTEPS_TRACE_DIR"] for s in specs} == {"/t"}


def test_get_pushpull_speed_before_init_and_exports():
    import byteps.basics as b
    from byteps import errors, telemetry

    assert b.get_pushpull_speed is telemetry.get_pushpull_speed
    assert b.get_telemetry is telemetry.get_telemetry
    if not b.is_initialized():
        assert b.get_pushpull_speed() == (0, -5.0)
        with pytest.raises(errors.NotInitializedError):
            b.get_telemetry()


@pytest.mark.torch
def test_torch_exports_get_pushpull_speed():
    torch_bps = pytest.importorskip("byteps.torch")
    from byteps import telemetry

    assert torch_bps.get_pushpull_speed is telemetry.get_pushpull_speed
    assert "get_pushpull_speed" in torch_bps.__all__ and "get_telemetry" in torch_bps.__all__


@pytest.mark.timeout(200)
def test_render_one_step(tmp_path):
    """benchmarks.timeline_plot.render draws a step of the files of a job as a PNG."""
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(TESTS.parent))
    from benchmarks.timeline_plot import render

    trace = tmp_path / "trace"
    rc, out, _ = run_job(launch_config(2, 1), "steps", "4", script=TRACE_WORKER,
                         env=["BYTEPS_TRACE_ON=1", "BYTEPS_TRACE_START_STEP=1",
                              "BYTEPS_TRACE_END_STEP=3", f"BYTEPS_TRACE_DIR={trace}"])
    assert_ok(rc, out, 2)
    paths = sorted(trace.rglob("comm.json"))
    assert len(paths) == 2
    for w, p in enumerate(paths):
        check_trace(p, ["PUSH", "PULL", "COPY_OUT"], {1, 2}, w, server_times=True)
    png = tmp_path / "step.png"
    info = render(paths, png, title="test")
    assert info["step"] == 2 and info["ranks"] == [0, 1] and info["events"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="step 7"):
        render(paths, tmp_path / "x.png", step=7)
