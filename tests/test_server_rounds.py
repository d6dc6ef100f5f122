"""The summation server's round logic in process, without sockets (docs/architecture.md §7).

``byteps._core_testing.SummationRounds`` drives ``ps/summation_engine.h`` as ``SummationServer``
does for each PUSH, PULL and STALL_QUERY frame, with a reply sink that records every answer.
Engines run inline (each event handled at once on the calling thread: deterministic) except in
the threaded test. Checked: sums of N workers bit for bit (float32, int32, float16, summed in
arrival order as the server does), parity (a fast worker's round r+1 beside a slow worker's pull
of round r), versions, pulls that wait for completion, late and duplicate pushes (logged and
ignored, state unchanged), stall reports, refusals (partition bound before allocation, size,
dtype, out of memory), the least-loaded engine binding, and a hypothesis property over random
interleavings of N workers' pushes and pulls (no wrong sum, no lost or extra reply).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testing_hooks import core_testing

from byteps.errors import InvalidArgumentError

T = core_testing()

BOUND = 1 << 20


def rounds(num_worker, **kw):
    return T.SummationRounds(num_worker=num_worker, partition_bound=kw.pop("bound", BOUND), **kw)


def data(worker, rnd, n=37, dtype="float32", key=0):
    """The push of (worker, round, key): distinct, deterministic values."""
    rng = np.random.default_rng(worker * 1_000_003 + rnd * 7919 + key)
    if dtype == "int32":
        return rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32)
    return (rng.standard_normal(n) * 100).astype(dtype)


def fold(arrays):
    """The server's sum: the first push, then each later one added in arrival order (float16
    computed in float32 and rounded once per addition, integers wrapping)."""
    acc = arrays[0].copy()
    for a in arrays[1:]:
        if acc.dtype == np.float16:
            acc = (acc.astype(np.float32) + a.astype(np.float32)).astype(np.float16)
        else:
            with np.errstate(over="ignore"):
                acc = acc + a
    return acc


def sums(replies):
    return [r for r in replies if r[0] == "sum"]


def key_state(r, key):
    """The parts of a key's state that a refused request must leave alone."""
    s = r.key_state(key)
    return {k: s[k] for k in ("round", "opened", "count", "complete", "waiting", "pushed", "sum")}


# ---- sums ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixed", [False, True], ids=["rotating", "fixed-slots"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1], [1, 2, 0]])
def test_sum_of_n_workers_bit_for_bit(dtype, order, fixed):
    """Also with fixed slots (a server whose workers write pushes one-way, docs/rdma.md): the
    second push sums the first two slots, the same bits as the rotation's addition."""
    r = rounds(3, fixed_staging=fixed)
    for rnd in (1, 2, 3):
        pushed = []
        for i, w in enumerate(order):
            x = data(w, rnd, dtype=dtype)
            pushed.append(x)
            assert r.push(7, w, rnd, x.tobytes(), dtype=dtype, pull=True)
            if i < len(order) - 1:
                assert r.replies() == []  # nobody is answered before everyone pushed
        got = r.replies()
        assert [g[1] for g in got] == order and all(g[0] == "sum" for g in got)
        want = fold(pushed).tobytes()
        for _kind, w, key, got_round, payload in got:
            assert (key, got_round) == (7, rnd)
            assert payload == want, (dtype, w, rnd)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fixed_slots_stay_where_they_are_and_sum_every_round(n):
    """With fixed slots every worker's push lands at the same address every round (what a
    window points at), rotating keys move theirs; a lone pusher's slot is copied into the sum,
    so its next push cannot change the answer already given."""
    fixed, rotating = rounds(n, fixed_staging=True), rounds(n)
    for r in (fixed, rotating):
        slots = []
        for rnd in (1, 2, 3, 4):
            xs = [data(w, rnd) for w in range(n)]
            for w in range(n):
                assert r.push(5, w, rnd, xs[w].tobytes())
            got = r.replies()
            assert [g[4] for g in got] == [fold(xs).tobytes()] * n
            slots.append(r.key_state(5)["staging"])
        state = r.key_state(5)
        if r is fixed:
            assert state["fixed_staging"] and all(s == slots[0] for s in slots), slots
        else:
            assert not state["fixed_staging"] and any(s != slots[0] for s in slots), slots
    # a lone pusher: its reply is a copy, not its slot
    one = rounds(1, fixed_staging=True)
    one.push(9, 0, 1, data(0, 1).tobytes())
    first = one.replies()[0][4]
    one.push(9, 0, 2, data(0, 2).tobytes())
    sums_by_parity = one.key_state(9)["sum"]  # [round 2's, round 1's]
    assert first == data(0, 1).tobytes() and sums_by_parity[1] == first
    assert one.replies()[0][4] == sums_by_parity[0] == data(0, 2).tobytes()


