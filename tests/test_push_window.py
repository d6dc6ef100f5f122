"""The adaptive push window (core/cpp/scheduling/push_window.h), fed the acknowledgements of a
simulated path: a FIFO link of a given rate and one-way latency, a worker with a backlog of
equal partitions that sends while its window allows. The window must hold a few partitions
queued whatever the link rate, fill a long pipe, ignore a path that never queues, and survive
noisy delays without starving the link."""

from __future__ import annotations

import heapq
import random

import pytest

T = pytest.importorskip("byteps._core").testing

KIB = 1024
PART = 256 * KIB


def simulate(win, rate_Bps, latency_s=0.0, part=PART, pushes=4000, paths=(0,), noise=None,
             backlog=True, seed=1):
    """Runs ``pushes`` partitions through ``win``; returns (throughput / rate, windows seen in
    partitions after the first quarter). ``paths``: the servers pushed to in turn; a negative
    one is a local server (no link, no queueing). ``noise(rng)``: seconds added to an ack."""
    rng = random.Random(seed)
    t = link_free = 0.0
    in_flight = sent = done = 0
    acks: list = []
    windows = []
    while done < pushes:
        while sent < pushes and (in_flight == 0 or in_flight + part <= win.window):
            in_flight += part
            server = paths[sent % len(paths)]
            if server < 0:
                end = t + 20e-6
            else:
                start = max(t, link_free)
                link_free = start + part / rate_Bps
                end = link_free + 2 * latency_s
            if noise:
                end += noise(rng)
            heapq.heappush(acks, (end, sent, server, t, in_flight))
            sent += 1
            if not backlog:
                break
        ack_t, _, server, sent_t, inflight = heapq.heappop(acks)
        t = max(t, ack_t)
        win.on_ack(server < 0, part, inflight, int((t - sent_t) * 1e9),
                   backlog and sent < pushes)
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
    # low = 3, high = 6 partitions queued (the one on the wire counted)
    assert 2.5 <= sum(seen) / len(seen) <= 7.5, seen[-20:]
    assert max(seen) <= 8


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


def test_a_local_server_that_never_queues_does_not_hold_the_window_open():
    w = window()
    util, seen = simulate(w, 100e6 / 8, paths=(0, -1, 1, 2))
    assert util > 0.5
    assert sum(seen) / len(seen) <= 8


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
    w.on_ack(False, PART, PART, 1_000_000, True)  # the base: 1 ms
    for _ in range(8):
        w.on_ack(False, PART, 4 * PART, 1_000_000, True)
    grown = w.window
    assert grown > 4 * PART
    for _ in range(40):  # 8 in flight, 10 ms: 7.2 partitions queued
        w.on_ack(False, PART, 8 * PART, 10_000_000, True)
    assert w.window < grown
    before, changes = w.window, w.changes
    for _ in range(40):
        w.on_ack(True, PART, 8 * PART, 50_000_000, True)
    assert (w.window, w.changes) == (before, changes)
