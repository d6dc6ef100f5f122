"""The α-β-γ cost model (byteps.cost_model, byteps.sync.cost_formulas; docs/schemes.md "The cost
model"): the formulas against hand-computed values, the simulator and the core's
``OptimalCommTime``; the choice per size (boundaries, ties, consistency with the costs); the
variables and their errors; the measurement on a real 2-worker loopback job."""

from __future__ import annotations

import json
import math
import random

import pytest
from jobs import TESTS, assert_ok, run_job, worker_lines
from testing_hooks import core_testing

import byteps
from byteps import _core, sim
from byteps.errors import ConfigError, InvalidArgumentError, InvalidTypeError, NotInitializedError
from byteps.sim import collectives
from byteps.sync import cost_formulas, cost_model

WORKER = str(TESTS / "workers" / "cost_model_worker.py")
VARS = ("BYTEPS_COST_ALPHA", "BYTEPS_COST_BETA", "BYTEPS_COST_GAMMA")

# ----------------------------------------------------------------------------- the formulas --


def coeffs(c):
    return (c.messages, c.wire, c.summed, c.nic, c.fill)


def test_formulas_hand_computed():
    ap = pytest.approx
    assert coeffs(cost_formulas.ring(4)) == ap((6, 1.5, 0.75, 1.5, 0))
    # FlexTree n = 4, w = 2: 2 groups of 2; per partition each machine sends S/2 in its group's
    # reduce-scatter and all-gather and S/2 to its heap neighbour: 1.5 S each way, the ring's
    # bytes; one partition alone takes 4 chunk times one after another (2 S): fill 0.5
    assert coeffs(cost_formulas.tree(4, 2)) == ap((4, 1.5, 1, 1.5, 0.5))
    # n = 8, w = 2: 4 groups in a heap of depth 2, at most 2 neighbours (group 1: parent 0 and
    # child 3): (2 + 2) / 2; the heap's passes take 4 chunk times: fill (2 + 4) / 2 - 2
    assert coeffs(cost_formulas.tree(8, 2)) == ap((2 + 4, 2, 0.5 + 1, 2, 1))
    # width n is the ring; width 1 a binary tree (n = 5: depth floor(log2 5) = 2, machine 1 has
    # a parent and 2 children: 3 S each way; up 1 <- 3, 4 (2), 0 <- 2, 1 (3); down 0 -> 1, 2
    # (5), 1 -> 3, 4 (6): 6 S for one partition, fill 6 - 3)
    assert coeffs(cost_formulas.tree(8, 8)) == ap(coeffs(cost_formulas.ring(8)))
    assert coeffs(cost_formulas.tree(5, 1)) == ap((4, 3, 2, 3, 3))
    # HiPS n = 9, g = 3: 3 groups; n = 16 default group round(sqrt(16)) = 4
    assert coeffs(cost_formulas.hips(9, 3)) == ap((4, 4 / 3 + 4 / 9, 2 / 3 + 2 / 9, 16 / 9,
                                                   32 / 9))
    assert cost_formulas.hips_group(16) == 4 and cost_formulas.hips_group(3) == 2
    # the summation service: n = 4 with k = 0, 2, 4 CPU-only servers, and k = 8 > n (capped)
    assert coeffs(cost_formulas.ps(4, 0)) == ap((2, 1.5, 0.75, 1.5, 1.5))
    assert coeffs(cost_formulas.ps(4, 2)) == ap((2, 24 / 20, 3 * 6 / 20, 24 / 20, 24 / 20))
    assert coeffs(cost_formulas.ps(4, 4)) == ap((2, 1.0, 0.75, 1.0, 1.0))
    assert coeffs(cost_formulas.ps(4, 8)) == ap((2, 1.0, 3 / 8, 1.0, 1.0))
    for s in cost_formulas.SCHEMES:  # one machine: no network, nothing summed
        assert coeffs(cost_formulas.scheme_cost(s, 1, 3, 2, 2)) == (0, 0, 0, 0, 0)
    # the ring of the brief: 2(N-1)α + 2(N-1)S/N β + (N-1)S/N γ at N = 4, S = 1e6
    a, b, g, S = 1e-5, 1e-10, 2e-11, 1e6
    assert cost_formulas.ring(4).seconds(S, a, b, g) == ap(6 * a + 1.5 * S * b + 0.75 * S * g)
    with pytest.raises(InvalidArgumentError, match="unknown scheme 'mesh'"):
        cost_formulas.scheme_cost("mesh", 4)
    with pytest.raises(InvalidArgumentError, match="machines"):
        cost_formulas.ring(0)