def test_float32_sum_is_exact_for_integral_values():
    r = rounds(4)
    xs = [np.arange(1000, dtype=np.float32) * (w + 1) for w in range(4)]
    for w, x in enumerate(xs):
        r.push(1, w, 1, x.tobytes())
    got = r.replies()
    assert len(got) == 4
    assert all(np.array_equal(np.frombuffer(g[4], np.float32), np.arange(1000) * 10) for g in got)


# ---- parity and versions -------------------------------------------------------------------


def test_fast_worker_next_round_beside_slow_pull():
    """Round r and r+1 interleaved: worker 0 received round 1 and pushes round 2 before worker 1
    pulled round 1; worker 1 still gets round 1's sum, then both get round 2's."""
    r = rounds(2)
    a1, b1, a2, b2 = data(0, 1), data(1, 1), data(0, 2), data(1, 2)
    r.push(5, 0, 1, a1.tobytes(), pull=True)
    r.push(5, 1, 1, b1.tobytes(), pull=False)  # the slow worker pulls later
    assert sums(r.replies()) == [("sum", 0, 5, 1, fold([a1, b1]).tobytes())]
    r.push(5, 0, 2, a2.tobytes(), pull=True)  # round 2 opens (parity 0): its buffer rotates
    assert r.replies() == []
    r.pull(5, 1, 1)
    assert r.replies() == [("sum", 1, 5, 1, fold([a1, b1]).tobytes())]
    r.push(5, 1, 2, b2.tobytes(), pull=True)
    want2 = fold([a2, b2]).tobytes()
    assert sorted(r.replies()) == [("sum", 0, 5, 2, want2), ("sum", 1, 5, 2, want2)]
    # Round 3 reuses parity 1; round 1's sum buffer became a staging buffer and back.
    a3, b3 = data(0, 3), data(1, 3)
    r.push(5, 1, 3, b3.tobytes())
    r.push(5, 0, 3, a3.tobytes())
    want3 = fold([b3, a3]).tobytes()
    assert sorted(r.replies()) == [("sum", 0, 5, 3, want3), ("sum", 1, 5, 3, want3)]


def test_pull_of_round_r_gets_round_r_while_r_plus_1_is_open():
    r = rounds(3)
    first = [data(w, 10) for w in range(3)]
    for w in range(3):
        r.push(2, w, 10, first[w].tobytes(), pull=False)
    r.push(2, 2, 11, data(2, 11).tobytes(), pull=True)  # round 11 is open
    s = r.key_state(2)
    assert s["round"] == [10, 11] and s["complete"] == [True, False] and s["count"] == [0, 1]
    for w in (0, 1):
        r.pull(2, w, 10)
    assert r.replies() == [("sum", w, 2, 10, fold(first).tobytes()) for w in (0, 1)]
    # A pull of round 11 waits for round 11, and is never answered with round 10's sum.
    r.pull(2, 0, 11)
    assert r.replies() == []
    second = [data(2, 11), data(0, 11), data(1, 11)]
    r.push(2, 0, 11, second[1].tobytes(), pull=False)
    r.push(2, 1, 11, second[2].tobytes(), pull=False)
    assert r.replies() == [("sum", 2, 2, 11, fold(second).tobytes()),
                           ("sum", 0, 2, 11, fold(second).tobytes())]


def test_pulls_before_completion_wait_and_are_answered_on_completion():
    r = rounds(3)
    r.pull(9, 1, 1)  # unknown key: an error, not a wait
    assert r.replies() == [("error", 1, "pull of unknown key 9")]
    xs = [data(w, 1) for w in range(3)]
    r.push(9, 0, 1, xs[0].tobytes(), pull=False)
    r.pull(9, 1, 1)
    r.pull(9, 2, 1)  # before its own push
    assert r.replies() == [] and r.key_state(9)["waiting"][1] == [1, 2]
    r.push(9, 1, 1, xs[1].tobytes(), pull=False)
    assert r.replies() == []
    r.push(9, 2, 1, xs[2].tobytes(), pull=False)
    want = fold(xs).tobytes()
    assert r.replies() == [("sum", 1, 9, 1, want), ("sum", 2, 9, 1, want)]
    assert r.key_state(9)["waiting"] == [[], []]
    r.pull(9, 0, 1)  # after completion: answered at once
    assert r.replies() == [("sum", 0, 9, 1, want)]


