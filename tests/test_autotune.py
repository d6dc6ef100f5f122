"""BYTEPS_AUTOTUNE (docs/autotune.md): the search (byteps._core.AutotuneSearch), the knobs, and
multi-process jobs under ``bpslaunch`` whose push_pull results stay exact across every switch
of (partition bytes, credit), where every worker logs the same trials and choice and the log
file has one line per trial plus the choice."""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import pytest
from jobs import TESTS, assert_ok, run_job, worker_lines

from byteps import _core

WORKER = str(TESTS / "workers" / "autotune_worker.py")
PARTS, CREDITS = _core.AutotuneSearch.default_grid()


# ------------------------------------------------------------------------------ the search --


def run_search(cost, start=(262144, 4), partitions=PARTS, credits=CREDITS, max_trials=64):
    s = _core.AutotuneSearch(start, list(partitions), list(credits), max_trials)
    tried = []
    while (p := s.next()) is not None:
        tried.append(p)
        s.report(p, cost(*p))
    return tried, s.best()


def test_search_finds_the_minimum_of_a_separable_cost():
    # minimum at (1 MiB, 8): first every partition size at credit 4, then every credit there
    def cost(p, c):
        return abs(PARTS.index(p) - 4) + abs(CREDITS.index(c) - 3) + 1.0
    tried, (best, t) = run_search(cost)
    assert best == (1 << 20, 8) and t == 1.0
    assert tried[0] == (262144, 4)  # the start point first
    assert len(tried) == len(set(tried))  # no point twice
    assert {p for p, c in tried if c == 4} == set(PARTS)
    assert {c for p, c in tried if p == 1 << 20} == set(CREDITS)
    # the credit moved: the neighbouring partition sizes at the new credit are tried last
    assert set(tried[-2:]) == {(512 << 10, 8), (2 << 20, 8)}
    assert len(tried) <= len(PARTS) + len(CREDITS) + 1


def test_search_is_deterministic_and_ties_go_to_the_earliest():
    def cost(p, c):
        return 1.0  # all equal
    a, best_a = run_search(cost)
    b, best_b = run_search(cost)
    assert a == b and best_a == best_b == ((262144, 4), 1.0)
    assert len(a) == len(PARTS) + len(CREDITS) - 1  # no third phase: the credit did not move


def test_search_holds_a_fixed_axis_and_respects_max_trials():
    tried, (best, _) = run_search(lambda p, c: p / 1e6 + c, start=(262144, 3),
                                  partitions=[262144])
    assert {p for p, _ in tried} == {262144}
    assert sorted(c for _, c in tried) == sorted(set(CREDITS) | {3})  # the start's own credit
    assert best == (262144, 1)
    tried, _ = run_search(lambda p, c: 1.0, max_trials=3)
    assert len(tried) == 3


def test_search_start_point_off_the_grid_and_unlimited_credit():
    tried, (best, _) = run_search(lambda p, c: 5.0 if c == 0 else 9.0, start=(300000, 0))
    assert tried[0] == (300000, 0) and best == (300000, 0)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(3)))[:3])
def test_search_choice_is_the_measured_minimum(perm):
    import random

    rnd = random.Random(sum(perm))
    costs = {}

    def cost(p, c):
        return costs.setdefault((p, c), rnd.random())
    tried, (best, t) = run_search(cost)
    assert t == min(costs[p] for p in tried) and costs[best] == t


def test_knobs_registered():
    names = {k["name"]: k for k in _core.knobs()}
    for n in ("BYTEPS_AUTOTUNE", "BYTEPS_AUTOTUNE_LOG", "BYTEPS_AUTOTUNE_WARMUP_SAMPLES",
              "BYTEPS_AUTOTUNE_STEPS_PER_SAMPLE", "BYTEPS_AUTOTUNE_MAX_SAMPLES"):
        assert n in names
    assert names["BYTEPS_AUTOTUNE"]["default"] == "0"


# ------------------------------------------------------------------------------------ jobs --

FAST = ["BYTEPS_AUTOTUNE=1", "BYTEPS_AUTOTUNE_WARMUP_SAMPLES=1",
        "BYTEPS_AUTOTUNE_STEPS_PER_SAMPLE=2"]


def statuses(out, size):
    res = []
    for r in range(size):
        lines = [x for x in worker_lines(out, r) if x.startswith("AUTOTUNE ")]
        assert lines, f"rank {r} printed no AUTOTUNE line:\n{out[-4000:]}"
        res.append(json.loads(lines[-1][len("AUTOTUNE "):]))
    return res