def test_ps_formula_is_the_cores_optimum_and_shares():
    T = core_testing()
    for n in range(2, 12):
        for k in range(0, n + 1):
            c = cost_formulas.ps(n, k)
            assert c.wire_seconds(1e9, 1 / 3e9) == pytest.approx(
                T.optimal_comm_time(n, k, 1e9, 3e9), rel=1e-12)
            assert sim.t_opt(n, k, 1e9, 3e9) == pytest.approx(c.wire_seconds(1e9, 1 / 3e9))
            shares = T.server_shares(n, [True] * n + [False] * k)
            cpu, colocated = cost_formulas.ps_shares(n, k)
            assert shares[:n] == pytest.approx([colocated] * n)
            assert shares[n:] == pytest.approx([cpu] * k)
            assert c.summed == pytest.approx((n - 1) * max(shares))


def test_simulator_uses_the_same_formulas():
    """collectives.bucket_time is the formulas with β = 1/B (GPU summation free for ring and
    tree, hips summing at 1 / (threads · rate), the fill on the bucket's first partition, HiPS
    with byteps's servers on the cluster), and the message-level PS simulation of one large
    tensor lands on the ps formula."""
    from byteps._core import tensor_partition_bound

    for n in (2, 3, 4, 8, 16, 33):
        for name, w, g in (("ring", 1, 0), ("tree", 1, 0), ("tree", 4, 0), ("hips", 1, 0),
                           ("hips", 1, 3)):
            cl = sim.Cluster(n, bandwidth=5e9, latency=7e-6, server_threads=3, sum_rate=2e10)
            S = 25 << 20
            got = collectives.bucket_time(sim.Scheme(name, tree_width=w, hips_group=g), cl, S)
            if name == "hips":  # k = 0: a server on every worker machine, server i on machine i
                c = cost_formulas.hips_placed(n, g, list(range(n)))
            else:
                c = cost_formulas.scheme_cost(name, n, width=w, group=g)
            gamma = 1 / (3 * 2e10) if name == "hips" else 0.0
            first = min(S, tensor_partition_bound(S, 262144, n))
            assert got["total"] == pytest.approx(c.seconds(S, 7e-6, 1 / 5e9, gamma, first),
                                                 rel=1e-12)
            assert got["nic_bytes"] == pytest.approx(c.nic * S)
    B = 1e9 / 8
    for n, k in ((2, 0), (4, 0), (4, 2), (4, 4)):
        cl = sim.Cluster(n, k, bandwidth=B, latency=20e-6)
        M = 64 << 20
        simulated = sim.simulate(sim.single_tensor(M), cl, sim.Scheme()).iteration_s
        formula = cost_formulas.ps(n, k).seconds(M, 20e-6, 1 / B,
                                                  1 / (cl.server_threads * cl.sum_rate))
        assert simulated == pytest.approx(formula, rel=0.1), (n, k)


def _program_schedule(programs):
    """One partition alone through the core's all-reduce programs (``coll_program`` of every
    machine): each link direction carries one message at a time, a send leaves once every
    receive before it in its machine's program is in, the earliest possible send first.
    (makespan in bytes' time, the longest chain of messages one after another)."""
    n = len(programs)
    done, sent = {}, set()
    tx_free, rx_free = [0.0] * n, [0.0] * n
    sends = sum(op[0] == "send" for ops in programs for op in ops)
    end = chain = 0
    while len(sent) < sends:
        ready = []
        for me, ops in enumerate(programs):
            at, depth = 0.0, 0
            for i, op in enumerate(ops):
                if op[0] != "send":
                    if (me, op[1], op[2]) not in done:
                        break
                    t, d = done[(me, op[1], op[2])]
                    at, depth = max(at, t), max(depth, d)
                elif (me, i) not in sent:
                    ready.append((max(at, tx_free[me], rx_free[op[1]]), me, i, depth))
        start, me, i, depth = min(ready)
        op = programs[me][i]
        tx_free[me] = rx_free[op[1]] = start + op[4]
        sent.add((me, i))
        done[(op[1], me, op[2])] = (start + op[4], depth + 1)
        end, chain = max(end, start + op[4]), max(chain, depth + 1)
    return end, chain