# ---- late and duplicate pushes ---------------------------------------------------------------


def complete_round(r, key, rnd, n, pull=True):
    xs = [data(w, rnd, key=key) for w in range(n)]
    for w in range(n):
        r.push(key, w, rnd, xs[w].tobytes(), pull=pull)
    return fold(xs).tobytes()


def test_late_push_of_an_old_round_is_logged_and_ignored(capfd):
    r = rounds(2)
    complete_round(r, 4, 1, 2)
    complete_round(r, 4, 2, 2)
    a3 = data(0, 3)
    r.push(4, 0, 3, a3.tobytes())  # round 3 open at parity 1
    r.replies()
    before = key_state(r, 4)
    # Round 1 (parity 1) while round 3 is open.
    assert r.push(4, 1, 1, data(1, 99).tobytes())
    assert r.replies() == [] and key_state(r, 4) == before
    assert "push of round 1 from worker 1 while round 3 is open" in capfd.readouterr().err
    # Round 2 (parity 0) after it completed, nothing open at parity 0: it must not reopen it.
    assert r.push(4, 1, 2, data(1, 98).tobytes())
    assert r.replies() == [] and key_state(r, 4) == before
    assert "push of round 2 from worker 1 after round 2 completed; ignored" in \
        capfd.readouterr().err
    b3 = data(1, 3)
    r.push(4, 1, 3, b3.tobytes())
    want = fold([a3, b3]).tobytes()
    assert sorted(r.replies()) == [("sum", 0, 4, 3, want), ("sum", 1, 4, 3, want)]


def test_duplicate_push_in_the_open_round_is_refused(capfd):
    """Counted once: before the round logic had its own class a second push of the same worker
    was counted too, completing the round early with that worker's data twice."""
    r = rounds(3)
    xs = [data(w, 1) for w in range(3)]
    r.push(3, 0, 1, xs[0].tobytes(), pull=True)
    before = key_state(r, 3)
    assert r.push(3, 0, 1, data(0, 77).tobytes(), pull=True)
    assert "second push of round 1 from worker 0; ignored" in capfd.readouterr().err
    assert r.replies() == [] and key_state(r, 3) == before
    assert before["count"][1] == 1 and before["pushed"][1] == [1, 0, 0]
    r.push(3, 1, 1, xs[1].tobytes(), pull=True)
    assert r.replies() == []
    r.push(3, 2, 1, xs[2].tobytes(), pull=True)
    want = fold(xs).tobytes()
    assert r.replies() == [("sum", w, 3, 1, want) for w in range(3)]  # one reply each


def test_duplicate_push_after_completion_does_not_reopen_the_round():
    r = rounds(2)
    a, b = data(0, 1), data(1, 1)
    r.push(6, 0, 1, a.tobytes(), pull=True)
    r.push(6, 1, 1, b.tobytes(), pull=False)
    r.replies()
    before = key_state(r, 6)
    r.push(6, 0, 1, data(0, 55).tobytes(), pull=True)  # worker 0 again, round 1 is complete
    assert r.replies() == [] and key_state(r, 6) == before
    r.pull(6, 1, 1)  # the slow worker still gets round 1, at once
    assert r.replies() == [("sum", 1, 6, 1, fold([a, b]).tobytes())]


# ---- stall reports ---------------------------------------------------------------------------


def test_stall_queries_name_the_missing_workers():
    r = rounds(4)
    r.stall_query(8, 2, 1)  # nobody pushed the key yet
    assert r.replies() == [("stall", 2, 8, 1, [0, 1, 2, 3])]
    r.push(8, 1, 1, data(1, 1).tobytes())
    r.push(8, 3, 1, data(3, 1).tobytes())
    r.stall_query(8, 1, 1)
    assert r.replies() == [("stall", 1, 8, 1, [0, 2])]
    r.stall_query(8, 1, 2)  # round 2 not open yet: everyone is missing
    assert r.replies() == [("stall", 1, 8, 2, [0, 1, 2, 3])]
    r.push(8, 0, 1, data(0, 1).tobytes())
    r.push(8, 2, 1, data(2, 1).tobytes())
    r.replies()
    r.stall_query(8, 0, 1)  # complete: nobody is missing
    assert r.replies() == [("stall", 0, 8, 1, [])]


