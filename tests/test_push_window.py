"""The adaptive push window (core/cpp/scheduling/push_window.h), fed the acknowledgements of a
simulated path: a FIFO link of a given rate and one-way latency, a worker with a backlog of
equal partitions that sends while its window allows. The window must hold a few partitions
queued whatever the link rate, fill a long pipe, ignore a path that never queues, and survive
noisy delays without starving the link."""

from __future__ import annotations

import heapq
import random

import pytest

T = pytest.importorskip("byteps._core")

KIB = 1024
PART = 256 * KIB


def simulate(win, rate_Bps, latency_s=0.0, part=PART, pushes=4000, paths=(0,), noise=None,
             backlog=True, local=(), incast=None):
    """Runs ``pushes`` partitions through ``win``; returns (throughput / rate, windows seen in
    partitions after the first quarter). ``paths``: the servers pushed to in turn, all behind
    one NIC of ``rate_Bps``; those in ``local`` are on the worker's host (no NIC, no queueing).
    ``incast``: {server: rate} of a server whose own link is slower (others share it).
    ``noise(rng)``: seconds added to an acknowledgement."""
    rng = random.Random(1)
    t = link_free = 0.0
    in_flight = sent = done = 0
    server_free = {s: 0.0 for s in (incast or {})}
    acks: list = []
    windows = []
    while done < pushes:
        while sent < pushes and (in_flight == 0 or in_flight + part <= win.window):
            in_flight += part
            server = paths[sent % len(paths)]
            if server in local:
                end = t + 20e-6
            else:
                start = max(t, link_free)
                link_free = start + part / rate_Bps
                end = link_free
                if server in server_free:  # then through the server's slower link
                    end = server_free[server] = max(end, server_free[server]) + \
                        part / incast[server]
                end += 2 * latency_s
            if noise:
                end += noise(rng)
            win.on_send(server, server in local, part)
            heapq.heappush(acks, (end, sent, server, t))
            sent += 1
            if not backlog:
                break
        ack_t, _, server, sent_t = heapq.heappop(acks)
        t = max(t, ack_t)
        win.on_ack(server, part, int((t - sent_t) * 1e9), backlog and sent < pushes)
        in_flight -= part
        done += 1
        if done > pushes // 4:
            windows.append(win.window / part)
    return pushes * part / t / rate_Bps, windows


def window(start=4, lo=1, hi=32, part=PART, **kw):
    return T.PushWindow(start * part, lo * part, hi * part, **kw)


@pytest.mark.parametrize("mbit", [100, 800, 10_000, 100_000])
def test_link_bound_path_holds_a_few_partitions_at_every_rate(mbit):
    w = window()
    util, seen = simulate(w, mbit * 1e6 / 8)
    assert util > 0.97
    # low = 2, high = 4 partitions queued (the one on the wire counted)
    assert 1.5 <= sum(seen) / len(seen) <= 5.5, seen[-20:]
    assert max(seen) <= 6


def test_fixed_credit_equivalent_is_rate_independent():
    """The same partitions in flight at 100 Mbit/s and at 100 Gbit/s: the window is counted in
    partitions of the path, not in bytes fixed for one rate."""
    means = []
    for mbit in (100, 100_000):
        _, seen = simulate(window(), mbit * 1e6 / 8)
        means.append(sum(seen) / len(seen))
    assert abs(means[0] - means[1]) <= 1.0


def test_long_pipe_grows_the_window_until_it_is_full():
    # 10 Gbit/s, 1 ms each way: 2.5 MB in flight keep the link busy (about 10 partitions), far
    # more than the 4 partitions it starts with.
    rate = 10e9 / 8
    w = window(hi=64)
    util, seen = simulate(w, rate, latency_s=1e-3, pushes=8000)
    bdp_parts = rate * 2e-3 / PART
    assert util > 0.9
    assert seen[-1] >= bdp_parts
    assert seen[-1] <= bdp_parts + 8