def test_tree_cost_is_the_cores_program():
    """The tree's coefficients are what the core's program (BuildCollProgram) sends: ``wire``
    the busiest machine's bytes per direction (every partition pipelines through it), the
    messages and ``wire + fill`` the longest chain and the time of one partition alone. The
    sequential up-and-down count (wire 2 at n = 4, w = 2) was 1.33x what the core sends."""
    T = core_testing()
    for n in range(2, 17):
        for w in [d for d in range(1, n + 1) if n % d == 0]:
            S = 16 * 64 * w  # chunks of whole 16-element blocks (ShardRange)
            programs = [T.coll_program("tree", n, w, me, S, 1)["ops"] for me in range(n)]
            tx, rx = [0] * n, [0] * n
            for me, ops in enumerate(programs):
                for op in ops:
                    if op[0] == "send":
                        tx[me] += op[4]
                        rx[op[1]] += op[4]
            c = cost_formulas.tree(n, w)
            assert max(tx) / S == pytest.approx(c.wire) == max(rx) / S, (n, w)
            assert c.nic == c.wire
            end, chain = _program_schedule(programs)
            assert chain == c.messages, (n, w)
            assert end / S == pytest.approx(c.wire + c.fill), (n, w)
    assert cost_formulas.tree(4, 2).wire == cost_formulas.ring(4).wire  # measured: alike


def test_hips_placed_is_byteps_placement():
    """HiPS's busiest link with byteps's servers where the job has them: on hosts of their own
    the closed form ``max(g + 1, G/T)``; a server on every worker machine (server i on machine
    i, as the emulated cluster ranks them) 4 S at n = 4, g = 2: machine 1 hosts first-level
    server 1, whose group is machines 2 and 3 (2 pushes in, the total back), and worker 1,
    whose push and pull go to server 0 on machine 0."""
    ap = pytest.approx
    for n in range(2, 13):
        for g in range(1, n + 1):
            G = math.ceil(n / g)
            for servers in (G + 1, G + 2, 2 * G + 3):
                c = cost_formulas.hips_placed(n, g, [None] * servers)
                assert c == cost_formulas.hips_servers(n, g, servers)
                assert c.wire == ap(max(g + 1, G / (servers - G))), (n, g, servers)
    assert coeffs(cost_formulas.hips_placed(4, 2, [0, 1, 2, 3])) == ap((4, 4, 1.5, 4, 3))
    # first-level servers on a machine of their own group: that machine's push stays local
    assert cost_formulas.hips_placed(4, 2, [0, 2, 1, 3]).wire == ap(2)
    # the paper's placement (a server on every machine, 1/g of the group's bytes each) is
    # about g times cheaper than any of byteps's
    assert cost_formulas.hips(4, 2).wire == ap(1.5)
    with pytest.raises(InvalidArgumentError, match="servers"):
        cost_formulas.hips_placed(4, 2, [0, 1])
    with pytest.raises(InvalidArgumentError, match="machine"):
        cost_formulas.hips_placed(4, 2, [0, 1, 4])


# ------------------------------------------------------------------------------- the choice --