# ---- refusals --------------------------------------------------------------------------------


def test_push_larger_than_the_partition_bound_is_refused_before_allocation():
    r = rounds(2, bound=4096)
    with pytest.raises(InvalidArgumentError,
                       match=r"push of key 1 with 4100 bytes, larger than the job's partitions "
                             r"\(4096 bytes\)"):
        r.push(1, 0, 1, bytes(4100))
    with pytest.raises(InvalidArgumentError, match="larger than the job's partitions"):
        r.push_buffer(2, 0, 1 << 40)  # a terabyte claimed: nothing allocated for it
    assert r.num_keys == 0 and r.key_state(1) is None and r.replies() == []
    assert r.engine_loads == [0, 0]
    assert r.push(1, 0, 1, bytes(4096))  # the bound itself is allowed
    assert r.num_keys == 1


def test_refused_pushes_are_errors_to_the_worker():
    r = rounds(2)
    assert not r.push(1, 0, 1, bytes(6), dtype="float32")
    assert r.replies() == [("error", 0, "push of key 1 has 6 bytes, not a multiple of float32")]
    assert r.num_keys == 0
    assert r.push(1, 0, 1, bytes(16), dtype="float32")
    before = key_state(r, 1)
    assert not r.push(1, 1, 1, bytes(32), dtype="float32")
    assert not r.push(1, 1, 1, bytes(16), dtype="int32")
    assert r.replies() == [
        ("error", 1, "server 0: push of key 1 from worker 1 has 32 bytes of float32, but the key "
                     "holds 16 bytes of float32"),
        ("error", 1, "server 0: push of key 1 from worker 1 has 16 bytes of int32, but the key "
                     "holds 16 bytes of float32")]
    assert key_state(r, 1) == before


def test_out_of_memory_for_a_key_is_an_error_not_an_abort():
    r = rounds(2, bound=1 << 62, rank=3)
    # 2^60 bytes exceed every x86-64 and arm64 address space, whatever the overcommit policy.
    assert not r.push_buffer(11, 1, 1 << 60, "float32")
    assert r.replies() == [("error", 1, f"server 3: out of memory for key 11 ({1 << 60} bytes)")]
    assert r.num_keys == 0 and r.engine_loads == [0, 0]


# ---- engines ---------------------------------------------------------------------------------


def test_each_key_is_bound_to_the_least_loaded_engine():
    r = rounds(1, engines=2)
    for key, nbytes, engine in [(1, 4096, 0), (2, 1024, 1), (3, 1024, 1), (4, 2048, 1),
                                (5, 8, 0), (6, 4, 1)]:
        assert r.push_buffer(key, 0, nbytes)
        assert r.key_state(key)["engine"] == engine, key
    assert r.engine_loads == [4104, 4100]
    assert r.push_buffer(1, 0, 4096)  # an existing key stays where it is
    assert r.engine_loads == [4104, 4100]


@pytest.mark.parametrize("threaded", [False, True])
def test_retired_generations_are_freed_and_the_new_cut_goes_on(threaded):
    """RETIRE_KEYS (BYTEPS_AUTOTUNE cut a tensor anew): the tensor's keys of older
    generations (key bits 32-47) are freed, with their engines' load; another tensor's keys and
    the newest generation stay, and go on summing."""
    r = rounds(2, engines=2, threaded=threaded)

    def key(declared, gen, index):
        return gen << 32 | declared << 16 | index

    try:
        held = [key(3, g, i) for g in (0, 1, 2) for i in range(2)] + [key(4, 0, 0)]
        for k in held:
            for w in range(2):
                r.push(k, w, 1, data(w, 1, n=64, key=k).tobytes(), pull=True)
        if threaded:
            assert r.wait_replies(2 * len(held), 10.0)
        r.replies()
        assert r.key_census() == (7, 4)  # tensor 3's generations 0 and 1 are older than 2
        loads = sum(r.engine_loads)
        assert r.retire(3, 2) == 4
        deadline = time.monotonic() + 10
        while r.num_keys != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.key_census() == (3, 0)
        assert sum(r.engine_loads) == loads - 4 * 256
        assert all(r.key_state(key(3, g, i)) is None for g in (0, 1) for i in range(2))
        assert r.retire(3, 2) == 0 and r.retire(4, 0) == 0  # nothing older: nothing retired
        for k in (key(3, 2, 0), key(4, 0, 0)):
            xs = [data(w, 2, n=64, key=k) for w in range(2)]
            for w in range(2):
                r.push(k, w, 2, xs[w].tobytes(), pull=True)
        if threaded:
            assert r.wait_replies(4, 10.0)
        got = r.replies()
        assert len(got) == 4 and all(kind == "sum" and rnd == 2 for kind, _, _, rnd, _ in got)
    finally:
        r.stop()


