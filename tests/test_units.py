"""Unit tests of the core's pieces (docs/architecture.md §3-§8), through ``byteps._core.testing`` and the
worker API of a single-machine job.

* partitioner: page-aligned bounds, exact non-overlapping cover, partition keys, local-reduce
  shards;
* scheduled queue: priority order, credit, head-of-line rule, blocking pop across threads;
* key plan: the paper's shares and optimal communication time (OSDI'20 §4.1), the greedy
  byte-balanced placement on ResNet-50 and VGG-16;
* frame codec: header validation and the control-message decoders, with a hypothesis fuzz;
* knobs: validation errors name the variable and value; ``docs/env.md`` is current;
* worker configuration errors through the real API (each in a fresh process): raised before
  any thread starts, process exits promptly; ``byteps.server`` without a scheduler address;
* single-machine push_pull of every dtype (one process with default env is a 1-worker job).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import byteps
import byteps.basics as basics
from benchmarks import models
from byteps import _core
from byteps._core import testing as T
from byteps.errors import ConfigError, NotInitializedError

ROOT = Path(__file__).resolve().parents[1]
PAGE = 4096
MAX_PARTS = 1 << 16
DTYPE_CODES = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "uint8": 3,
    "int32": 4,
    "int8": 5,
    "int64": 6,
    "bfloat16": 7,
}
ELEM_SIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1,
             "int32": 4, "int64": 8}
STORAGE = {"bfloat16": np.uint16}  # NumPy has no bfloat16: carry its bits in uint16

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _knobs_module():
    """``byteps.knobs``; loaded from core/knobs.py when the installed package lacks it."""
    try:
        return importlib.import_module("byteps.knobs")
    except ImportError:
        path = ROOT / "core" / "knobs.py"
        spec = importlib.util.spec_from_file_location("byteps_knobs_src", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def _knobs_cli():
    """argv prefix that runs the knobs CLI (``-m byteps.knobs`` when installed)."""
    if importlib.util.find_spec("byteps.knobs") is not None:
        return [sys.executable, "-m", "byteps.knobs"]
    return [sys.executable, str(ROOT / "core" / "knobs.py")]


def clean_env(**overrides):
    """os.environ without any BYTEPS_*/DMLC_* variable, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("BYTEPS_") or k.startswith("DMLC_"))}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


# =============================================================================================
# partitioner
# =============================================================================================


