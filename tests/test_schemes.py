"""The synchronization schemes (docs/schemes.md): ring and tree all-reduce over the worker mesh,
next to the summation service.

* The all-reduce programs (``byteps._core_testing.coll_program``), run here message by message
  for n = 2..8 worker machines and every tree width, sum exactly on every machine; the peers
  they name are symmetric; the default width.
* Configuration errors surface at ``init()`` (``BYTEPS_TREE_WIDTH`` that does not divide the
  machine count, ``BYTEPS_SYNC=auto`` without a cost model).
* Jobs under ``bpslaunch``: every scheme in one job with per-tensor declarations, a scheme
  that differs between machines (``MismatchError`` on every rank); a worker killed in a ring,
  a server killed in a HiPS job, fail the others with ``PeerLostError`` within the bound; credit
  with gradients ready in opposite orders. Every dtype and shape (``bps_worker.py
  correctness``) under ring and HiPS and the full matrix are marked ``slow`` (the conformance
  suite's ``test_conformance_schemes`` runs every dtype under torch in its default run).
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from jobs import (
    CONFIGS,
    PY,
    VANS,
    LiveJob,
    assert_ok,
    clean_job_env,
    kill_and_check,
    launch_job,
    run_job,
    skip_without_ucx,
    world_size,
)
from testing_hooks import core_testing

core = pytest.importorskip("byteps._core", reason="the byteps core is not built")
SCHEME_WORKER = str(__import__("pathlib").Path(__file__).resolve().parent / "workers" /
                    "scheme_worker.py")


# ------------------------------------------------------------------------------ programs --


def run_programs(scheme: str, n: int, width: int, count: int, elem: int = 4):
    """Every machine's program for one partition of `count` int32 elements, run message by
    message (sends delivered in order, a receive waits for its message); returns the outputs."""
    T = core_testing()
    rng = np.random.default_rng(n * 100 + width * 10 + count)
    ins = [rng.integers(-1000, 1000, count).astype(np.int32) for _ in range(n)]
    outs = [np.zeros(count, np.int32) for _ in range(n)]
    progs = [T.coll_program(scheme, n, width, me, count * elem, elem) for me in range(n)]
    pc, msgs = [0] * n, {}
    moved = True
    while moved:
        moved = False
        for me in range(n):
            ops = progs[me]["ops"]
            while pc[me] < len(ops):
                kind, peer, tag, off, length, _, from_input = ops[pc[me]]
                lo, hi = off // elem, (off + length) // elem
                if kind == "send":
                    assert (me, peer, tag) not in msgs, "two sends with one tag"
                    msgs[(me, peer, tag)] = (ins[me] if from_input else outs[me])[lo:hi].copy()
                else:
                    if (peer, me, tag) not in msgs:
                        break
                    data = msgs.pop((peer, me, tag))
                    assert len(data) == hi - lo, "a message of another length than expected"
                    if kind == "recv_sum":
                        outs[me][lo:hi] = (ins[me] if from_input else outs[me])[lo:hi] + data
                    else:
                        outs[me][lo:hi] = data
                pc[me] += 1
                moved = True
    assert pc == [len(p["ops"]) for p in progs], f"{scheme} n={n} w={width}: deadlock at {pc}"
    assert not msgs, f"messages never received: {sorted(msgs)}"
    return ins, outs, progs


@pytest.mark.parametrize("n", range(2, 9))
def test_programs_sum_exactly(n):
    """Ring and every tree width that divides n: every machine ends with the exact sum, for
    partitions of 0, 1, a few and many elements (chunks of unequal and zero length)."""
    widths = [w for w in range(1, n + 1) if n % w == 0]
    for count in (0, 1, 5, 333, 4096):
        for scheme, width in [("ring", n)] + [("tree", w) for w in widths]:
            ins, outs, progs = run_programs(scheme, n, width, count)
            want = np.sum(ins, axis=0, dtype=np.int32)
            for me in range(n):
                assert np.array_equal(outs[me], want), (scheme, n, width, count, me)


def test_program_message_counts():
    """The counts docs/schemes.md gives: the ring sends 2(n-1) messages of S/n per machine;
    a tree of width 1 sends one message up and one down per edge of the binary tree."""
    T = core_testing()
    n, S = 4, 4096 * 4
    for me in range(n):
        ops = T.coll_program("ring", n, n, me, S, 4)["ops"]
        sends = [op for op in ops if op[0] == "send"]
        assert len(sends) == 2 * (n - 1) and all(op[4] == S // n for op in sends)
    sends = sum(op[0] == "send" for me in range(n)
                for op in T.coll_program("tree", n, 1, me, S, 4)["ops"])
    assert sends == 2 * (n - 1)  # n - 1 edges, one message each way


def test_the_cost_model_shapes_schemes_as_the_core_does():
    """The cost formulas' tree width and HiPS group are the core's (ResolveTreeWidth,
    HipsGroupSize), not copies: BYTEPS_HIPS_GROUP=0 is ceil(sqrt(n)) for the costs too (they
    once took max(2, round(sqrt(n))), 2 where the core runs 3 at n = 5 and 6), a requested
    group is capped at n."""
    from byteps import _core
    from byteps.sync import cost_formulas
    assert [cost_formulas.hips_group(n) for n in range(1, 11)] == [1, 2, 2, 2, 3, 3, 3, 3, 3, 4]
    assert [cost_formulas.hips_group(n) for n in range(1, 40)] == \
        [_core.hips_group_size(n, 0) for n in range(1, 40)]
    assert cost_formulas.hips_group(4, 8) == _core.hips_group_size(4, 8) == 4
    assert [cost_formulas.default_tree_width(n) for n in range(1, 40)] == \
        [_core.tree_width(n) for n in range(1, 40)]


def test_tree_width_default_and_peers():
    """BYTEPS_TREE_WIDTH=0: the largest divisor of n not above ceil(sqrt(n)); a width that does
    not divide n is a ConfigError naming the divisors; every machine is every other's mesh peer."""
    from byteps import _core
    T = core_testing()
    assert [_core.tree_width(n, 0) for n in (1, 2, 3, 4, 6, 8, 9, 16)] == \
        [1, 2, 1, 2, 3, 2, 3, 4]
    assert _core.tree_width(8, 4) == 4
    from byteps.errors import ConfigError
    with pytest.raises(ConfigError, match="must divide DMLC_NUM_WORKER=6.*1, 2, 3, 6"):
        _core.tree_width(6, 4)
    for n in range(1, 10):
        for w in [d for d in range(1, n + 1) if n % d == 0]:
            peers = {me: set(T.collective_peers(n, w, me)) for me in range(n)}
            for me in range(n):  # the whole mesh: alltoall sends to every machine
                assert peers[me] == set(range(n)) - {me}, (n, w, me)


