"""byteps.torch.pipeline (PipeDream): the partitioner against a brute-force search, the 1F1B
schedule against the reference simulator (no deadlock, 1F1B order), the profiler on real layers,
the tensor header's bounds, and two 4-worker jobs: training on sklearn's digits (the semantics
of every plan equal the single-process reference of its schedule; the accuracy of 2-, 3- and
4-stage plans, one with replicated stages, within 2 points of byteps data parallelism), and a
stage process killed with SIGKILL failing every other rank at once."""

from __future__ import annotations

import itertools
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs import PY, assert_marker, framework_env, launch_config, launch_job, skip_without_ucx

torch = pytest.importorskip("torch")
pytest.importorskip("byteps._core", reason="the byteps core is not built")

import pipeline_reference as ref  # noqa: E402

from byteps.errors import InvalidArgumentError  # noqa: E402
from byteps.torch import pipeline  # noqa: E402
from byteps.torch.pipeline import schedule, transport  # noqa: E402
from byteps.torch.pipeline.partitioner import CostModel, byteps_sync_time  # noqa: E402
from byteps.torch.pipeline.profiler import LayerProfile  # noqa: E402

pytestmark = pytest.mark.torch

WORKER = Path(__file__).resolve().parent / "workers" / "pipeline_worker.py"