class TestPartitioner:
    def test_bound_default_is_page_aligned_already(self):
        assert T.partition_bound(4096000, 1) == 4096000  # 1000 pages exactly

    def test_bound_rounds_up_to_local_size_pages(self):
        assert T.partition_bound(4096000, 3) == 4104192  # ceil(4096000 / 12288) * 12288
        assert T.partition_bound(4096000, 8) == 4096000  # 125 * 8 pages
        assert T.partition_bound(4096000, 7) == 143 * 7 * PAGE
        assert T.partition_bound(1, 1) == PAGE
        assert T.partition_bound(PAGE + 1, 1) == 2 * PAGE
        assert T.partition_bound(PAGE, 2) == 2 * PAGE

    @FAST
    @given(st.integers(1, 1 << 31), st.integers(1, 64))
    def test_bound_property(self, nbytes, local_size):
        unit = PAGE * local_size
        b = T.partition_bound(nbytes, local_size)
        assert b % unit == 0
        assert nbytes <= b < nbytes + unit

    def test_partitions_cover_last_shorter(self):
        parts = T.partition(10000, 4096, 4)
        assert parts == [(0, 0, 4096), (1, 4096, 4096), (2, 8192, 10000 - 8192)]

    def test_exact_multiple_has_no_short_tail(self):
        parts = T.partition(3 * 4096, 4096, 4)
        assert [p[2] for p in parts] == [4096] * 3

    def test_zero_bytes_no_partitions(self):
        assert T.partition(0, 4096000, 4) == []

    def test_max_partitions(self):
        assert len(T.partition(MAX_PARTS * PAGE, PAGE, 1)) == MAX_PARTS
        with pytest.raises(ValueError, match="65536"):
            T.partition(MAX_PARTS * PAGE + 1, PAGE, 1)

    @pytest.mark.parametrize("bound,elem", [(4098, 4), (4100, 8), (0, 4), (4096, 0), (6, 4)])
    def test_bound_not_multiple_of_element(self, bound, elem):
        with pytest.raises(ValueError):
            T.partition(100000, bound, elem)

    @FAST
    @given(st.integers(0, 1 << 28), st.integers(1, 4096), st.sampled_from([1, 2, 4, 8]))
    def test_partition_cover_property(self, nbytes, bound_units, elem):
        bound = bound_units * 1024 * elem
        assume(-(-nbytes // bound) <= MAX_PARTS)
        parts = T.partition(nbytes, bound, elem)
        assert len(parts) == -(-nbytes // bound)
        pos = 0
        for i, (idx, off, length) in enumerate(parts):
            assert idx == i
            assert off == pos  # contiguous: no gap, no overlap
            assert 0 < length <= bound
            if i < len(parts) - 1:
                assert length == bound  # only the last one may be shorter
            pos += length
        assert pos == nbytes

    def test_partition_key(self):
        assert T.partition_key(0, 0) == 0
        assert T.partition_key(1, 0) == 1 << 16
        assert T.partition_key(3, 5) == (3 << 16) | 5
        assert T.partition_key(0xFFFFFFFF, 0xFFFF) == (0xFFFFFFFF << 16) | 0xFFFF
        keys = {T.partition_key(k, i) for k in range(20) for i in range(50)}
        assert len(keys) == 20 * 50  # injective over (key, index)

    @pytest.mark.parametrize("num_servers", [1, 2, 3, 4])
    def test_staggered_push_order_spreads_workers_over_servers(self, num_servers):
        # Round-robin plan (what equal shares give): at every step of the push sequence the
        # worker machines send to distinct servers, each starting at its own.
        servers = [i % num_servers for i in range(4 * num_servers)]
        seqs = []
        for worker in range(num_servers):
            pos = T.staggered_push_order(len(servers), worker)
            seq = sorted(range(len(servers)), key=lambda i: pos[i])
            assert seq == list(range(worker, len(servers))) + list(range(worker))  # a rotation
            seqs.append([servers[i] for i in seq])
        for step in zip(*seqs):
            assert len(set(step)) == num_servers, seqs

    def test_tensor_partition_bound(self):
        job = 256 << 10
        small = 60 << 10  # a partition + its frame header within one 65160-byte GSO packet
        # A tensor the job's bound would cut into fewer than 32 n partitions: n / (32 n)
        # rounded down to a multiple of 60 KiB, at least one.
        assert T.tensor_partition_bound(4 << 20, job, 4, 1) == small  # want 32 KiB
        assert T.tensor_partition_bound(4 << 20, job, 2, 1) == small  # want 64 KiB
        assert T.tensor_partition_bound(8 << 20, job, 2, 1) == 2 * small  # want 128 KiB
        assert T.tensor_partition_bound(4096, job, 8, 1) == small
        assert T.tensor_partition_bound(32 * 4 * job - 1, job, 4, 1) == 4 * small
        assert T.tensor_partition_bound(294 << 10 << 6, 4000 << 10, 2, 1) == 4 * small
        # Large tensors keep the job's bound.
        assert T.tensor_partition_bound(64 << 20, job, 2, 1) == job
        assert T.tensor_partition_bound(32 * 4 * job, job, 4, 1) == job
        # A job bound below the small one wins; whole local_size pages, rounded down.
        assert T.tensor_partition_bound(4 << 20, 16 << 10, 4, 1) == 16 << 10
        assert T.tensor_partition_bound(3 << 20, 3 * 4096 * 100, 2, 3) == 5 * 3 * 4096
        assert T.tensor_partition_bound(4 << 20, job, 4, 2) == 56 << 10
        assert T.tensor_partition_bound(4 << 20, job, 4, 32) == 32 * 4096

    @FAST
    @given(st.integers(1, 1 << 34), st.integers(1, 64), st.sampled_from([1, 2, 3, 4, 8]),
           st.integers(1, 1 << 12))
    def test_tensor_partition_bound_properties(self, nbytes, n, L, job_pages):
        from byteps.sim import ps_sim

        job = T.partition_bound(job_pages * 4096, L)
        b = T.tensor_partition_bound(nbytes, job, n, L)
        # the simulator and the cost model cut tensors as the core does
        assert ps_sim.partition_bound(job_pages * 4096, L) == job
        assert ps_sim.tensor_partition_bound(nbytes, job, n, L) == b
        assert 0 < b <= job
        if nbytes // (32 * n) >= job:
            assert b == job
        else:
            assert b % (4096 * L) == 0 or b == job
            # at most the pipeline's want (or one small partition, or one page unit)
            assert b <= max(nbytes // (32 * n), 60 << 10, 4096 * L)

    @FAST
    @given(st.integers(0, 300), st.integers(0, 1000))
    def test_staggered_push_order_is_a_permutation(self, partitions, worker):
        assert sorted(T.staggered_push_order(partitions, worker)) == list(range(partitions))

    @pytest.mark.parametrize("parts", range(1, 9))
    @pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 100, 1000, 4095, 1 << 20, 1000003])
    def test_shard_range_examples(self, count, parts):
        self._check_shards(count, parts)

    @FAST
    @given(st.integers(0, 1 << 26), st.integers(1, 8))
    def test_shard_range_property(self, count, parts):
        self._check_shards(count, parts)

    @staticmethod
    def _check_shards(count, parts):
        pos = 0
        for i in range(parts):
            b, e = T.shard_range(count, parts, i)
            assert b == pos, (count, parts, i)
            assert b <= e <= count
            assert b % 16 == 0 or b == count  # 16-element (64 B for float32) aligned
            pos = e
        assert pos == count


# =============================================================================================
# scheduled queue
# =============================================================================================


class TestScheduledQueue:
    def test_priority_then_key(self):
        q = T.ScheduledQueue("q", 0)
        items = [(0, 5, 10), (2, 9, 10), (2, 3, 10), (-1, 0, 10), (1, 7, 10), (2, 4, 10)]
        for it in items:
            q.push(*it)
        assert len(q) == len(items)
        out = [q.try_pop() for _ in items]
        assert out == sorted(items, key=lambda x: (-x[0], x[1]))
        assert q.try_pop() is None
        assert len(q) == 0

    @FAST
    @given(st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 1 << 40), st.integers(1, 100)),
                    max_size=50, unique_by=lambda x: (x[0], x[1])))
    def test_order_property(self, items):
        q = T.ScheduledQueue("q", 0)
        for it in items:
            q.push(*it)
        out = []
        while (x := q.try_pop()) is not None:
            out.append(x)
        assert out == sorted(items, key=lambda x: (-x[0], x[1]))

    def test_credit_bounds_in_flight(self):
        q = T.ScheduledQueue("q", 100)
        for key in range(4):
            q.push(0, key, 40)
        assert q.try_pop() == (0, 0, 40)
        assert q.try_pop() == (0, 1, 40)
        assert q.in_flight_bytes == 80
        assert q.try_pop() is None  # 80 + 40 > 100
        q.return_credit(40)
        assert q.in_flight_bytes == 40
        assert q.try_pop() == (0, 2, 40)
        assert q.try_pop() is None
        q.return_credit(80)
        assert q.try_pop() == (0, 3, 40)

    def test_return_credit_and_try_pop(self):
        # The push path's send thread returns credit and takes the next item itself.
        q = T.ScheduledQueue("q", 100)
        for key in range(3):
            q.push(0, key, 60)
        assert q.try_pop() == (0, 0, 60)
        assert q.try_pop() is None  # 60 + 60 > 100
        assert q.return_credit_and_try_pop(60) == (0, 1, 60)
        assert q.in_flight_bytes == 60
        assert q.return_credit_and_try_pop(0) is None  # still no room: nothing leaves
        assert q.return_credit_and_try_pop(60) == (0, 2, 60)
        assert q.return_credit_and_try_pop(60) is None  # empty
        assert q.in_flight_bytes == 0
        q.close()
        q.push(0, 3, 1)
        assert q.return_credit_and_try_pop(0) is None  # closed: nothing leaves

    def test_credit_exactly_full_is_allowed(self):
        q = T.ScheduledQueue("q", 100)
        q.push(0, 0, 60)
        q.push(0, 1, 40)
        assert q.try_pop() is not None
        assert q.try_pop() is not None  # 60 + 40 == 100 <= credit
        assert q.in_flight_bytes == 100

    def test_item_larger_than_credit_leaves_when_idle(self):
        q = T.ScheduledQueue("q", 100)
        q.push(0, 0, 500)
        q.push(0, 1, 1)
        assert q.try_pop() == (0, 0, 500)  # nothing in flight: it must not block forever
        assert q.try_pop() is None  # 500 in flight, credit 100
        q.return_credit(500)
        assert q.in_flight_bytes == 0
        assert q.try_pop() == (0, 1, 1)

    def test_head_of_line_not_overtaken(self):
        q = T.ScheduledQueue("q", 100)
        q.push(0, 0, 50)
        assert q.try_pop() == (0, 0, 50)
        q.push(10, 1, 80)  # big, high priority: does not fit now
        q.push(1, 2, 10)  # small, low priority: would fit, must wait its turn
        assert q.try_pop() is None
        assert len(q) == 2
        q.return_credit(50)
        assert q.try_pop() == (10, 1, 80)
        assert q.try_pop() == (1, 2, 10)  # 80 + 10 <= 100

    def test_unlimited_credit(self):
        q = T.ScheduledQueue("q", 0)
        for key in range(100):
            q.push(0, key, 1 << 30)
        for key in range(100):
            assert q.try_pop() == (0, key, 1 << 30)
        assert q.in_flight_bytes == 100 << 30

    def test_return_more_than_in_flight_clamps(self):
        q = T.ScheduledQueue("q", 10)
        q.push(0, 0, 5)
        q.try_pop()
        q.return_credit(1000)
        assert q.in_flight_bytes == 0

    def test_pop_timeout_returns_none(self):
        q = T.ScheduledQueue("q", 10)
        t0 = time.monotonic()
        assert q.pop(50) is None
        assert 0.04 <= time.monotonic() - t0 < 2.0
        q.push(0, 0, 20)
        q.push(0, 1, 20)
        assert q.pop(50) == (0, 0, 20)
        t0 = time.monotonic()
        assert q.pop(50) is None  # blocked by credit, not by emptiness
        assert time.monotonic() - t0 >= 0.04

    def test_pop_returns_available_item_immediately(self):
        q = T.ScheduledQueue("q", 0)
        q.push(3, 1, 8)
        t0 = time.monotonic()
        assert q.pop(10_000) == (3, 1, 8)
        assert time.monotonic() - t0 < 1.0

    def test_blocked_pop_wakes_on_return_credit(self):
        q = T.ScheduledQueue("q", 100)
        q.push(0, 0, 100)
        q.push(0, 1, 100)
        assert q.try_pop() == (0, 0, 100)
        result = {}
        started = threading.Event()

        def consumer():
            started.set()
            t0 = time.monotonic()
            result["item"] = q.pop(10_000)
            result["waited"] = time.monotonic() - t0

        th = threading.Thread(target=consumer)
        th.start()
        started.wait()
        time.sleep(0.2)
        assert "item" not in result  # still blocked by the credit
        q.return_credit(100)
        th.join(5)
        assert not th.is_alive()
        assert result["item"] == (0, 1, 100)
        assert 0.15 <= result["waited"] < 5.0

    def test_blocked_pop_wakes_on_push(self):
        q = T.ScheduledQueue("q", 0)
        result = {}

        def consumer():
            result["item"] = q.pop(10_000)

        th = threading.Thread(target=consumer)
        th.start()
        time.sleep(0.1)
        q.push(7, 7, 7)
        th.join(5)
        assert not th.is_alive()
        assert result["item"] == (7, 7, 7)

    def test_close_wakes_blocked_pop(self):
        q = T.ScheduledQueue("q", 0)
        result = {}

        def consumer():
            result["item"] = q.pop(10_000)

        th = threading.Thread(target=consumer)
        th.start()
        time.sleep(0.1)
        q.close()
        th.join(5)
        assert not th.is_alive()
        assert result["item"] is None
        q.push(0, 0, 1)
        assert q.try_pop() is None  # closed

    def test_many_consumers_respect_credit(self):
        """Four threads pop concurrently; the credit is never exceeded."""
        credit, size, n = 300, 100, 60
        q = T.ScheduledQueue("q", credit)
        for key in range(n):
            q.push(0, key, size)
        lock = threading.Lock()
        state = {"in_flight": 0, "max": 0, "got": []}

        def worker():
            while True:
                item = q.pop(200)
                if item is None:
                    return
                with lock:
                    state["in_flight"] += item[2]
                    state["max"] = max(state["max"], state["in_flight"])
                    state["got"].append(item[1])
                time.sleep(0.001)
                with lock:
                    state["in_flight"] -= item[2]
                q.return_credit(item[2])

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(20)
        assert sorted(state["got"]) == list(range(n))
        assert state["max"] <= credit