def _init_error(env: dict) -> str:
    """init() of a worker with `env` in a fresh process: the error's class and message."""
    code = ("import byteps.basics as b\n"
            "try:\n    b.init()\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)\nelse:\n    print('NO ERROR')\n")
    base = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "4", "DMLC_WORKER_ID": "0",
            "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9",
            "BYTEPS_ALLOW_UNAUTHENTICATED": "1", "BYTEPS_TIMEOUT": "2"}
    res = subprocess.run([PY, "-c", code], env=clean_job_env({**base, **env}),
                         capture_output=True, text=True, timeout=60)
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr


def test_config_errors_at_init():
    out = _init_error({"BYTEPS_SYNC": "tree", "BYTEPS_TREE_WIDTH": "3"})
    assert out.startswith("ConfigError") and "BYTEPS_TREE_WIDTH=3" in out, out
    out = _init_error({"BYTEPS_SYNC": "ring", "BYTEPS_AUTOTUNE": "1"})
    assert out.startswith("ConfigError") and "BYTEPS_AUTOTUNE" in out, out
    out = _init_error({"BYTEPS_SYNC": "gossip"})
    assert out.startswith("ConfigError") and "BYTEPS_SYNC" in out, out
    # Asynchronous training keeps the parameters on the summation service's servers.
    out = _init_error({"BYTEPS_SYNC": "ring", "BYTEPS_ENABLE_ASYNC": "1"})
    assert out.startswith("ConfigError") and "BYTEPS_ENABLE_ASYNC" in out, out
    out = _init_error({"BYTEPS_SYNC": "ring", "BYTEPS_ENABLE_ASYNC": "1",
                       "DMLC_NUM_SERVER": "0"})
    assert out.startswith("ConfigError") and "BYTEPS_ENABLE_ASYNC" in out, out