def test_small_partitions_get_a_window_of_small_partitions():
    part = 60 * KIB
    w = T.PushWindow(4 * PART, PART, 32 * PART)  # starts at 4 x 256 KiB
    util, seen = simulate(w, 800e6 / 8, part=part)
    assert util > 0.95
    # in partitions of 60 KiB (simulate counts in its own): the floor, one 256 KiB bound, is
    # 4.3 of them; the ceiling high + the one on the wire
    assert 4 <= sum(seen) / len(seen) <= 7.5


def test_servers_behind_one_nic_share_the_queue():
    """Three remote servers and one on this host (the emulated cluster's k = 0): the queue on
    the NIC is counted once however many servers it holds pushes for, and the local pushes
    neither queue nor hold the window open."""
    w = window()
    util, seen = simulate(w, 100e6 / 8, paths=(0, 3, 1, 2), local=(3,))
    assert util > 1.3  # the local quarter of the bytes does not cross the NIC
    mean = sum(seen) / len(seen)
    assert 3 <= mean <= 9  # low..high queued on the NIC, plus the local pushes in flight


def test_queue_at_a_slow_server_is_bounded_on_its_own():
    """Two servers: one behind a link a third as fast as the worker's NIC (other workers push
    to it too). The NIC does not queue (the other server's pushes come back fast), so the
    NIC's rule alone would let the window grow; the slow server's own queue (`high`
    partitions) bounds it, and the NIC still sends at the slow server's bound (half the pushes
    at a third of the rate: 2/3 of the NIC)."""
    rate = 800e6 / 8
    w = window(hi=64)
    util, seen = simulate(w, rate, paths=(0, 1), incast={0: rate / 3})
    assert 3 <= sum(seen) / len(seen) <= 10
    assert util > 0.6


def test_not_growing_while_nothing_waits_for_credit():
    w = window()
    simulate(w, 10e9 / 8, latency_s=1e-3, pushes=2000, backlog=False)
    assert w.window == 4 * PART
    assert w.changes == 0


def test_noisy_delays_do_not_starve_the_link():
    # a tenth of the acknowledgements come 5 ms late (another process held the core)
    def noise(rng):
        return 5e-3 if rng.random() < 0.1 else 0.0

    w = window()
    util, seen = simulate(w, 800e6 / 8, noise=noise)
    assert util > 0.9
    assert min(seen) >= 1


def test_bounds_hold():
    w = T.PushWindow(4 * PART, 3 * PART, 5 * PART)
    _, seen = simulate(w, 1e9 / 8, latency_s=2e-3)  # wants far more than 5
    assert max(seen) == 5
    w = T.PushWindow(4 * PART, 3 * PART, 5 * PART)
    _, seen = simulate(w, 1e9 / 8, part=PART)
    assert min(seen) >= 3
    w = T.PushWindow(100 * PART, PART, 8 * PART)  # a start above the ceiling is clamped
    assert w.window == 8 * PART


def test_window_counts_queueing_against_the_fastest_push():
    """Delays as long as the fastest one mean an empty path (grow while pushes wait); delays
    that put more than `high` partitions in the queue shrink it; only local pushes: no
    change."""
    w = T.PushWindow(4 * PART, PART, 32 * PART)

    for _ in range(8):  # 8 partitions in flight to server 0 (plus one per ack below)
        w.on_send(0, False, PART)

    def ack(local, delay_ms):
        w.on_send(0, local, PART)
        return w.on_ack(0, PART, int(delay_ms * 1e6), True)

    ack(False, 1.0)  # the base: 1 ms
    for _ in range(8):
        ack(False, 1.0)
    grown = w.window
    assert grown > 4 * PART
    for _ in range(40):  # 8 in flight, 10 ms: 7.2 partitions queued
        ack(False, 10.0)
    assert w.window < grown
    before, changes = w.window, w.changes
    for _ in range(40):
        ack(True, 50.0)
    assert (w.window, w.changes) == (before, changes)