# =============================================================================================
# key plan (OSDI'20 §4.1; docs/architecture.md §4)
# =============================================================================================


def resnet50_numels():
    """Per-tensor parameter counts of torchvision's ResNet-50 (checked in test_sched_model)."""
    return [t.numel for t in models.resnet50()]


def vgg16_numels():
    """Per-tensor parameter counts of torchvision's VGG-16 (checked in test_sched_model)."""
    return [t.numel for t in models.vgg16()]


def paper_shares(n, k):
    d = n * n + k * n - 2 * k
    return [(n - k) / d] * n + [2 * (n - 1) / d] * k


class TestKeyPlan:
    @pytest.mark.parametrize("n,k", [(n, k) for n in range(2, 9) for k in range(0, n + 1)]
                             + [(16, 4), (32, 8), (64, 64)])
    def test_shares_equal_paper_formula(self, n, k):
        flags = [True] * n + [False] * k
        shares = T.server_shares(n, flags)
        assert shares == pytest.approx(paper_shares(n, k), rel=1e-12, abs=1e-15)
        assert sum(shares) == pytest.approx(1.0, abs=1e-12)

    def test_shares_interleaved_flags(self):
        n, k = 4, 2
        flags = [False, True, True, False, True, True]
        shares = T.server_shares(n, flags)
        d = n * n + k * n - 2 * k
        for f, s in zip(flags, shares):
            assert s == pytest.approx((n - k) / d if f else 2 * (n - 1) / d)

    @pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
    def test_all_colocated_equal_shares(self, n):
        assert T.server_shares(n, [True] * n) == pytest.approx([1 / n] * n)

    @pytest.mark.parametrize("n,k", [(2, 1), (4, 3), (8, 2)])
    def test_cpu_only_servers_equal_shares(self, n, k):
        assert T.server_shares(n, [False] * k) == pytest.approx([1 / k] * k)

    def test_more_cpu_servers_than_workers(self):
        """k > n: the formula's colocated share would be negative; it is clamped to 0."""
        shares = T.server_shares(2, [True, True, False, False, False])
        assert all(s >= 0 for s in shares)
        assert sum(shares) == pytest.approx(1.0)
        assert shares[:2] == [0.0, 0.0]
        assert shares[2:] == pytest.approx([1 / 3] * 3)

    @pytest.mark.parametrize("n,k", [(2, 0), (2, 2), (4, 0), (4, 2), (4, 4), (8, 3), (16, 0),
                                     (16, 16), (5, 1)])
    def test_optimal_comm_time(self, n, k):
        M, B = 100e6, 12.5e9
        t = T.optimal_comm_time(n, k, M, B)
        assert t == pytest.approx(2 * n * (n - 1) * M / ((n * n + k * n - 2 * k) * B), rel=1e-12)
        if k == 0:
            assert t == pytest.approx(2 * (n - 1) * M / (n * B), rel=1e-12)  # = all-reduce
        if k == n:
            assert t == pytest.approx(M / B, rel=1e-12)

    def test_optimal_comm_time_decreases_with_servers(self):
        ts = [T.optimal_comm_time(8, k, 1e9, 1e9) for k in range(0, 9)]
        assert all(a > b for a, b in zip(ts, ts[1:]))

    @staticmethod
    def _plan(model_numels, shares, bound=4096000):
        kp = T.KeyPlanner(shares)
        total, placements = 0, []
        for numel in model_numels:
            parts = [length for _, _, length in T.partition(numel * 4, bound, 4)]
            servers = kp.assign(parts)
            assert len(servers) == len(parts)  # every partition assigned
            assert all(0 <= s < len(shares) for s in servers)
            placements.append(servers)
            total += sum(parts)
        return kp, total, placements

    @pytest.mark.parametrize("model", [resnet50_numels, vgg16_numels], ids=["resnet50", "vgg16"])
    @pytest.mark.parametrize("n,k", [(2, 0), (2, 1), (2, 2), (4, 0), (4, 2), (8, 0), (8, 4),
                                     (8, 8), (3, 1), (16, 4)])
    def test_planner_balances_real_models(self, model, n, k):
        bound = 4096000
        shares = T.server_shares(n, [True] * n + [False] * k)
        kp, total, placements = self._plan(model(), shares, bound)
        assigned = kp.assigned_bytes
        assert sum(assigned) == total == sum(model()) * 4
        for s, share in enumerate(shares):
            assert abs(assigned[s] - share * total) <= bound, (s, assigned[s], share * total)
        # deterministic: an identical planner makes the identical plan
        kp2, _, placements2 = self._plan(model(), shares, bound)
        assert placements2 == placements
        assert kp2.assigned_bytes == assigned

    def test_planner_one_call_largest_first(self):
        shares = T.server_shares(4, [True] * 4 + [False] * 2)
        sizes = [1000, 5000, 3000, 3000, 7000, 100, 2500, 4000]
        kp = T.KeyPlanner(shares)
        servers = kp.assign(sizes)
        per = [0] * len(shares)
        for sz, s in zip(sizes, servers):
            per[s] += sz
        assert per == list(kp.assigned_bytes)
        for s, share in enumerate(shares):
            assert abs(per[s] - share * sum(sizes)) <= max(sizes)
        assert "server 0" in kp.describe()

    def test_planner_not_a_hash(self):
        """Equal-size partitions spread evenly over equal-share servers (a hash would not)."""
        kp = T.KeyPlanner([0.25] * 4)
        servers = kp.assign([1000] * 400)
        assert [servers.count(s) for s in range(4)] == [100] * 4