def test_auto_needs_the_cost_model():
    """BYTEPS_SYNC=auto asks byteps.cost_model.choose(nbytes) per tensor; a missing cost model
    or an answer that is not a scheme is a ConfigError, never a guess."""
    from byteps.errors import ConfigError, InvalidArgumentError
    from byteps.sync import schemes
    with pytest.raises(ConfigError, match="cost model"):
        schemes.auto_chooser("byteps.no_such_cost_model")
    assert schemes.auto_choice(lambda nbytes: "ring" if nbytes > 10 else "ps", "x", 11) == "ring"
    with pytest.raises(ConfigError, match="'gossip'"):
        schemes.auto_choice(lambda nbytes: "gossip", "x", 1)
    with pytest.raises(InvalidArgumentError):
        schemes.check_scheme("star", "declare")


# ----------------------------------------------------------------------------------- jobs --

#: (id, launcher config, BYTEPS_SYNC, width) of every dtype and shape (slow: the conformance
#: suite runs the same under torch in its default run, test_conformance_schemes)
DEFAULT_JOBS = [
    ("ring-3w1s", ["--workers", "3", "--servers", "1"], "ring", 0),
    ("hips-3w3s", ["--workers", "3", "--servers", "3"], "hips", 0),
]
#: the full matrix (slow)
SLOW_JOBS = [
    (f"{sync}{width or ''}-{name}", cfg, sync, width)
    for name, cfg in [("2w1s", CONFIGS["2w1s"]), ("3w2s", CONFIGS["3w2s"]),
                      ("2w1s_local2", CONFIGS["2w1s_local2"]),
                      ("4w1s", ["--workers", "4", "--servers", "1"])]
    for sync, width in [("ring", 0), ("tree", 1), ("tree", 2), ("hips", 0)]
    if not (width == 2 and cfg[1] == "3")
]


def _env(sync, width, timeout=60):
    """BYTEPS_SYNC, its width (a tree's; HiPS: machines per group), BYTEPS_TIMEOUT."""
    key = "BYTEPS_HIPS_GROUP" if sync == "hips" else "BYTEPS_TREE_WIDTH"
    return [f"BYTEPS_SYNC={sync}", f"{key}={width}", f"BYTEPS_TIMEOUT={timeout}"]