def read_log(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
@pytest.mark.timeout(300)
def test_job_tunes_with_exact_results_and_agrees(tmp_path):
    """2 worker machines, 2 servers: the trials of 64 KiB to 512 KiB partitions re-cut the 32 MiB
    gradient (new keys, re-declared), results checked every iteration; all workers log the same trials and
    choice; one log file per rank ({rank}), one line per trial plus the choice; the servers
    free every old cut's keys and end holding only the last cut's."""
    log = tmp_path / "tune.{rank}.jsonl"
    rc, out, _ = run_job(["--workers", "2", "--servers", "2"], "train", "60", script=WORKER,
                         env=FAST + [f"BYTEPS_AUTOTUNE_LOG={log}", "BYTEPS_LOG_LEVEL=INFO"],
                         timeout=240)
    assert_ok(rc, out, 2, min_cases=60 * 4)
    st = statuses(out, 2)
    assert st[0] == st[1], "workers disagree on the trials or the choice"
    s = st[0]
    assert s["enabled"] and s["done"] and not s["error"]
    n = len(s["trials"])
    # every partition size at the start credit, every other credit at the best of them, then,
    # if the best credit moved, the best partition size's neighbours on the grid (one at its
    # ends) at that credit
    first = len(PARTS) + len(CREDITS) - 1
    start, best = s["trials"][0], min(s["trials"][:first], key=lambda t: t["iteration_s"])
    at = PARTS.index(best["partition_bytes"])
    neighbours = (at > 0) + (at < len(PARTS) - 1)
    assert n == first + (0 if best["credit"] == start["credit"] else neighbours), s["trials"]
    assert {t["partition_bytes"] for t in s["trials"]} == set(PARTS)
    times = [t["iteration_s"] for t in s["trials"]]
    assert s["choice"]["iteration_s"] == min(times)
    assert s["current"] == {k: s["choice"][k] for k in ("partition_bytes", "credit")}
    logs = [read_log(tmp_path / f"tune.{r}.jsonl") for r in range(2)]
    for lines in logs:
        assert [x["event"] for x in lines] == ["trial"] * n + ["choice"]
        assert [x["trial"] for x in lines[:-1]] == list(range(n))
        assert all(x["workers"] == 2 and x["steps"] == 2 for x in lines[:-1])
        assert lines[-1]["trials"] == n
        for x, t in zip(lines, s["trials"]):
            assert (x["partition_bytes"], x["credit"]) == (t["partition_bytes"], t["credit"])
            assert x["iteration_s"] == pytest.approx(t["iteration_s"], rel=1e-5)
    # the averaged times (and so the choice) are the same on both; the local ones differ
    strip = [[{k: v for k, v in x.items() if k != "local_iteration_s"} for x in lines]
             for lines in logs]
    assert strip[0] == strip[1]
    for r in range(2):  # the INFO line of the choice, on every worker
        assert re.search(rf"rank {r}: autotune: chose partition {s['choice']['partition_bytes']} "
                         rf"B, credit {s['choice']['credit']}", out), out[-4000:]
    # The servers freed every old cut's keys once both workers had declared the new one: at
    # shutdown each holds only keys of its tensors' last cut.
    assert re.search(r"\[server \d\].*retiring \d+ keys of tensor \d+ \(generations below "
                     r"\d+, cut anew\)", out), out[-4000:]
    held = re.findall(r"\[server (\d)\].* (\d+) keys held at shutdown, (\d+) of them of a "
                      r"tensor's older cut", out)
    assert sorted(x[0] for x in held) == ["0", "1"], out[-4000:]
    assert all(int(keys) > 0 and stale == "0" for _, keys, stale in held), held


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
@pytest.mark.timeout(300)
def test_job_holds_a_set_knob_and_writes_one_log_on_rank0(tmp_path):
    log = tmp_path / "tune.jsonl"
    rc, out, _ = run_job(["--workers", "2", "--servers", "1"], "train", "40", script=WORKER,
                         env=FAST + [f"BYTEPS_AUTOTUNE_LOG={log}",
                                     "BYTEPS_PARTITION_BYTES=131072",
                                     "BYTEPS_AUTOTUNE_MAX_SAMPLES=3"], timeout=240)
    assert_ok(rc, out, 2, min_cases=40 * 4)
    st = statuses(out, 2)
    assert st[0] == st[1]
    assert len(st[0]["trials"]) == 3
    assert {t["partition_bytes"] for t in st[0]["trials"]} == {131072}
    lines = read_log(log)
    assert [x["event"] for x in lines] == ["trial"] * 3 + ["choice"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
@pytest.mark.timeout(120)
def test_job_with_local_size_2_is_a_config_error():
    rc, out, _ = run_job(["--workers", "2", "--servers", "1", "--local-size", "2"], "train",
                         "1", script=WORKER, env=["BYTEPS_AUTOTUNE=1"], timeout=100)
    assert rc != 0
    assert "ConfigError" in out and "BYTEPS_AUTOTUNE=1 with BYTEPS_LOCAL_SIZE=2" in out, \
        out[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
@pytest.mark.timeout(120)
def test_single_machine_job_ignores_it():
    rc, out, _ = run_job(["--workers", "1"], "train", "3", script=WORKER,
                         env=["BYTEPS_AUTOTUNE=1"], timeout=100)
    assert_ok(rc, out, 1)
    assert "BYTEPS_AUTOTUNE=1 ignored" in out
    assert statuses(out, 1)[0]["enabled"] is False