# =============================================================================================
# frame codec (docs/architecture.md §6: decoders never trust a peer's sizes)
# =============================================================================================

CONTROL_TYPES = list(range(1, 12))  # ... NODE_FAILED, WORKER_LEFT, RETIRE_KEYS
DATA_TYPES = list(range(20, 35))  # ... PUSH_ACK, KEY_CONFIG, PEER_HELLO .. PEER_ABORT, PULL_WINDOW
KNOWN_TYPES = CONTROL_TYPES + DATA_TYPES
MAGIC = 0x31535042
MAX_CONTROL = 4 << 20
MAX_DATA = 1 << 33


MAX_WINDOW = 64 << 10  # a PUSH_ACK's window (ps/protocol.h: kMaxWindowBlob)


def header_is_valid(magic, type_, dtype, payload_len, written=0):
    """Reference model of ValidateFrame (comm/frame.cc) and ValidatePsHeader (ps/protocol.cc)."""
    if magic != MAGIC or type_ not in KNOWN_TYPES or dtype >= 8:
        return False
    limit = MAX_CONTROL if (type_ in CONTROL_TYPES or type_ in (20, 24, 27, 29, 33)) else MAX_DATA
    if payload_len > limit:
        return False
    if type_ in (28, 34) and payload_len > MAX_WINDOW:
        return False
    # only a PUSH or PULL_RESPONSE announces bytes written one-way, and then carries none
    if written and (type_ not in (21, 23) or payload_len != 0 or written > MAX_DATA):
        return False
    return not (type_ in (11, 22, 25, 26, 30, 32) and payload_len != 0)