def test_lost_pushes_leave_their_path():
    """A push that failed no longer counts as queued: with 8 partitions in flight and 10 ms
    against a 1 ms base the window shrinks; once 6 of them are lost it does not."""
    for lost, shrinks in ((0, True), (6, False)):
        w = T.PushWindow(4 * PART, PART, 32 * PART)
        for _ in range(9):
            w.on_send(0, False, PART)
        w.on_ack(0, PART, 1_000_000, True)
        for _ in range(lost):
            w.on_lost(0, PART)
        for _ in range(16):
            w.on_send(0, False, PART)
            w.on_ack(0, PART, 10_000_000, True)
        assert (w.window < 4 * PART) == shrinks


# ------------------------------------------------------------------- in a running job --

WORKER = r"""
import json, os
import numpy as np
import byteps.basics as bps
from byteps import _core
bps.init()
r, size = bps.rank(), bps.size()
x = np.full(2 << 20, float(r + 1), np.float32)  # 8 MiB: 128 partitions of 64 KiB
out = np.empty_like(x)
for it in range(6):
    bps.wait(bps.push_pull_async("t", x.ctypes.data, out.ctypes.data, x.nbytes, "float32",
                                 x.shape, False))
    assert (out == size * (size + 1) / 2).all(), out[:4]
print("CREDIT " + json.dumps(_core.push_credit()), flush=True)
bps.shutdown()
"""


def _run_roles(extra_env, timeout=120):
    """A scheduler and a server advertising 127.0.0.2 (another host, as far as the workers can
    tell) and two worker machines on 127.0.0.1, started by hand; the workers' CREDIT dicts."""
    import json
    import os
    import sys

    from jobs import Group, free_port

    from byteps.launch.contract import ClusterSpec, JobIdentity, role_env

    spec = ClusterSpec(2, 1, 1, "127.0.0.2", free_port(), JobIdentity.fresh())
    base = {**os.environ, "BYTEPS_PARTITION_BYTES": "65536", **extra_env}
    server = [sys.executable, "-m", "byteps.server"]
    with Group() as group:  # stops (by PID) whatever still runs on the way out
        services = [group.start(server, role_env(spec, role, node_host="127.0.0.2", base=base),
                                label=role) for role in ("scheduler", "server")]
        workers = [group.start([sys.executable, "-c", WORKER],
                               role_env(spec, "worker", worker_id=w, local_rank=0,
                                        node_host="127.0.0.1", base=base), label=f"worker {w}")
                   for w in range(2)]
        group.wait_all(timeout, workers)
        outs = [p.output for p in workers]
        assert [p.returncode for p in workers] == [0, 0], outs
        for p in services:
            p.wait(30)
    return [json.loads(next(ln[7:] for ln in o.splitlines() if ln.startswith("CREDIT ")))
            for o in outs]


def test_a_job_without_a_credit_runs_the_adaptive_window():
    """No BYTEPS_SCHEDULING_CREDIT: the window adapts (the server is on another address than
    the workers, so its pushes are sampled), stays within one and 32 partition bounds, and
    the sums are exact."""
    for c in _run_roles({}):
        assert c["adaptive"] is True
        assert 65536 <= c["window_bytes"] <= T.ADAPTIVE_CREDIT_MAX_BOUNDS * 65536
        assert 65536 <= c["mean_window_bytes"] <= T.ADAPTIVE_CREDIT_MAX_BOUNDS * 65536
        assert c["changes"] >= 1


def test_a_set_credit_is_kept_as_given():
    for c in _run_roles({"BYTEPS_SCHEDULING_CREDIT": "2"}):
        assert c == {"adaptive": False, "window_bytes": 2 * 65536,
                     "mean_window_bytes": 2 * 65536.0, "changes": 0}