def check_consistent(m: cost_model.CostModel, sizes):
    """choose() is a cheapest scheme at every size, and the intervals tile [0, inf)."""
    ivs = m.intervals
    assert ivs[0].lo == 0 and ivs[-1].hi is None
    for a, b in zip(ivs, ivs[1:]):
        assert a.hi == b.lo and a.scheme != b.scheme
    for s in sizes:
        costs = m.costs(s)
        best = min(costs.values())
        assert costs[m.choose(s)] <= best * (1 + 1e-9) + 1e-300, (s, costs, m.choose(s))
    for iv in ivs[1:]:  # at each boundary the choice changes, by the costs
        assert m.choose(iv.lo) == iv.scheme and m.choose(iv.lo - 1) != iv.scheme


def test_tiny_tensors_fewest_messages_huge_least_bytes():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(2, 64)
        m = cost_model.CostModel(10 ** rng.uniform(-7, -3), 10 ** rng.uniform(-12, -8),
                                 10 ** rng.uniform(-12, -8), n, rng.randint(0, n),
                                 rng.randint(1, n), rng.choice([0, 2, 3, 4]))
        costs = m.scheme_costs()
        order = list(cost_formulas.SCHEMES)
        fewest = min(order, key=lambda s: (costs[s].messages, order.index(s)))
        assert m.choose(0) == fewest
        per_byte = {s: c.wire * m.beta + c.summed * m.gamma for s, c in costs.items()}
        assert per_byte[m.choose(cost_model.MAX_BYTES - 1)] <= min(per_byte.values()) * (
            1 + 1e-12)
        check_consistent(m, [0, 1, 1000, 1 << 20, 1 << 30, 1 << 40]
                         + [rng.randrange(1 << 36) for _ in range(20)])


def test_hips_as_byteps_places_its_servers():
    # n = 4, g = 2: G = 2 first-level servers, each link carrying g + 1 = 3 S each way
    ap = pytest.approx
    # the first partition alone: 2 pushes in, 2 sums into the top, 2 totals back, 2 pulls out
    # (2g + 2G partitions' times), 3 of them its share of the busiest link
    assert coeffs(cost_formulas.hips_servers(4, 2, 4)) == ap((4, 3, 1 + 1 / 2, 3, 5))
    assert coeffs(cost_formulas.hips_servers(4, 2, 3)) == ap((4, 3, 2, 3, 5))  # one top server
    assert coeffs(cost_formulas.hips_servers(9, 3, 4)) == ap((4, 4, 2 + 2, 4, 8))
    with pytest.raises(InvalidArgumentError, match="servers"):
        cost_formulas.hips_servers(4, 2, 2)
    # the model uses it when it knows the job's servers, else the simulator's model
    a, b, g = 1e-5, 1e-9, 1e-11
    assert cost_model.CostModel(a, b, g, 4, 0, all_servers=4).scheme_costs()["hips"] == \
        cost_formulas.hips_servers(4, 2, 4)
    assert cost_model.CostModel(a, b, g, 4, 0).scheme_costs()["hips"] == cost_formulas.hips(4, 2)