def test_threaded_engines_sum_every_key_every_round():
    n, keys, nrounds = 3, [1, 2, 3, 4, 5], 6
    r = rounds(n, engines=2, threaded=True)
    try:
        for rnd in range(1, nrounds + 1):
            want = {}
            for key in keys:
                xs = [data(w, rnd, n=1000, key=key) for w in range(n)]
                want[key] = xs
                for w in (rnd % n, (rnd + 1) % n, (rnd + 2) % n):
                    r.push(key, w, rnd, xs[w].tobytes(), pull=True)
            assert r.wait_replies(n * len(keys), 10.0)
            got = r.replies()
            assert len(got) == n * len(keys)
            for kind, _w, key, got_round, payload in got:
                assert kind == "sum" and got_round == rnd
                order = [want[key][(rnd + i) % n] for i in range(n)]
                assert payload == fold(order).tobytes()
    finally:
        r.stop()


# ---- property: random interleavings ----------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_interleavings_never_give_a_wrong_sum_or_lose_a_reply(draw):
    n = draw.draw(st.integers(1, 4), "workers")
    nkeys = draw.draw(st.integers(1, 3), "keys")
    nrounds = draw.draw(st.integers(1, 5), "rounds")
    dtype = draw.draw(st.sampled_from(["float32", "int32", "float16"]), "dtype")
    # Per worker: ask for the sum with the push (kPushFlagPull) or with a separate PULL.
    pull_too = draw.draw(st.lists(st.booleans(), min_size=n, max_size=n), "pull_too")
    r = rounds(n, engines=draw.draw(st.integers(1, 3), "engines"),
               fixed_staging=draw.draw(st.booleans(), "fixed_slots"))
    sizes = {k: 1 + (k * 13) % 29 for k in range(nkeys)}
    received = {(w, k): 0 for w in range(n) for k in range(nkeys)}  # last round received
    pushed = {(w, k): 0 for w in range(n) for k in range(nkeys)}
    pulled = {(w, k): 0 for w in range(n) for k in range(nkeys)}
    arrivals = {}  # (key, round) -> pushes in arrival order

    def enabled():
        acts = []
        for (w, k), got in received.items():
            nxt = got + 1
            if nxt > nrounds:
                continue
            if pushed[w, k] < nxt:
                acts.append(("push", w, k, nxt))
            if not pull_too[w] and pushed[w, k] == nxt and pulled[w, k] < nxt:
                acts.append(("pull", w, k, nxt))  # after its own push, as a worker sends it
        return acts

    while acts := enabled():
        kind, w, k, rnd = draw.draw(st.sampled_from(acts))
        if kind == "push":
            x = data(w, rnd, n=sizes[k], dtype=dtype, key=k)
            arrivals.setdefault((k, rnd), []).append(x)
            assert r.push(k, w, rnd, x.tobytes(), dtype=dtype, pull=pull_too[w])
            pushed[w, k] = rnd
        else:
            r.pull(k, w, rnd)
            pulled[w, k] = rnd
        for reply in r.replies():
            assert reply[0] == "sum", reply
            _, rw, rk, rr, payload = reply
            assert rr == received[rw, rk] + 1, ("out of order or repeated", reply[:4])
            assert len(arrivals[rk, rr]) == n, "answered before every worker pushed"
            assert payload == fold(arrivals[rk, rr]).tobytes(), ("wrong sum", reply[:4])
            received[rw, rk] = rr
    assert all(got == nrounds for got in received.values()), received  # no lost reply