class TestFrame:
    def test_header_size(self):
        assert T.header_size() == 48
        assert len(T.encode_header(21)) == 48

    def test_header_layout_little_endian(self):
        h = T.encode_header(21, dtype=7, sender=3, round=9, key=(5 << 16) | 2, payload_len=1024,
                            aux=77)
        magic, typ, dtype, flags, sender, rnd, key, plen, aux, res = struct.unpack(
            "<IHBBIIQQQQ", h)
        assert (magic, typ, dtype, flags, sender, rnd, key, plen, aux, res) == (
            MAGIC, 21, 7, 0, 3, 9, (5 << 16) | 2, 1024, 77, 0)
        assert h[:4] == b"BPS1"

    def test_round_trip(self):
        h = T.encode_header(23, dtype=1, sender=12, round=1 << 31, key=(1 << 48) - 1,
                            payload_len=4096000, aux=123456789)
        d = T.decode_header(h)
        assert d == {"type": 23, "type_name": "PULL_RESPONSE", "dtype": 1, "sender": 12,
                     "round": 1 << 31, "key": (1 << 48) - 1, "payload_len": 4096000,
                     "aux": 123456789, "written": 0}

    def test_one_way_headers(self):
        """A PUSH or PULL_RESPONSE written one-way into the receiver's window announces its
        bytes and carries no payload; nothing else may announce any; a PUSH_ACK or PULL_WINDOW
        carries at most a window."""
        for written_type in (21, 23):
            h = T.decode_header(T.encode_header(written_type, written=1 << 20))
            assert h["written"] == 1 << 20
            with pytest.raises(ValueError, match="written one-way"):
                T.decode_header(T.encode_header(written_type, payload_len=4, written=1 << 20))
            with pytest.raises(ValueError, match="written one-way"):
                T.decode_header(T.encode_header(written_type, written=MAX_DATA + 1))
        for other in (22, 28, 31, 34):
            with pytest.raises(ValueError, match="written one-way"):
                T.decode_header(T.encode_header(other, written=8))
        for window_type in (28, 34):
            T.decode_header(T.encode_header(window_type, payload_len=MAX_WINDOW))
            with pytest.raises(ValueError, match="window"):
                T.decode_header(T.encode_header(window_type, payload_len=MAX_WINDOW + 1))

    @pytest.mark.parametrize("type_,name", [(1, "REGISTER"), (2, "ADDRESS_BOOK"), (3, "DECLARE"),
                                            (4, "DECLARE_REPLY"), (5, "HEARTBEAT"),
                                            (6, "FINALIZE"), (7, "FINALIZE_DONE"),
                                            (8, "SHUTDOWN"), (9, "NODE_FAILED"),
                                            (10, "WORKER_LEFT"), (11, "RETIRE_KEYS"), (20, "HELLO"),
                                            (21, "PUSH"), (22, "PULL"), (23, "PULL_RESPONSE"),
                                            (24, "DATA_ERROR"), (25, "GOODBYE"),
                                            (26, "STALL_QUERY"), (27, "STALL_REPORT"),
                                            (30, "PEER_HELLO"), (31, "COLLECTIVE"),
                                            (32, "PEER_GOODBYE"), (33, "PEER_ABORT"),
                                            (34, "PULL_WINDOW")])
    def test_every_type_decodes(self, type_, name):
        assert T.decode_header(T.encode_header(type_))["type_name"] == name

    @pytest.mark.parametrize("magic", [0, 0x31535043, 0x42505331, 0xFFFFFFFF])
    def test_bad_magic(self, magic):
        with pytest.raises(ValueError, match="magic"):
            T.decode_header(T.encode_header(21, magic=magic))

    @pytest.mark.parametrize("type_", [0, 12, 13, 19, 35, 100, 0xFFFF])
    def test_unknown_type(self, type_):
        with pytest.raises(ValueError, match="type"):
            T.decode_header(T.encode_header(type_))

    @pytest.mark.parametrize("dtype", [8, 9, 100, 255])
    def test_bad_dtype(self, dtype):
        with pytest.raises(ValueError, match="dtype"):
            T.decode_header(T.encode_header(21, dtype=dtype))

    def test_every_valid_dtype(self):
        for code in DTYPE_CODES.values():
            assert T.decode_header(T.encode_header(21, dtype=code))["dtype"] == code

    def test_payload_limits(self):
        T.decode_header(T.encode_header(21, payload_len=MAX_DATA))
        with pytest.raises(ValueError, match="exceeds"):
            T.decode_header(T.encode_header(21, payload_len=MAX_DATA + 1))
        with pytest.raises(ValueError, match="exceeds"):
            T.decode_header(T.encode_header(23, payload_len=(1 << 64) - 1))
        T.decode_header(T.encode_header(3, payload_len=MAX_CONTROL))
        for control in (1, 3, 9, 20, 24, 27):
            with pytest.raises(ValueError, match="exceeds"):
                T.decode_header(T.encode_header(control, payload_len=MAX_CONTROL + 1))

    @pytest.mark.parametrize("type_", [22, 25, 26, 30, 32])
    def test_pull_and_goodbye_without_payload(self, type_):
        T.decode_header(T.encode_header(type_, payload_len=0))
        with pytest.raises(ValueError, match="payload"):
            T.decode_header(T.encode_header(type_, payload_len=1))

    @pytest.mark.parametrize("n", [0, 1, 47, 49, 96])
    def test_header_wrong_length(self, n):
        with pytest.raises(ValueError):
            T.decode_header(b"\0" * n)

    @FUZZ
    @given(st.binary(min_size=48, max_size=48))
    def test_fuzz_decode_header_random_bytes(self, data):
        magic, typ, dtype, _, _, _, _, plen, _, written = struct.unpack("<IHBBIIQQQQ", data)
        try:
            d = T.decode_header(data)
        except ValueError:
            assert not header_is_valid(magic, typ, dtype, plen, written)
        else:
            assert header_is_valid(magic, typ, dtype, plen, written)
            assert (d["type"], d["dtype"], d["payload_len"]) == (typ, dtype, plen)

    @FUZZ
    @given(st.sampled_from([MAGIC, MAGIC, MAGIC, 0, MAGIC ^ 1]),
           st.one_of(st.sampled_from(KNOWN_TYPES), st.integers(0, 0xFFFF)),
           st.integers(0, 255),
           st.one_of(st.integers(0, 16), st.sampled_from([MAX_CONTROL, MAX_CONTROL + 1, MAX_DATA,
                                                          MAX_DATA + 1]),
                     st.integers(0, (1 << 64) - 1)),
           st.integers(0, (1 << 64) - 1))
    def test_fuzz_header_fields_match_reference(self, magic, typ, dtype, plen, key):
        h = T.encode_header(typ, dtype=dtype, key=key, payload_len=plen, magic=magic)
        try:
            d = T.decode_header(h)
        except ValueError:
            assert not header_is_valid(magic, typ, dtype, plen)
        else:
            assert header_is_valid(magic, typ, dtype, plen)
            assert d["key"] == key

    # --- control payloads ---

    def test_declare_round_trip(self):
        msg = T.encode_declare(7, "layer1.conv.weight", 0, [64, 3, 7, 7], 64 * 3 * 49 * 4)
        assert T.decode_declare(msg) == (7, "layer1.conv.weight", 0, [64, 3, 7, 7],
                                         64 * 3 * 49 * 4)
        assert T.decode_declare(T.encode_declare(0, "", 7, [], 0)) == (0, "", 7, [], 0)

    @FAST
    @given(st.integers(0, (1 << 32) - 1), st.text(max_size=200), st.integers(0, 7),
           st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=64),
           st.integers(0, (1 << 64) - 1))
    def test_declare_round_trip_property(self, key, name, dtype, shape, nbytes):
        msg = T.encode_declare(key, name, dtype, shape, nbytes)
        assert T.decode_declare(msg) == (key, name, dtype, shape, nbytes)

    def test_declare_limits(self):
        with pytest.raises(ValueError):
            T.decode_declare(T.encode_declare(1, "x", 8, [1], 4))  # bad dtype
        with pytest.raises(ValueError):
            T.decode_declare(T.encode_declare(1, "x", 0, [1] * 65, 4))  # too many dims
        with pytest.raises(ValueError):
            T.decode_declare(T.encode_declare(1, "x" * ((1 << 16) + 1), 0, [1], 4))  # long name
        T.decode_declare(T.encode_declare(1, "x" * (1 << 16), 0, [1] * 64, 4))  # at the limits

    def test_declare_lying_lengths(self):
        good = T.encode_declare(1, "abc", 0, [2, 2], 16)
        # name length says 2^31 bytes
        bad = good[:4] + struct.pack("<I", 1 << 31) + good[8:]
        with pytest.raises(ValueError):
            T.decode_declare(bad)
        # shape count says 2^32-1 dims
        off = 4 + 4 + 3 + 1
        bad = good[:off] + struct.pack("<I", 0xFFFFFFFF) + good[off + 4:]
        with pytest.raises(ValueError):
            T.decode_declare(bad)

    def test_register_round_trip(self):
        msg = T.encode_register(0, 3, "10.0.0.7", 9000, 8, 4, 2, 4096000)
        assert T.decode_register(msg) == (0, 3, "10.0.0.7", 9000, 8, 4, 2, 4096000)
        msg = T.encode_register(1, -1, "", 0, 1, 1, 1, 0)
        assert T.decode_register(msg) == (1, -1, "", 0, 1, 1, 1, 0)

    @FAST
    @given(st.tuples(st.integers(0, 1), st.integers(-(1 << 31), (1 << 31) - 1),
                     st.text(max_size=60).filter(lambda s: len(s.encode()) <= 256),
                     st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1),
                     st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1),
                     st.integers(0, (1 << 64) - 1)))
    def test_register_round_trip_property(self, fields):
        assert T.decode_register(T.encode_register(*fields)) == fields

    def test_register_limits(self):
        with pytest.raises(ValueError):
            T.decode_register(T.encode_register(2, 0, "h", 1, 1, 1, 1, 1))  # a scheduler can't
        with pytest.raises(ValueError):
            T.decode_register(T.encode_register(0, 0, "h" * 257, 1, 1, 1, 1, 1))  # long host
        T.decode_register(T.encode_register(0, 0, "h" * 256, 1, 1, 1, 1, 1))

    @pytest.mark.parametrize("which", ["declare", "register"])
    def test_truncated_or_extended_payload(self, which):
        if which == "declare":
            good, decode = T.encode_declare(9, "w", 2, [3, 4], 24), T.decode_declare
        else:
            good, decode = T.encode_register(0, 1, "host", 5, 1, 2, 1, 4096), T.decode_register
        decode(good)
        for n in range(len(good)):
            with pytest.raises(ValueError):
                decode(good[:n])
        for extra in (b"\0", b"\xff" * 7, b"\0" * 100):
            with pytest.raises(ValueError):
                decode(good + extra)

    @FUZZ
    @given(st.binary(max_size=300))
    def test_fuzz_decoders_random_bytes(self, data):
        for decode in (T.decode_declare, T.decode_register):
            try:
                decode(data)
            except ValueError:
                pass
        if len(data) != 48:
            with pytest.raises(ValueError):
                T.decode_header(data)

    @FUZZ
    @given(st.data())
    def test_fuzz_decoders_mutated_messages(self, data):
        """Flip, cut and splice bytes of valid messages: only ValueError, never a crash."""
        good = data.draw(st.sampled_from([
            T.encode_declare(3, "layer.weight", 0, [16, 16, 3, 3], 9216),
            T.encode_register(0, 2, "192.168.1.20", 1234, 4, 8, 2, 4096000),
        ]))
        buf = bytearray(good)
        for _ in range(data.draw(st.integers(1, 6))):
            op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
            if op == "flip" and buf:
                i = data.draw(st.integers(0, len(buf) - 1))
                buf[i] = data.draw(st.integers(0, 255))
            elif op == "cut" and buf:
                i = data.draw(st.integers(0, len(buf) - 1))
                del buf[i:i + data.draw(st.integers(1, 8))]
            else:
                i = data.draw(st.integers(0, len(buf)))
                buf[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        for decode in (T.decode_declare, T.decode_register):
            try:
                decode(bytes(buf))
            except ValueError:
                pass


# =============================================================================================
# knobs (docs/architecture.md §10) and docs/env.md
# =============================================================================================

KNOBS = list(_core.knobs())
KNOB_BY_NAME = {k["name"]: k for k in KNOBS}


class TestKnobs:
    def test_defaults(self):
        values = _core.knob_values({})
        assert set(values) == set(KNOB_BY_NAME)
        for name, k in KNOB_BY_NAME.items():
            assert values[name] == k["default"], name
        assert values["DMLC_ROLE"] == "worker"
        assert values["DMLC_NUM_WORKER"] == "1"
        assert values["BYTEPS_PARTITION_BYTES"] == "262144"  # the scheduling sweep
        assert values["BYTEPS_SCHEDULING_CREDIT"] == "4"
        assert values["BYTEPS_TCP_NOTSENT_LOWAT"] == "65536"

    def test_valid_values_pass_through(self):
        env = {"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "8", "BYTEPS_LOG_LEVEL": "debug",
               "BYTEPS_FORCE_DISTRIBUTED": "true", "BYTEPS_TIMEOUT": "2.5",
               "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "1234"}
        values = _core.knob_values(env)
        for name, v in env.items():
            assert values[name] == v

    def test_unknown_variables_change_nothing_but_are_reported(self):
        # values unchanged; the name is reported (tests/test_env_names.py: warnings, refusals)
        assert _core.knob_values({"BYTEPS_NOT_A_KNOB": "x"}) == _core.knob_values({})
        [notice] = _core.check_environment({"BYTEPS_NOT_A_KNOB": "x"})
        assert notice["warning"] and "BYTEPS_NOT_A_KNOB" in notice["text"]

    @pytest.mark.parametrize("name,value", [
        ("DMLC_NUM_WORKER", "abc"),
        ("DMLC_NUM_WORKER", "0"),
        ("DMLC_NUM_WORKER", "2.5"),
        ("DMLC_NUM_WORKER", ""),
        ("DMLC_NUM_WORKER", "99999999999999999999999"),
        ("BYTEPS_PARTITION_BYTES", "-5"),
        ("BYTEPS_PARTITION_BYTES", "4095"),
        ("BYTEPS_PARTITION_BYTES", "4096 "),
        ("DMLC_ROLE", "boss"),
        ("DMLC_ROLE", "Worker"),
        ("BYTEPS_LOG_LEVEL", "loud"),
        ("BYTEPS_FORCE_DISTRIBUTED", "maybe"),
        ("BYTEPS_FORCE_DISTRIBUTED", "2"),
        ("BYTEPS_TIMEOUT", "nan"),
        ("BYTEPS_TIMEOUT", "inf"),
        ("BYTEPS_TIMEOUT", "0"),
        ("BYTEPS_HEARTBEAT_INTERVAL", "fast"),
        ("DMLC_PS_ROOT_PORT", "http"),
        ("DMLC_PS_ROOT_PORT", "70000"),
        ("DMLC_WORKER_ID", "-1"),
        ("BYTEPS_LOCAL_SIZE", "0"),
    ])
    def test_invalid_value_raises_config_error(self, name, value):
        with pytest.raises(ConfigError) as info:
            _core.knob_values({name: value})
        msg = str(info.value)
        assert name in msg
        assert f"'{value}'" in msg or value in msg
        assert "expected" in msg  # says what is accepted
        assert isinstance(info.value, byteps.ConfigError)
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize("k", [k for k in KNOBS if k["type"] == "int" and k["range"]],
                             ids=lambda k: k["name"])
    def test_int_range_boundaries(self, k):
        lo, hi = int(k["range"][0]), int(k["range"][1])
        name = k["name"]
        for ok in (lo, hi):
            assert _core.knob_values({name: str(ok)})[name] == str(ok)
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ConfigError, match=name):
                _core.knob_values({name: str(bad)})

    @pytest.mark.parametrize("k", [k for k in KNOBS if k["type"] == "choice"],
                             ids=lambda k: k["name"])
    def test_every_choice_accepted(self, k):
        for c in k["choices"]:
            assert _core.knob_values({k["name"]: c})[k["name"]] == c

    @pytest.mark.parametrize("v", ["1", "0", "true", "false", "yes", "no", "on", "off", "True"])
    def test_bool_spellings(self, v):
        assert _core.knob_values({"BYTEPS_LOG_HIDE_TIME": v})["BYTEPS_LOG_HIDE_TIME"] == v

    def test_registry_complete(self):
        assert len(KNOB_BY_NAME) == len(KNOBS), "a knob is declared twice"
        for k in KNOBS:
            assert k["name"].startswith(("BYTEPS_", "DMLC_")), k["name"]
            assert k["doc"].strip(), f"{k['name']} has no doc"
            assert k["type"] in ("int", "float", "bool", "string", "choice")
            assert k["used_by"].strip(), k["name"]
            if k["type"] == "choice":
                assert k["choices"] and (k["default"] == "" or k["default"] in k["choices"])
        for name in ["DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_WORKER_ID",
                     "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NODE_HOST", "DMLC_INTERFACE",
                     "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_PARTITION_BYTES",
                     "BYTEPS_SCHEDULING_CREDIT"]:
            assert name in KNOB_BY_NAME  # the upstream contract (docs/architecture.md §10)

    def test_defaults_valid(self):
        """Every non-empty default passes its own validation (knob_values({}) validates them)."""
        _core.knob_values({})
        for k in KNOBS:
            if k["default"] != "":
                _core.knob_values({k["name"]: k["default"]})

    def test_env_md_up_to_date(self):
        knobs_mod = _knobs_module()
        page = (ROOT / "docs" / "env.md").read_text(encoding="utf-8")
        assert page == knobs_mod.render_markdown(), (
            "docs/env.md is stale: run python -m byteps.knobs --write docs/env.md")
        for k in KNOBS:
            assert f"`{k['name']}`" in page

    def test_render_markdown_content(self):
        page = _knobs_module().render_markdown()
        assert page.startswith("# ")
        assert "core/cpp/common/knobs.cc" in page
        assert "ConfigError" in page
        for title in ("Cluster and bootstrap", "Worker core", "Server", "Logging"):
            assert f"## {title}" in page
        # every knob has exactly one table row with six cells
        for k in KNOBS:
            rows = [line for line in page.splitlines() if line.startswith(f"| `{k['name']}` |")]
            assert len(rows) == 1, k["name"]
            assert rows[0].count(" | ") == 5, rows[0]

    def test_cli_check_and_write(self, tmp_path):
        cli = _knobs_cli()
        env = clean_env()
        r = subprocess.run(cli + ["--check", str(ROOT / "docs" / "env.md")], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        out = tmp_path / "env.md"
        r = subprocess.run(cli + ["--write", str(out)], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        assert out.read_text() == (ROOT / "docs" / "env.md").read_text()
        out.write_text(out.read_text().replace("Role of this process.", "Role."))
        r = subprocess.run(cli + ["--check", str(out)], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1
        assert "Role of this process." in r.stdout  # a diff is shown
        r = subprocess.run(cli + ["--markdown"], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and r.stdout == out.read_text().replace(
            "Role.", "Role of this process.")
        r = subprocess.run(cli + ["--check", str(tmp_path / "missing.md")], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1


# =============================================================================================
# worker configuration errors through the real API (each in a fresh process)
# =============================================================================================

_INIT_PROBE = textwrap.dedent("""
    import json, os, sys, threading, time
    def native_threads():
        return len(os.listdir("/proc/self/task"))
    import byteps.basics as basics
    from byteps.errors import ConfigError
    before = native_threads()
    t0 = time.monotonic()
    result = {"raised": None, "message": ""}
    try:
        basics.init()
    except ConfigError as err:
        result["raised"] = "ConfigError"
        result["message"] = str(err)
    except Exception as err:
        result["raised"] = type(err).__name__
        result["message"] = str(err)
    result["init_s"] = time.monotonic() - t0
    result["py_threads"] = threading.active_count()
    result["native_before"] = before
    result["native_after"] = native_threads()
    result["initialized"] = basics.is_initialized()
    print(json.dumps(result))
""")


def _probe_init(**env):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _INIT_PROBE], env=clean_env(**env),
                       capture_output=True, text=True, timeout=30)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), elapsed


@pytest.mark.parametrize("env,variable", [
    ({"DMLC_NUM_WORKER": "2"}, "DMLC_WORKER_ID"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0", "DMLC_PS_ROOT_URI": "127.0.0.1"},
     "DMLC_PS_ROOT_PORT"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0", "DMLC_PS_ROOT_URI": "127.0.0.1",
      "DMLC_PS_ROOT_PORT": "http"}, "DMLC_PS_ROOT_PORT"),
    ({"BYTEPS_LOCAL_RANK": "2", "BYTEPS_LOCAL_SIZE": "2"}, "BYTEPS_LOCAL_RANK"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2", "DMLC_PS_ROOT_URI": "127.0.0.1",
      "DMLC_PS_ROOT_PORT": "1234", "DMLC_NUM_SERVER": "1"}, "DMLC_WORKER_ID"),
    ({"DMLC_NUM_WORKER": "abc"}, "DMLC_NUM_WORKER"),
    ({"BYTEPS_PARTITION_BYTES": "-5"}, "BYTEPS_PARTITION_BYTES"),
    ({"DMLC_ROLE": "server"}, "DMLC_ROLE"),
], ids=["no-worker-id", "no-root-uri", "no-root-port", "bad-root-port", "local-rank-too-big",
        "worker-id-too-big", "bad-num-worker", "negative-partition", "role-server"])
def test_init_config_error_before_any_thread(env, variable):
    result, elapsed = _probe_init(**env)
    assert result["raised"] == "ConfigError", result
    assert variable in result["message"], result["message"]
    assert not result["initialized"]
    assert result["py_threads"] == 1
    assert result["native_after"] == result["native_before"], "a native thread was started"
    assert elapsed < 5.0, f"the failed process took {elapsed:.1f} s to exit"


def test_not_initialized_errors():
    code = textwrap.dedent("""
        import byteps.basics as basics
        from byteps.errors import NotInitializedError
        for fn in (basics.size, basics.rank, basics.local_size, basics.local_rank,
                   lambda: basics.declare("x"),
                   lambda: basics.push_pull_async("x", 0, 0, 0, "float32", [0], False)):
            try:
                fn()
            except NotInitializedError:
                pass
            else:
                raise SystemExit("no NotInitializedError from %r" % fn)
        basics.shutdown()  # safe without init
        basics.init(); assert basics.size() == 1; basics.shutdown()
        try:
            basics.size()
        except NotInitializedError:
            print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "OK"


def test_not_initialized_error_class():
    assert issubclass(NotInitializedError, byteps.BytePSError)


@pytest.mark.parametrize("env,variable", [
    ({"DMLC_ROLE": "server"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_ROLE": "scheduler"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1"}, "DMLC_PS_ROOT_PORT"),
    ({"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "x"},
     "DMLC_PS_ROOT_PORT"),
    ({"DMLC_ROLE": "worker"}, "DMLC_ROLE"),
])
def test_server_config_errors(env, variable):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "byteps.server"], env=clean_env(**env),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert variable in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 5.0


# =============================================================================================
# single-machine push_pull (one process with default env is a 1-worker job)
# =============================================================================================


@pytest.fixture(scope="module")
def single_worker():
    """init() a 1-worker job in this process with a clean BYTEPS_*/DMLC_* environment."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(("BYTEPS_", "DMLC_"))}
    for k in saved:
        del os.environ[k]
    try:
        basics.init()
        assert basics.size() == 1 and basics.rank() == 0
        assert basics.local_size() == 1 and basics.local_rank() == 0
        yield basics
    finally:
        basics.shutdown()
        os.environ.update(saved)


def _array(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    npdt = STORAGE.get(dtype, dtype)
    if np.issubdtype(np.dtype(npdt), np.integer) and dtype != "bfloat16":
        info = np.iinfo(npdt)
        return rng.integers(info.min, info.max, size=shape, dtype=npdt, endpoint=True)
    if dtype == "bfloat16":
        f = rng.standard_normal(shape).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    return rng.standard_normal(shape).astype(npdt)


def _push_pull(b, name, a, out, average=False):
    """push_pull of ``a`` into ``out``; the dtype name is the tensor name's first field."""
    dtype = name.split(":")[0]
    h = b.push_pull_async(name, a.ctypes.data, out.ctypes.data, a.nbytes, dtype, a.shape, average)
    b.wait(h)


DTYPES = list(basics.SUPPORTED_DTYPES)


class TestSingleMachinePushPull:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("average", [False, True])
    def test_out_of_place_each_dtype(self, single_worker, dtype, average):
        a = _array(dtype, (33, 17), seed=1)
        keep = a.copy()
        out = np.zeros_like(a)
        _push_pull(single_worker, f"{dtype}:oop:{average}", a, out, average)
        assert out.tobytes() == keep.tobytes()  # sum (or average) over one worker
        assert a.tobytes() == keep.tobytes()  # the input is untouched

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_in_place_each_dtype(self, single_worker, dtype):
        a = _array(dtype, (1000,), seed=2)
        keep = a.copy()
        _push_pull(single_worker, f"{dtype}:inplace", a, a)
        assert a.tobytes() == keep.tobytes()

    def test_multi_partition_tensor(self, single_worker):
        a = _array("float32", (3 * 4096000 // 4 + 123,), seed=3)  # 4 partitions, short tail
        out = np.zeros_like(a)
        _push_pull(single_worker, "float32:multi", a, out)
        assert np.array_equal(out, a)
        for _ in range(3):  # the same name again: later rounds work too
            out[:] = 0
            _push_pull(single_worker, "float32:multi", a, out)
            assert np.array_equal(out, a)

    @pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2)])
    def test_size_zero(self, single_worker, shape):
        a = np.zeros(shape, np.float32)
        h = single_worker.push_pull_async(f"zero{shape}", a.ctypes.data, a.ctypes.data, 0,
                                          "float32", a.shape, False)
        single_worker.wait(h)

    def test_scalar(self, single_worker):
        a = np.array(3.5, np.float64)
        out = np.zeros_like(a)
        _push_pull(single_worker, "float64:scalar", a, out)
        assert out == 3.5

    def test_many_in_flight_at_once(self, single_worker):
        arrays = [_array("float32", (1000 + i,), seed=i) for i in range(50)]
        outs = [np.zeros_like(a) for a in arrays]
        handles = [single_worker.push_pull_async(f"many.{i}", a.ctypes.data, o.ctypes.data,
                                                 a.nbytes, "float32", a.shape, False)
                   for i, (a, o) in enumerate(zip(arrays, outs))]
        for h in handles:
            single_worker.wait(h)
        for a, o in zip(arrays, outs):
            assert np.array_equal(a, o)

    def test_duplicate_name_in_flight(self, single_worker):
        a = np.ones(64 << 20 >> 2, np.float32)  # 64 MiB, 16 partitions to copy out
        out = np.zeros_like(a)
        b = single_worker
        h1 = b.push_pull_async("dup", a.ctypes.data, out.ctypes.data, a.nbytes, "float32",
                               a.shape, False)
        try:
            h2 = b.push_pull_async("dup", a.ctypes.data, out.ctypes.data, a.nbytes, "float32",
                                   a.shape, False)
        except ValueError as err:
            assert "dup" in str(err) and "in flight" in str(err)
            b.wait(h1)
            assert np.array_equal(out, a)
        else:  # the first one finished before the second call: nothing to check
            b.wait(h1)
            b.wait(h2)
            pytest.skip("the first push_pull finished before the second started")
        # after the wait, the name is free again
        b.wait(b.push_pull_async("dup", a.ctypes.data, out.ctypes.data, a.nbytes, "float32",
                                 a.shape, False))

    @pytest.mark.parametrize("nbytes,shape", [(12, (4,)), (20, (4,)), (0, (1,)), (16, (2, 3))])
    def test_wrong_nbytes_for_shape(self, single_worker, nbytes, shape):
        buf = np.zeros(64, np.float32)
        with pytest.raises(ValueError, match="do not match"):
            single_worker.push_pull_async(f"bad{nbytes}{shape}", buf.ctypes.data,
                                          buf.ctypes.data, nbytes, "float32", shape, False)

    def test_negative_dimension(self, single_worker):
        buf = np.zeros(4, np.float32)
        with pytest.raises(ValueError):
            single_worker.push_pull_async("neg", buf.ctypes.data, buf.ctypes.data, 16,
                                          "float32", (-1, -4), False)

    def test_shape_change_for_a_name(self, single_worker):
        a = np.zeros(8, np.float32)
        _push_pull(single_worker, "float32:reshape", a, a)
        b = a.reshape(2, 4)
        with pytest.raises(ValueError):
            single_worker.push_pull_async("float32:reshape", b.ctypes.data, b.ctypes.data,
                                          b.nbytes, "float32", b.shape, False)

    @pytest.mark.parametrize("dtype", ["complex64", "float128", "bool", "int16", "", "Float32"])
    def test_unsupported_dtype(self, single_worker, dtype):
        buf = np.zeros(4, np.float32)
        with pytest.raises(TypeError, match="unsupported dtype"):
            single_worker.push_pull_async("t", buf.ctypes.data, buf.ctypes.data, 16, dtype,
                                          (4,), False)
        with pytest.raises(TypeError):  # the core checks too, not only the Python wrapper
            _core.push_pull_async("t", buf.ctypes.data, buf.ctypes.data, 16, dtype, [4], False)

    def test_empty_name(self, single_worker):
        buf = np.zeros(4, np.float32)
        with pytest.raises(ValueError):
            single_worker.push_pull_async("", buf.ctypes.data, buf.ctypes.data, 16, "float32",
                                          (4,), False)

    def test_declare(self, single_worker):
        k1 = single_worker.declare("declare.a")
        k2 = single_worker.declare("declare.b")
        assert k2 == k1 + 1
        assert single_worker.declare("declare.a") == k1