def test_ps_pipeline_fill_is_one_partition():
    """With the job's partition bound the ps (and hips) costs add one partition's time: the
    core's bound of the tensor (61440 B below 32·n·60 KiB, the job's bound from 32·n·bound),
    or the whole tensor when it is smaller."""
    a, b, g = 109e-6, 6.16e-9, 4.6e-11  # measured on the emulated cluster, n = 4, k = 0
    m = cost_model.CostModel(a, b, g, 4, 0, partition_bound=262144, all_servers=4)
    assert [m.ps_fill_bytes(s) for s in (4096, 61440, 1 << 20, 4 << 20, 16 << 20, 64 << 20)] \
        == [4096, 61440, 61440, 61440, 122880, 262144]
    ps, tree = cost_formulas.ps(4, 0), cost_formulas.tree(4, 2)
    assert m.cost("ps", 1 << 20) == pytest.approx(ps.seconds(1 << 20, a, b, g)
                                                  + ps.wire * b * 61440)
    assert m.cost("tree", 1 << 20) == pytest.approx(tree.seconds(1 << 20, a, b, g)
                                                    + 0.5 * b * 61440)
    assert m.cost("ring", 1 << 20) == pytest.approx(cost_formulas.ring(4).seconds(1 << 20, a, b, g))
    # k = 0: ps, the ring and the tree (w = 2) move the same bytes; ps's 2 messages win small
    # tensors, then the tree's 4 against the ring's 6, until its fill (half a partition) and
    # its extra sums outweigh 2 α: 2α = 0.5·61440·β + 0.25·S·γ
    assert [iv.scheme for iv in m.intervals] == ["ps", "tree", "ring"]
    x = (2 * a - 0.5 * 61440 * b) / (0.25 * g)
    assert m.intervals[2].lo == math.floor(x) + 1
    assert m.choose(4096) == "ps" and m.choose(256 << 10) == "tree"
    assert m.choose(4 << 20) == "ring"
    check_consistent(m, [0, 1, 4095, 61439, 61440, 61441, 1 << 20, 3932159, 3932160,
                         16777215, 16777216, 1 << 40])
    # k = 4 CPU-only servers: ps moves S per worker against the ring's 1.5 S: ps everywhere
    m4 = cost_model.CostModel(136e-6, 8.3e-9, g, 4, 4, partition_bound=262144, all_servers=4)
    assert [iv.scheme for iv in m4.intervals] == ["ps"]
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randint(2, 16)
        m = cost_model.CostModel(10 ** rng.uniform(-7, -3), 10 ** rng.uniform(-12, -8),
                                 10 ** rng.uniform(-12, -8), n, rng.randint(0, n),
                                 rng.randint(1, n), rng.choice([0, 2, 3]),
                                 partition_bound=rng.choice([4096, 262144, 4096000]),
                                 local_size=rng.randint(1, 3), all_servers=rng.randint(0, 2 * n))
        cuts = [lo for lo, *_ in cost_model._fill_pieces(m)]
        check_consistent(m, [0, 1, 1 << 20, 1 << 40] + [c + d for c in cuts for d in (-1, 0, 1)
                                                          if c + d >= 0]
                         + [rng.randrange(1 << 30) for _ in range(10)])


def test_boundary_where_hips_overtakes_ps():
    """n = 4, one CPU-only server, summation slow against the wire: ps (2 messages) for small
    tensors, hips (4 messages, fewer bytes summed) from the crossing 2α / (b_ps - b_hips)."""
    a, b, g = 1e-5, 1e-11, 1e-9
    m = cost_model.CostModel(a, b, g, 4, 1, 1, 2)
    ps, hp = cost_formulas.ps(4, 1), cost_formulas.hips(4, 2)
    assert (ps.messages, hp.messages) == (2, 4)
    x = (hp.messages - ps.messages) * a / ((ps.wire - hp.wire) * b + (ps.summed - hp.summed) * g)
    assert [iv.scheme for iv in m.intervals] == ["ps", "hips"]
    assert m.intervals[1].lo == math.floor(x) + 1
    assert m.choose(math.floor(x)) == "ps" and m.choose(math.floor(x) + 1) == "hips"
    assert m.table([1 << 10, 1 << 20]) == {1 << 10: "ps", 1 << 20: "hips"}
    check_consistent(m, range(0, 1 << 20, 4093))


def test_candidate_schemes_and_tree_width_default():
    a, b, g = 1e-5, 1e-11, 1e-9
    full = cost_model.CostModel(a, b, g, 4, 1, 1, 2)
    no_hips = cost_model.CostModel(a, b, g, 4, 1, 1, 2, schemes=("ring", "ps", "tree"))
    assert no_hips.schemes == ("ps", "ring", "tree")  # the order of ties, whatever was given
    assert "hips" in {iv.scheme for iv in full.intervals}
    assert "hips" not in {iv.scheme for iv in no_hips.intervals}
    assert set(no_hips.costs(1)) == {"ps", "ring", "tree"}
    check_consistent(no_hips, range(0, 1 << 24, 65521))
    assert cost_model.CostModel(a, b, g, 4, schemes=("ring",)).choose(1) == "ring"
    for bad in ((), ("ps", "mesh")):
        with pytest.raises(InvalidArgumentError, match="schemes"):
            cost_model.CostModel(a, b, g, 4, schemes=bad)
    # width 0: the core's default, the largest divisor of n not above ceil(sqrt(n))
    widths = {n: cost_model.CostModel(a, b, g, n).tree_width for n in (1, 2, 7, 8, 9, 12, 16)}
    assert widths == {1: 1, 2: 2, 7: 1, 8: 2, 9: 3, 12: 4, 16: 4}


