"""Unit tests of the core's scheduling pieces (docs/architecture.md §3-§5), through
``byteps._core_testing`` (the partition rule through ``byteps._core``, which ships it):

* partitioner: page-aligned bounds, exact non-overlapping cover, partition keys, local-reduce
  shards;
* scheduled queue: priority order, credit, head-of-line rule, blocking pop across threads;
* key plan: the paper's shares and optimal communication time (OSDI'20 §4.1), the greedy
  byte-balanced placement on ResNet-50 and VGG-16.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from testing_hooks import core_testing

from benchmarks import models
from byteps import _core

T = core_testing()

PAGE = 4096
MAX_PARTS = 1 << 16

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


# =============================================================================================
# partitioner
# =============================================================================================


class TestPartitioner:
    def test_bound_default_is_page_aligned_already(self):
        assert _core.partition_bound(4096000, 1) == 4096000  # 1000 pages exactly

    def test_bound_rounds_up_to_local_size_pages(self):
        assert _core.partition_bound(4096000, 3) == 4104192  # ceil(4096000 / 12288) * 12288
        assert _core.partition_bound(4096000, 8) == 4096000  # 125 * 8 pages
        assert _core.partition_bound(4096000, 7) == 143 * 7 * PAGE
        assert _core.partition_bound(1, 1) == PAGE
        assert _core.partition_bound(PAGE + 1, 1) == 2 * PAGE
        assert _core.partition_bound(PAGE, 2) == 2 * PAGE

    @FAST
    @given(st.integers(1, 1 << 31), st.integers(1, 64))
    def test_bound_property(self, nbytes, local_size):
        unit = PAGE * local_size
        b = _core.partition_bound(nbytes, local_size)
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
        # A process set's tensors: the set (declared key bits 16-31) in key bits 48-63, clear
        # of the generation (bits 32-47).
        assert T.partition_key((2 << 16) | 3, 5) == (2 << 48) | (3 << 16) | 5
        assert T.partition_key((2 << 16) | 3, 5, 7) == (2 << 48) | (7 << 32) | (3 << 16) | 5
        assert T.partition_key(0xFFFFFFFF, 0xFFFF) == (0xFFFF << 48) | (0xFFFF << 16) | 0xFFFF
        keys = {T.partition_key((s << 16) | k, i, g) for s in range(3) for k in range(20)
                for i in range(50) for g in range(2)}
        assert len(keys) == 3 * 20 * 50 * 2  # injective over (set, key, index, generation)

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
        assert _core.tensor_partition_bound(4 << 20, job, 4, 1) == small  # want 32 KiB
        assert _core.tensor_partition_bound(4 << 20, job, 2, 1) == small  # want 64 KiB
        assert _core.tensor_partition_bound(8 << 20, job, 2, 1) == 2 * small  # want 128 KiB
        assert _core.tensor_partition_bound(4096, job, 8, 1) == small
        assert _core.tensor_partition_bound(32 * 4 * job - 1, job, 4, 1) == 4 * small
        assert _core.tensor_partition_bound(294 << 10 << 6, 4000 << 10, 2, 1) == 4 * small
        # Large tensors keep the job's bound.
        assert _core.tensor_partition_bound(64 << 20, job, 2, 1) == job
        assert _core.tensor_partition_bound(32 * 4 * job, job, 4, 1) == job
        # A job bound below the small one wins; whole local_size pages, rounded down.
        assert _core.tensor_partition_bound(4 << 20, 16 << 10, 4, 1) == 16 << 10
        assert _core.tensor_partition_bound(3 << 20, 3 * 4096 * 100, 2, 3) == 5 * 3 * 4096
        assert _core.tensor_partition_bound(4 << 20, job, 4, 2) == 56 << 10
        assert _core.tensor_partition_bound(4 << 20, job, 4, 32) == 32 * 4096
        # A compressed tensor is cut at the job's bound only (upstream compresses each
        # BYTEPS_PARTITION_BYTES partition), however small it is.
        assert _core.tensor_partition_bound(4 << 20, job, 4, 1, compressed=True) == job
        assert _core.tensor_partition_bound(4096, job, 8, 1, compressed=True) == job
        big = _core.partition_bound(2**31 - 1, 1)  # upstream's tests: one partition per tensor
        assert _core.tensor_partition_bound(100_000, big, 1, 1, compressed=True) == big

    @FAST
    @given(st.integers(1, 1 << 34), st.integers(1, 64), st.sampled_from([1, 2, 3, 4, 8]),
           st.integers(1, 1 << 12))
    def test_tensor_partition_bound_properties(self, nbytes, n, L, job_pages):
        from byteps.sim import ps_sim

        job = _core.partition_bound(job_pages * 4096, L)
        b = _core.tensor_partition_bound(nbytes, job, n, L)
        # the simulator cuts tensors with the core's rule itself, not a copy of it
        assert ps_sim.partition_bound is _core.partition_bound
        assert ps_sim.tensor_partition_bound is _core.tensor_partition_bound
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

    @staticmethod
    def _popped_after(q, action):
        """What a pop of ``q`` blocked in another thread (10 s bound) returns once ``action``
        ran 0.1 s after it started."""
        result = {}
        th = threading.Thread(target=lambda: result.__setitem__("item", q.pop(10_000)))
        th.start()
        time.sleep(0.1)
        action()
        th.join(5)
        assert not th.is_alive()
        return result["item"]

    def test_blocked_pop_wakes_on_push(self):
        q = T.ScheduledQueue("q", 0)
        assert self._popped_after(q, lambda: q.push(7, 7, 7)) == (7, 7, 7)

    def test_close_wakes_blocked_pop(self):
        q = T.ScheduledQueue("q", 0)
        assert self._popped_after(q, q.close) is None
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