# ------------------------------------------------------------------------------ partitioner --
def compositions(total, parts):
    """Every way to write ``total`` as ``parts`` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def brute_force(layers, workers, bandwidth, **kw):
    cm = CostModel(layers, workers, bandwidth, **kw)
    best = None
    for k in range(1, min(len(layers), workers) + 1):
        for sizes in compositions(len(layers), k):
            ranges, first = [], 0
            for size in sizes:
                ranges.append((first, first + size - 1))
                first += size
            for reps in compositions(workers, k):
                t, _ = cm.evaluate([(a, b, r) for (a, b), r in zip(ranges, reps)])
                if best is None or t < best[0]:
                    best = (t, ranges, reps)
    return best


layer_st = st.builds(
    LayerProfile, name=st.just("l"),
    forward_s=st.floats(1e-4, 1.0), backward_s=st.floats(1e-4, 2.0),
    activation_bytes=st.integers(0, 1 << 26), param_bytes=st.integers(0, 1 << 28))


@settings(max_examples=150, deadline=None)
@given(layers=st.lists(layer_st, min_size=1, max_size=6), workers=st.integers(1, 5),
       bandwidth=st.floats(1e7, 1e10), ring=st.booleans())
def test_partitioner_matches_brute_force(layers, workers, bandwidth, ring):
    kw = {}
    if ring:  # PipeDream's all-reduce among the replicas, instead of byteps' model
        kw["sync_time"] = lambda p, m: 4 * (m - 1) * p / (m * bandwidth)
    plan = pipeline.partition(layers, workers, bandwidth, **kw)
    want, _, _ = brute_force(layers, workers, bandwidth, **kw)
    assert plan.time_per_minibatch == pytest.approx(want, rel=1e-9, abs=1e-15)
    # the plan is well formed and its own evaluation is its prediction
    pipeline.check_plan(plan, len(layers), workers)
    cm = CostModel(layers, workers, bandwidth, **kw)
    t, _ = cm.evaluate([(s.first, s.last, s.replicas) for s in plan.stages])
    assert t == pytest.approx(plan.time_per_minibatch, rel=1e-12)


def lp(f, a, p):
    return LayerProfile("l", f / 3, 2 * f / 3, a, p)


def test_partitioner_chooses_by_the_costs():
    # cheap parameters: data parallelism (one stage, every worker)
    layers = [lp(0.01, 1 << 20, 1 << 10) for _ in range(4)]
    plan = pipeline.partition(layers, 4, 1e9)
    assert [(s.first, s.last, s.replicas) for s in plan.stages] == [(0, 3, 4)]
    # a huge last layer (VGG's FC): it gets a stage of its own, unreplicated, the convolutions
    # the other workers
    layers = [lp(0.03, 1 << 16, 1 << 12) for _ in range(3)] + [lp(0.005, 4000, 400 << 20)]
    plan = pipeline.partition(layers, 4, 1.25e8)
    assert plan.stages[-1].replicas == 1 and plan.stages[-1].first == 3
    assert plan.time_per_minibatch < pipeline.data_parallel_time(layers, 4, 1.25e8) / 2
    assert plan.throughput == pytest.approx(1 / plan.time_per_minibatch)
    d = plan.to_dict()
    assert pipeline.Plan.from_dict(d) == plan and d["stages"][-1]["ranks"] == [3]
    with pytest.raises(InvalidArgumentError):
        pipeline.partition([], 2, 1e9)
    with pytest.raises(InvalidArgumentError):
        pipeline.partition(layers, 0, 1e9)
    assert byteps_sync_time(4, 1e9)(1e9, 1) == 0


# -------------------------------------------------------------------------------- schedule --
@settings(max_examples=60, deadline=None)
@given(replicas=st.lists(st.integers(1, 4), min_size=1, max_size=5), rounds=st.integers(1, 4))
def test_schedule_never_deadlocks(replicas, rounds):
    n = schedule.usable_minibatches_lcm(replicas) * rounds
    ref.check_schedule(replicas, n)


def test_schedule_is_1f1b_with_startup():
    reps = [1, 1, 1, 1]
    assert schedule.warmup_counts(reps) == [3, 2, 1, 0]
    assert schedule.ops(3, 0, reps, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                           ("B", 2), ("F", 3), ("B", 3)]
    assert schedule.ops(1, 0, reps, 5) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3),
                                           ("B", 1), ("F", 4), ("B", 2), ("B", 3), ("B", 4)]
    # a replicated stage: round-robin minibatches, and enough startup for the next stage
    assert schedule.ops(0, 1, [2, 1], 4) == [("F", 1), ("F", 3), ("B", 1), ("B", 3)]
    assert schedule.usable_minibatches(45, [2, 3, 1]) == 42
    with pytest.raises(InvalidArgumentError):
        schedule.ops(0, 0, [2, 1], 3)
    assert schedule.tag(1, schedule.GRAD, 5) == (1 << 48) | (2 << 40) | 5


# -------------------------------------------------------------------------------- profiler --
def test_profiler_measures_the_real_layers():
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    prof = pipeline.profile(model, torch.randn(16, 32), repeats=3)
    assert [p.activation_bytes for p in prof] == [16 * 256 * 4, 16 * 256 * 4, 16 * 10 * 4]
    assert [p.param_bytes for p in prof] == [(32 * 256 + 256) * 4, 0, (256 * 10 + 10) * 4]
    assert all(p.forward_s > 0 and p.backward_s > 0 for p in prof)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError):
        pipeline.profile(torch.nn.Linear(2, 2), torch.randn(1, 2))


def test_tensor_header_bounds():
    t = torch.zeros(3, 4, dtype=torch.float64)
    raw = transport.encode_header(t, 7)
    assert transport.decode_header(raw) == (torch.float64, [3, 4], 7)
    for bad in (raw[:5], raw[:-1], raw + b"\0", b"\xff" + raw[1:], raw[:1] + b"\x40" + raw[2:]):
        with pytest.raises(InvalidArgumentError):
            transport.decode_header(bad)
    with pytest.raises(InvalidArgumentError):
        transport.encode_header(torch.zeros(1, dtype=torch.complex64), 0)
    huge = transport.encode_header(torch.zeros(0, 0), 0)[:-16] + struct.pack("<2q", 1 << 40,
                                                                             1 << 40)
    with pytest.raises(InvalidArgumentError, match="more than"):
        transport.decode_header(huge)


# ------------------------------------------------------------------------------------ jobs --
def launch(mode, *args, timeout=240, env=()):
    return launch_job(launch_config(4, 1), [PY, WORKER, mode, *args], timeout=timeout,
                      job_env=framework_env(), env=env)


def test_pipelines_train_like_data_parallelism_with_pipedream_semantics():
    job = launch("train")
    assert_marker(job, "PIPELINE_OK", 4)
    assert job.output.count("SEMANTICS") == 12, job.output[-4000:]


@pytest.mark.parametrize("van,victim", [pytest.param("tcp", 2, id="tcp-middle-stage"),
                                         pytest.param("ucx", 3, id="ucx-last-stage",
                                                      marks=[skip_without_ucx(),
                                                             pytest.mark.slow])])
def test_a_killed_stage_fails_every_other_rank(van, victim):
    """(The UCX variant is in the slow session: the default one's time budget; test_p2p kills
    a UCX peer in every session.)"""
    env = ["DMLC_ENABLE_UCX=1"] if van == "ucx" else []
    job = launch("kill", str(victim), timeout=120, env=env)
    assert job.returncode != 0
    lost = re.findall(r"PIPELINE_PEER_LOST rank=(\d) seconds=([\d.]+)", job.output)
    assert sorted(int(r) for r, _ in lost) == sorted({0, 1, 2, 3} - {victim}), \
        job.output[-4000:]
    assert all(float(s) < 10 for _, s in lost), lost
    assert "PIPELINE_NO_ERROR" not in job.output