def test_ties_are_deterministic():
    # n = 2, k = 0: ps and ring cost the same at every size; the order of SCHEMES decides
    m = cost_model.CostModel(3e-5, 1e-10, 5e-11, 2, 0)
    assert m.costs(1 << 20)["ps"] == pytest.approx(m.costs(1 << 20)["ring"])
    assert [iv.scheme for iv in m.intervals] == ["ps"]
    for args in ((0.0, 0.0, 0.0, 8, 2), (1e-5, 1e-10, 1e-11, 1, 0)):  # all free / one machine
        assert cost_model.CostModel(*args).choose(123) == "ps"


def test_choose_argument_errors_and_dict():
    m = cost_model.CostModel(1e-5, 1e-10, 1e-11, 4, 1)
    with pytest.raises(InvalidTypeError):
        m.choose(1.5)
    with pytest.raises(InvalidTypeError):
        m.choose(True)
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        m.choose(-1)
    with pytest.raises(InvalidArgumentError, match="beta"):
        cost_model.CostModel(1e-5, -1.0, 1e-11, 4)
    with pytest.raises(InvalidArgumentError, match="workers"):
        cost_model.CostModel(1e-5, 1e-10, 1e-11, 0)
    d = json.loads(json.dumps(m.as_dict()))
    assert d["table"][str(1 << 20)] == m.choose(1 << 20)
    assert d["intervals"][0]["from_bytes"] == 0 and d["intervals"][-1]["to_bytes"] is None
    assert "choice: ps" in m.describe()


# ------------------------------------------------------------------------------ variables --


def job_env(**extra):
    return {"DMLC_NUM_WORKER": "4", "DMLC_NUM_SERVER": "2", **extra}


def test_variables_set_everything_without_measuring(caplog):
    env = job_env(BYTEPS_COST_ALPHA="2e-5", BYTEPS_COST_BETA="8e-11", BYTEPS_COST_GAMMA="3e-11")
    with caplog.at_level("INFO", logger="byteps.cost_model"):
        m = cost_model.measure(env)
    assert (m.alpha, m.beta, m.gamma) == (2e-5, 8e-11, 3e-11)
    assert m.sources == {"alpha": "BYTEPS_COST_ALPHA", "beta": "BYTEPS_COST_BETA",
                         "gamma": "BYTEPS_COST_GAMMA"}
    assert (m.workers, m.servers, m.measure_seconds) == (4, 2, 0.0)
    assert m.intervals == cost_model.CostModel(2e-5, 8e-11, 3e-11, 4, 2).intervals
    assert [r.getMessage() for r in caplog.records] == [m.describe()]  # logged once
    assert cost_model.measure(env, servers=0, tree_width=4, hips_group=2).tree_width == 4


