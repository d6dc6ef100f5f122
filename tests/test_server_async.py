"""The summation server's asynchronous mode in process, without sockets (docs/async.md).

``byteps._core_testing.SummationRounds`` with ``set_async`` drives ``ps/async_rounds.cc`` as a
server does for each PUSH flagged asynchronous (engines inline: deterministic). Checked: the
store starts from worker 0's round-1 push whatever the arrival order (not zeros); every later
push is a delta added at once and answered with the value, bit for bit, with no round barrier
across workers; the staleness bound holds a reply exactly while the worker is more than s rounds
ahead of the slowest live worker and the stall report names that worker; a worker that leaves
no longer holds anyone back (nor the initial value); refusals (an asynchronous push to a server
in synchronous mode, a synchronous push to an asynchronous key, a round out of order); a
hypothesis property over random schedules with int32 deltas (exact in any order): no reply
breaks the bound, none is lost, the final store is the initial value plus every delta.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from testing_hooks import core_testing

T = core_testing()


BOUND = 1 << 20
N = 37


def engine(num_worker, staleness=-1, **kw):
    r = T.SummationRounds(num_worker=num_worker, partition_bound=BOUND, **kw)
    r.set_async(True, staleness)
    return r


def vec(seed, dtype="float32"):
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        return rng.integers(-1000, 1000, N, dtype=np.int32)
    return rng.standard_normal(N).astype(dtype)


def push(r, w, rnd, x, key=5, **kw):
    return r.push(key, w, rnd, x.tobytes(), dtype=str(x.dtype), async_key=True, **kw)


def values(replies, dtype="float32"):
    """{worker: (round, array)} of the value replies, in order (last wins)."""
    out = {}
    for rep in replies:
        assert rep[0] == "value", rep
        out[rep[1]] = (rep[3], np.frombuffer(rep[4], dtype=dtype))
    return out


def test_store_starts_from_worker_0_not_zeros_whatever_the_order():
    r = engine(3)
    w = {i: vec(i) for i in range(3)}
    assert push(r, 2, 1, w[2]) and push(r, 1, 1, w[1])
    assert r.replies() == []  # nobody has a value before worker 0's
    assert r.key_state(5)["initialized"] is False
    assert push(r, 0, 1, w[0])
    got = r.replies()
    assert sorted(g[1] for g in got) == [0, 1, 2]
    for _kind, _w, key, rnd, payload in got:
        assert key == 5 and rnd == 1
        assert payload == w[0].tobytes()  # rank 0's initial value, bit for bit
    s = r.key_state(5)
    assert s["async"] and s["initialized"] and s["version"] == 0
    # A late (or restarted) worker's round 1 gets the store as it is.
    assert push(r, 1, 1, vec(99)) and values(r.replies())[1][1].tobytes() == w[0].tobytes()


def test_deltas_added_at_once_without_a_round_barrier():
    r = engine(2)
    init = vec(0)
    push(r, 0, 1, init)
    push(r, 1, 1, vec(1))
    r.replies()
    expect = init.copy()
    # Worker 0 runs 8 rounds while worker 1 stays at round 1: each answered at once.
    for rnd in range(2, 10):
        d = vec(100 + rnd) * np.float32(0.01)
        push(r, 0, rnd, d)
        expect = expect + d
        got = r.replies()
        assert len(got) == 1 and got[0][1] == 0 and got[0][3] == rnd
        assert got[0][4] == expect.tobytes()
    d1 = vec(7) * np.float32(0.01)
    push(r, 1, 2, d1)
    expect = expect + d1
    got = values(r.replies())
    assert got[1][0] == 2 and got[1][1].tobytes() == expect.tobytes()
    s = r.key_state(5)
    assert s["version"] == 9 and s["worker_round"] == [9, 2]
    assert s["store"] == expect.tobytes()


def test_pull_answers_the_current_value_and_push_without_pull_is_silent():
    r = engine(2)
    push(r, 0, 1, vec(0))
    r.replies()
    d = vec(1)
    push(r, 0, 2, d, pull=False)
    assert r.replies() == []
    r.pull(5, 1, 1)
    (_kind, w, _key, rnd, payload), = r.replies()
    assert (w, rnd) == (1, 1) and payload == (vec(0) + d).tobytes()


def test_staleness_bound_holds_the_fast_worker_and_names_the_slow_one():
    s = 1
    r = engine(2, staleness=s)
    push(r, 0, 1, vec(0))
    push(r, 1, 1, vec(1))
    assert len(r.replies()) == 2
    push(r, 0, 2, vec(2))  # 2 <= 1 + s: answered
    assert [g[3] for g in r.replies()] == [2]
    push(r, 0, 3, vec(3))  # 3 > 1 + s: held, but its delta is in the store already
    assert r.replies() == []
    assert r.key_state(5)["held"] == [3, 0] and r.key_state(5)["version"] == 2
    r.stall_query(5, 0, 3)
    assert r.replies() == [("stall", 0, 5, 3, [1])]
    r.stall_query(5, 1, 2)  # worker 1 waits for nobody
    assert r.replies() == [("stall", 1, 5, 2, [])]
    push(r, 1, 2, vec(4))  # the slowest reaches 2: worker 0's round 3 goes, then worker 1's
    got = r.replies()
    assert [(g[1], g[3]) for g in got] == [(1, 2), (0, 3)]
    want = (vec(0) + vec(2) + vec(3) + vec(4)).tobytes()
    assert got[0][4] == want and got[1][4] == want
    assert r.key_state(5)["held"] == [0, 0]


def test_staleness_zero_waits_for_every_live_worker_each_round():
    r = engine(3, staleness=0)
    push(r, 0, 1, vec(0))
    assert r.replies() == []  # round 1 > 0 + 0 while workers 1 and 2 have not pushed
    push(r, 1, 1, vec(1))
    assert r.replies() == []
    push(r, 2, 1, vec(2))
    assert sorted(g[1] for g in r.replies()) == [0, 1, 2]


def test_a_worker_that_leaves_holds_no_one_back():
    r = engine(3, staleness=1)
    for w in range(3):
        push(r, w, 1, vec(w))
    r.replies()
    push(r, 0, 2, vec(10))
    push(r, 0, 3, vec(11))  # held: workers 1 and 2 are at round 1
    push(r, 1, 2, vec(12))
    push(r, 1, 3, vec(13))  # held as well
    assert [(g[1], g[3]) for g in r.replies()] == [(0, 2), (1, 2)]
    r.worker_left(2)
    assert sorted((g[1], g[3]) for g in r.replies()) == [(0, 3), (1, 3)]
    r.worker_left(2)  # idempotent
    assert r.replies() == []


def test_initial_value_from_the_lowest_live_worker_when_worker_0_left_first():
    r = engine(3)
    push(r, 1, 1, vec(1))
    push(r, 2, 1, vec(2))
    assert r.replies() == []
    r.worker_left(0)
    got = r.replies()
    assert sorted(g[1] for g in got) == [1, 2]
    assert all(g[4] == vec(1).tobytes() for g in got)


def test_refusals():
    sync = T.SummationRounds(num_worker=2, partition_bound=BOUND)
    assert not push(sync, 0, 1, vec(0))
    (kind, w, msg), = sync.replies()
    assert kind == "error" and w == 0 and "BYTEPS_ENABLE_ASYNC=0" in msg
    r = engine(2)
    push(r, 0, 1, vec(0))
    r.replies()
    assert not r.push(5, 1, 1, vec(1).tobytes())  # a synchronous push of an asynchronous key
    assert "asynchronous parameter" in r.replies()[0][2]
    assert r.push(6, 1, 1, vec(1).tobytes())  # a synchronous key beside it
    assert not push(r, 0, 1, vec(0), key=6)
    assert "synchronously" in r.replies()[0][2]
    before = r.key_state(5)["store"]
    push(r, 0, 3, vec(3))
    push(r, 0, 2, vec(2))  # out of order: refused, store unchanged
    got = r.replies()
    assert got[0][0] == "value" and got[1][0] == "error" and "out of order" in got[1][2]
    assert r.key_state(5)["store"] == (np.frombuffer(before, np.float32) + vec(3)).tobytes()


def test_threaded_engines_answer_every_worker():
    r = engine(2, staleness=2, threaded=True, engines=2)
    try:
        for key in (1, 2, 3):
            push(r, 0, 1, vec(key), key=key)
            push(r, 1, 1, vec(key + 10), key=key)
        assert r.wait_replies(6, 10)
        got = r.replies()
        assert len(got) == 6 and all(g[0] == "value" for g in got)
        for g in got:
            assert g[4] == vec(g[2]).tobytes()
    finally:
        r.stop()


@settings(max_examples=60, deadline=None)
@given(num_worker=st.integers(2, 4), staleness=st.integers(-1, 3),
       schedule=st.lists(st.integers(0, 3), min_size=1, max_size=60), seed=st.integers(0, 99))
def test_random_schedules_keep_the_bound_and_lose_nothing(num_worker, staleness, schedule, seed):
    """Workers push when their previous reply came (as the pipeline does); the schedule picks
    who tries next. int32 deltas: the store is exact in any order."""
    r = engine(num_worker, staleness=staleness)
    init = vec(seed, "int32")
    pushed = [0] * num_worker   # rounds pushed
    answered = [0] * num_worker  # rounds answered
    total = init.astype(np.int64)
    for w in range(num_worker):
        push(r, w, 1, init if w == 0 else vec(seed + w, "int32"))
        pushed[w] = 1
    steps = [w % num_worker for w in schedule] + list(range(num_worker)) * 4

    def collect():
        for kind, w, _key, rnd, payload in r.replies():
            assert kind == "value" and rnd == pushed[w] and answered[w] == rnd - 1
            # The value when sent: the initial value and every delta so far.
            assert payload == total.astype(np.int32).tobytes()
            if staleness >= 0:  # the bound, against the rounds pushed when it was sent
                assert rnd <= min(pushed) + staleness
            answered[w] = rnd

    collect()
    for w in steps:
        if answered[w] < pushed[w]:
            continue  # still waiting for its reply: it cannot push
        d = vec(seed * 100 + pushed[w] * 10 + w, "int32")
        pushed[w] += 1
        total += d
        push(r, w, pushed[w], d)
        collect()
    assert answered == pushed or staleness >= 0
    assert np.array_equal(np.frombuffer(r.key_state(5)["store"], np.int32), total.astype(np.int32))
    # Every worker that still waits, waits for the bound only.
    for w in range(num_worker):
        if answered[w] < pushed[w]:
            assert staleness >= 0 and pushed[w] > min(pushed) + staleness