def _servers(cfg, sync):
    """`cfg` with the servers HiPS needs (one per group of 2, one on top) for hips."""
    if sync != "hips":
        return cfg
    cfg = list(cfg)
    n = int(cfg[cfg.index("--workers") + 1])
    cfg[cfg.index("--servers") + 1] = str((n + 1) // 2 + 1)
    return cfg


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,cfg,sync,width", DEFAULT_JOBS, ids=[j[0] for j in DEFAULT_JOBS])
def test_all_dtypes_and_shapes(name, cfg, sync, width):
    """Sum and average of every dtype and shape, in place and out of place, a 64 MiB tensor."""
    env = _env(sync, width) + (["BYTEPS_LOG_LEVEL=INFO"] if sync == "hips" else [])
    rc, out, _ = run_job(cfg, "correctness", env=env, timeout=280)
    assert_ok(rc, out, world_size(cfg), min_cases=178)
    if sync == "hips":  # the servers took their levels
        assert "HiPS: top-level server of 2 groups" in out, out[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name,cfg,sync,width", SLOW_JOBS, ids=[j[0] for j in SLOW_JOBS])
def test_matrix(name, cfg, sync, width):
    """The full matrix: correctness, many partitions over versioned rounds, workers of
    different speeds, gradients ready in different orders (credit)."""
    for mode, args, env in MATRIX_MODES:
        rc, out, _ = run_job(_servers(cfg, sync), mode, *args, env=_env(sync, width) + env,
                             timeout=280)
        assert_ok(rc, out, world_size(cfg))


#: (bps_worker mode, its arguments, extra environment) of the slow matrix
MATRIX_MODES = [
    ("correctness", [], []),
    ("partitions", [], ["BYTEPS_PARTITION_BYTES=65536"]),
    ("fastslow", ["100", "1"], ["BYTEPS_PARTITION_BYTES=4096"]),
    ("crossorder", [], ["BYTEPS_PARTITION_BYTES=65536", "BYTEPS_SCHEDULING_CREDIT=1"]),
    ("inflight", [], ["BYTEPS_PARTITION_BYTES=65536"]),
]


@pytest.mark.timeout(200)
def test_credit_with_gradients_ready_in_different_orders():
    """Credit of one partition, ranks produce the tensors in opposite orders: no deadlock (a
    partition's credit comes back when its first sends are written, never held while it waits
    for a peer). The job has no server: a ring needs none."""
    cfg = ["--workers", "3", "--servers", "0"]
    rc, out, _ = run_job(cfg, "crossorder", timeout=150,
                         env=_env("ring", 0, timeout=30) + ["BYTEPS_PARTITION_BYTES=65536",
                                                             "BYTEPS_SCHEDULING_CREDIT=1"])
    assert_ok(rc, out, world_size(cfg), min_cases=24)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("van", ["tcp", pytest.param("ucx-shm", marks=skip_without_ucx())])
def test_mixed_schemes_and_mismatch(van):
    """ps, ring, tree and hips tensors in one job of 3 machines x 2 processes (HiPS: groups of
    2 and 1, 2 first-level servers and 1 on top; tree of width 1) through declare(sync=...);
    a scheme differing between machines is a MismatchError on every rank; the job goes on. Over
    TCP, and over the UCX van (shared memory) where byteps has it."""
    cfg = ["--workers", "3", "--servers", "3", "--local-size", "2"]
    rc, out, _ = run_job(cfg, "mixed", env=_env("ring", 0) + ["BYTEPS_HIPS_GROUP=2"] + VANS[van],
                         timeout=110, script=SCHEME_WORKER)
    assert_ok(rc, out, world_size(cfg), min_cases=30)
    assert out.count("MISMATCH-CAUGHT") == world_size(cfg), out[-4000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync,workers,local,van", [
    ("ring", 4, 1, "tcp"), ("tree", 3, 2, "tcp"),
    pytest.param("ring", 4, 1, "ucx-shm", marks=skip_without_ucx())])
def test_worker_that_shuts_down_early_fails_the_others_fast(sync, workers, local, van):
    """Machine 0 leaves after one push_pull, the others start a second: it said PEER_GOODBYE, so
    their partitions waiting for its messages fail at once with PeerLostError ("... has shut
    down ...") on every process, not after BYTEPS_TIMEOUT; in the ring of 4, machine 2 sends
    nothing to machine 0 and receives nothing from it, and learns it from its neighbours'
    PEER_ABORT. Over the UCX van too (every handler on one thread: the abort runs on its own)."""
    cfg = ["--workers", str(workers), "--servers", "0", "--local-size", str(local)]
    rc, out, _ = run_job(cfg, "early", env=_env(sync, 1) + VANS[van], timeout=110,
                         script=SCHEME_WORKER)
    assert_ok(rc, out, world_size(cfg))
    assert out.count("EARLY-CAUGHT") == (workers - 1) * local, out[-4000:]


@pytest.mark.timeout(120)
def test_auto_declares_each_tensor_with_the_cost_models_choice():
    """BYTEPS_SYNC=auto with a stand-in cost model: each tensor is declared with choose(nbytes)
    at its first push_pull (ps, ring, tree by size) and sums exactly; a tensor declared with a
    compressor and large enough to be compressed gets ps (the only scheme that carries
    compression; the core refused the model's tree before), a smaller one the model's
    choice."""
    cfg = ["--workers", "2", "--servers", "1", "--local-size", "2"]
    rc, out, _ = run_job(cfg, "auto", env=_env("auto", 0), timeout=110, script=SCHEME_WORKER)
    assert_ok(rc, out, world_size(cfg), min_cases=10)


@pytest.mark.timeout(150)
def test_auto_with_the_cost_model_sums_and_agrees_on_every_rank():
    """BYTEPS_SYNC=auto with byteps.cost_model itself: measured through the job at the first
    push_pull (its own tensors on the summation service, not through auto), every tensor sums
    exactly under the scheme choose() gave, and every rank has the same choices and
    parameters."""
    cfg = ["--workers", "2", "--servers", "1"]
    rc, out, _ = run_job(cfg, "auto-model", env=_env("auto", 0), timeout=140,
                         script=SCHEME_WORKER)
    assert_ok(rc, out, world_size(cfg), min_cases=8)
    choices = {line.split("CHOICES ", 1)[1] for line in out.splitlines() if "CHOICES " in line}
    assert len(choices) == 1, choices
    assert "hips" not in next(iter(choices))  # 1 server: HiPS needs ceil(2/g) + 1


@pytest.mark.timeout(120)
def test_workers_with_different_schemes_fail_with_mismatch_on_every_rank():
    """Worker machine 0 runs BYTEPS_SYNC=ps, machine 1 ring (both set up the worker mesh): the
    first tensor whose scheme differs fails with MismatchError naming both schemes on every
    rank at once, not after BYTEPS_TIMEOUT."""
    cfg = ["--workers", "2", "--servers", "1"]
    cmd = ['sh', '-c', f'[ "$DMLC_WORKER_ID" = 0 ] && export BYTEPS_SYNC=ps; '
                       f'exec {PY} {SCHEME_WORKER} mixed']
    res = launch_job(cfg, cmd, env=_env("ring", 0), timeout=110)
    assert res.returncode != 0
    for w in (0, 1):
        assert re.search(rf"\[worker {w}\] byteps.errors.MismatchError: .* is synchronized "
                         r"differently across workers: worker \d uses (ring|ps), worker \d "
                         r"(ring|ps)", res.output), res.output[-4000:]
    assert res.seconds < 60, res.seconds


@pytest.mark.timeout(120)
def test_stall_warning_then_timeout_name_the_peer():
    """Worker 1 never starts a second round of 'lonely' (ring, no server): worker 0's stall
    warning and BytePSTimeoutError name the stage and the machine it waits for."""
    cfg = ["--workers", "2", "--servers", "0"]
    rc, out, _ = run_job(cfg, "timeout", 6, "declared", timeout=110,
                         env=_env("ring", 0, timeout=3) + ["BYTEPS_STALL_WARNING_SECONDS=1.5"])
    assert_ok(rc, out, world_size(cfg))
    lines = [ln for ln in out.splitlines() if ln.startswith("[worker 0]")]
    where = "REDUCE_SCATTER (waiting for worker machine 1 (rank 1))"
    assert any("WARNING" in ln and "'lonely'" in ln and where in ln for ln in lines), out[-4000:]
    assert any(ln.startswith("[worker 0] CAUGHT-TIMEOUT") and where in ln for ln in lines), \
        out[-4000:]


@pytest.mark.timeout(200)
def test_timeline_has_the_all_reduce_stages(tmp_path):
    """BYTEPS_TRACE_ON with a ring of 2 machines x 2 processes: every partition of the window has
    the all-reduce plan's stages (REDUCE_SCATTER, ALL_GATHER) on the local roots, the plain
    local plan on the others (tests/test_timeline.py's checks)."""
    from test_timeline import PLAN_OTHER, TRACE_WORKER, check_trace
    trace = tmp_path / "trace"
    cfg = ["--workers", "2", "--servers", "0", "--local-size", "2"]
    rc, out, _ = run_job(cfg, "steps", "4", script=TRACE_WORKER,
                         env=_env("ring", 0) + ["BYTEPS_TRACE_ON=1", "BYTEPS_TRACE_START_STEP=1",
                                                "BYTEPS_TRACE_END_STEP=3",
                                                f"BYTEPS_TRACE_DIR={trace}"])
    assert_ok(rc, out, 4)
    root = ["COPY_IN", "LOCAL_REDUCE", "REDUCE_SCATTER", "ALL_GATHER", "COPY_OUT"]
    for w in range(2):
        for lr in range(2):
            check_trace(trace / f"worker{w}" / str(lr) / "comm.json",
                        root if lr == 0 else PLAN_OTHER, {1, 2}, w * 2 + lr)


@pytest.mark.timeout(200)
def test_kill_worker_in_ring_fails_the_others():
    """kill -9 of worker 1 of a 3-machine ring: workers 0 and 2 (its neighbours, and through
    the scheduler everyone) get PeerLostError naming the operation within 30 s; nothing is
    left. No server: the job is the workers, their mesh and the scheduler."""
    cfg = ["--workers", "3", "--servers", "0"]
    with LiveJob(cfg, "loop", env=_env("ring", 0, timeout=100), grace=40) as job:
        job.wait_for(r"^\[worker \d\] READY", count=3)
        kill_and_check(job, job.find("worker", 1), survivors=[0, 2])


@pytest.mark.timeout(200)
def test_kill_server_in_hips_fails_every_worker():
    """kill -9 of a server of a HiPS job (first or top level): every worker gets PeerLostError
    naming the operation within 30 s; nothing is left."""
    cfg = ["--workers", "3", "--servers", "3"]
    with LiveJob(cfg, "loop", env=_env("hips", 2, timeout=100), grace=40) as job:
        job.wait_for(r"^\[worker \d\] READY", count=3)
        kill_and_check(job, job.find("server"), survivors=[0, 1, 2])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