def test_k_counts_only_the_address_books_cpu_only_servers(monkeypatch):
    # 4 worker machines and 4 servers: colocated on the workers' hosts (the address book says
    # 0 CPU-only), the summation service's wire cost is t_opt with k = 0, not k = 4
    values = {"DMLC_NUM_WORKER": "4", "DMLC_NUM_SERVER": "4"}
    if not _core.is_initialized():
        assert cost_model._servers(values, None, True) == (4, 4, "DMLC_NUM_SERVER")
    placement = [(4, 0)]
    monkeypatch.setattr(_core, "is_initialized", lambda: True)
    monkeypatch.setattr(_core, "is_distributed", lambda: True)
    monkeypatch.setattr(_core, "server_placement", lambda: placement[0])
    assert cost_model._servers(values, None, True) == (0, 4, "address book")
    assert cost_model._servers(values, 3, True) == (3, 4, "given")  # servers= overrides
    assert cost_model._servers(values, None, False) == (4, 4, "DMLC_NUM_SERVER")  # env: what-if
    placement[0] = (6, 2)  # 4 colocated + 2 CPU-only
    assert cost_model._servers(values, None, True) == (2, 6, "address book")
    placement[0] = (4, 0)
    for var, value in zip(VARS, ("2e-5", "8e-11", "3e-11")):
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("DMLC_NUM_WORKER", "4")
    monkeypatch.setenv("DMLC_NUM_SERVER", "4")
    monkeypatch.setattr(cost_model, "_cached", None)
    m = cost_model.measure()  # all three set: nothing measured, k from the address book
    assert (m.servers, m.servers_source) == (0, "address book")
    assert m.scheme_costs()["ps"] == cost_formulas.ps(4, 0)
    assert m.scheme_costs()["ps"].wire == pytest.approx(1.5)  # 2n(n-1)/n^2, not 1 (k = n)
    assert m.schemes == ("ps", "ring", "tree", "hips")  # hips: 4 servers >= ceil(4/2) + 1
    assert (m.partition_bound, m.local_size, m.all_servers) == (262144, 1, 4)
    assert m.intervals == cost_model.CostModel(2e-5, 8e-11, 3e-11, 4, 0, partition_bound=262144,
                                               all_servers=4).intervals
    assert "0 CPU-only server(s) (address book)" in m.describe()
    assert cost_model.measure(servers=4).servers == 4


@pytest.mark.parametrize("var", VARS)
@pytest.mark.parametrize("bad", ["fast", "-1", "nan", "", "1e400"])
def test_bad_variable_is_a_config_error_naming_it(var, bad):
    env = job_env(BYTEPS_COST_ALPHA="2e-5", BYTEPS_COST_BETA="8e-11", BYTEPS_COST_GAMMA="3e-11")
    env[var] = bad
    with pytest.raises(ConfigError, match=var):
        cost_model.measure(env)


def test_no_measurement_inside_a_measurement():
    env = job_env(BYTEPS_COST_ALPHA="2e-5", BYTEPS_COST_BETA="8e-11", BYTEPS_COST_GAMMA="3e-11")
    cost_model._state.measuring = True
    try:
        with pytest.raises(byteps.InternalError, match="while measuring"):
            cost_model.measure(env)
    finally:
        cost_model._state.measuring = False
    assert cost_model.measure(env).alpha == 2e-5


def test_measuring_needs_init_and_the_job():
    with pytest.raises(InvalidArgumentError, match="needs all of"):
        cost_model.measure(job_env(BYTEPS_COST_ALPHA="2e-5"))
    if not _core.is_initialized():
        with pytest.raises(NotInitializedError, match="init"):
            byteps.cost_model(refresh=True)


# ----------------------------------------------------------------------- a real 2-worker job --


@pytest.mark.parametrize("local_size", [1, 2])
def test_measured_on_a_two_worker_job_same_on_both_ranks(local_size):
    # loopback: the server runs on the workers' host, so the address book marks it colocated
    # and k (CPU-only servers) is 0 on every rank; with 2 local ranks the non-roots get the
    # address book's counts from their local root
    size = 2 * local_size
    rc, out, _ = run_job(["--workers", "2", "--servers", "1", "--local-size", str(local_size)],
                         "measure", script=WORKER, timeout=90)
    assert_ok(rc, out, size, min_cases=3)
    got = {}
    for r in range(size):
        lines = worker_lines(out, r)
        got[r] = {tag: json.loads(line.split(" ", 1)[1]) for line in lines
                  for tag in ("COSTMODEL", "COSTMODEL_BETA", "PLACEMENT")
                  if line.startswith(tag + " ")}
        assert got[r]["PLACEMENT"] == [1, 0], (r, got[r]["PLACEMENT"])
    for tag in ("COSTMODEL", "COSTMODEL_BETA"):
        a = dict(got[0][tag])
        ta = a.pop("measure_seconds")
        for r in range(1, size):
            b = dict(got[r][tag])
            tb = b.pop("measure_seconds")
            assert a == b, (tag, r)  # bit-identical parameters, choice and table on all ranks
            assert 0 < tb < 5, tb
        assert 0 < ta < 5, ta
        assert 0 < a["alpha"] < 0.05, a  # seconds per message
        assert 1e-13 <= a["beta"] < 1e-6, a  # s/B: above 1 MB/s, at most 10 TB/s
        assert 0 < a["gamma"] < 1e-7, a  # s/B: the kernel sums above 10 MB/s
        assert (a["workers"], a["servers"], a["servers_source"]) == (2, 0, "address book")
    first, second = got[0]["COSTMODEL"], got[0]["COSTMODEL_BETA"]
    assert first["sources"] == {"alpha": "measured", "beta": "measured", "gamma": "measured",
                                "latency": "measured"}
    # BYTEPS_SYNC=ps: no worker mesh, one server (HiPS needs 2): only ps's latency is timed
    assert list(first["latency"]) == ["ps"] and 0 < first["latency"]["ps"] < 0.05, first
    assert second["beta"] == 2.5e-10 and second["sources"]["beta"] == "BYTEPS_COST_BETA"
    assert second["sources"]["alpha"] == "measured"


def test_mesh_messages_have_their_own_alpha():
    # α measured through the summation service includes a server hop; a worker-to-worker
    # message of the ring or the tree costs alpha_mesh (measured with a tiny ring push_pull)
    a, b, g = 2e-4, 1e-9, 1e-11
    m = cost_model.CostModel(a, b, g, 4, 0, alpha_mesh=5e-5)
    assert m.cost("ring", 1000) == pytest.approx(
        cost_formulas.ring(4).seconds(1000, 5e-5, b, g))
    assert m.cost("ps", 1000) == pytest.approx(cost_formulas.ps(4, 0).seconds(1000, a, b, g))
    assert (m.message_alpha("tree"), m.message_alpha("hips")) == (5e-5, a)
    # the tree of width 2 (4 messages x 50 us) undercuts ps's 2 x 200 us even at 0 bytes
    assert m.choose(0) == "tree"
    check_consistent(m, range(0, 1 << 22, 40961))
    assert m.as_dict()["alpha_mesh"] == 5e-5 and "worker mesh 50 us" in m.describe()
    assert cost_model.CostModel(a, b, g, 4, 0).message_alpha("ring") == a  # None: alpha
    with pytest.raises(InvalidArgumentError, match="alpha_mesh"):
        cost_model.CostModel(a, b, g, 4, 0, alpha_mesh=-1.0)


def test_measured_latency_is_each_schemes_alpha_term():
    # a tiny push_pull timed per scheme replaces messages x alpha; schemes not timed keep it
    a, b, g = 2e-4, 1e-9, 1e-11
    m = cost_model.CostModel(a, b, g, 4, 0, alpha_mesh=5e-5,
                             latency={"ps": 3e-4, "tree": 4.4e-4})
    assert m.latency_seconds("ps") == 3e-4 and m.latency_seconds("tree") == 4.4e-4
    assert m.latency_seconds("ring") == pytest.approx(6 * 5e-5)  # 2(n-1) mesh messages
    assert m.message_alpha("ps") == pytest.approx(1.5e-4)  # over its 2 messages
    assert m.cost("ps", 1000) == pytest.approx(
        3e-4 + cost_formulas.ps(4, 0).seconds(1000, 0.0, b, g))
    # 0 bytes: the ring's 300 us undercut ps's 300 us? a tie goes to ps (the earlier scheme),
    # the tree's measured 440 us no longer wins on a 4 x 50 us count
    assert m.choose(0) == "ps"
    check_consistent(m, range(0, 1 << 22, 40961))
    d = m.as_dict()
    assert d["latency"] == {"ps": 3e-4, "tree": 4.4e-4} and d["all_servers"] == 0
    assert "tiny push_pull ps 300 us, tree 440 us" in m.describe()
    for bad in ({"gossip": 1e-4}, {"ps": -1e-4}, {"ps": float("nan")}, {"ps": True}):
        with pytest.raises(InvalidArgumentError, match="latency"):
            cost_model.CostModel(a, b, g, 4, 0, latency=bad)
