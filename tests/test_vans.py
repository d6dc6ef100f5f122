"""The distributed matrix per van (``core/cpp/comm/van.h``): the jobs of test_distributed.py and
test_security.py that exercise the transport, again with the UCX van over UCX's TCP transport
(``ucx-tcp``) and over shared memory (``ucx-shm``), as ``jobs.VANS`` selects them for every
process of a job (``DMLC_ENABLE_RDMA=ucx``, ``UCX_TLS``). The TCP van runs the same scenarios
in those files already, so only the UCX vans are parametrized here; the elastic restart
(test_elastic.py) and the conformance suite (one configuration) take the van as a parameter
themselves, and test_van.py checks the UCX van's bootstrap on its own (tokens, lifeline).

Every dtype with sum and average (2 worker machines, and 2 x 2 processes), partitioned
tensors, a kill -9 of the server and of a worker (every survivor gets PeerLostError naming the
lost peer well within the heartbeat timeout: over shared memory the link's TCP lifeline reports
it; the job then ends within seconds), a worker with the wrong job secret (ConfigError before
any UCX link exists). After every job nothing of it is left: no process, no
``/dev/shm/byteps_<job>_*`` segment, no System V segment its processes created (UCX's
shared-memory transports); a job that ended normally cleaned up its shared memory itself.

Besides: ``BYTEPS_ENABLE_IPC=1`` (the TCP van, colocated peers over UCX shared memory) gives
correct results and really reaches the colocated server and scheduler over UCX (the UCX van's
INFO line per connection), and ``DMLC_ENABLE_RDMA=1`` on a host without an RDMA transport fails
every process at start with a ConfigError naming DMLC_ENABLE_RDMA and UCX.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from jobs import (
    CONFIGS,
    INIT_PROBE,
    PY,
    UCX_VANS,
    VANS,
    Group,
    LiveJob,
    assert_ok,
    clean_job_env,
    env_dict,
    free_port,
    kill_and_check,
    rank_lines,
    skip_without_ucx,
    van_params,
    world_size,
    wrong_secret_worker,
)
from testing_hooks import skip_without_core_testing

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux /proc and /dev/shm"
)

UCX = van_params(UCX_VANS)
DEVICE_WORKER = str(Path(__file__).resolve().parent / "workers" / "device_worker.py")
needs_ucx = skip_without_ucx()
#: BYTEPS_HEARTBEAT_TIMEOUT's default: a lost peer must surface within it (it takes ~0.5 s)
HEARTBEAT_TIMEOUT_S = 15.0


def run_clean(config, van, mode, *mode_args, env=(), timeout=240):
    """Run ``bps_worker.py MODE ARGS`` as a job with ``van`` (plus ``env``); assert that
    nothing of it is left afterwards. Returns (launcher exit status, output)."""
    with LiveJob(CONFIGS[config], mode, *mode_args, env=VANS[van] + list(env)) as job:
        rc = job.watch(timeout)
        job.assert_nothing_left()
        return rc, job.output


# ---------------------------------------------------------------------------- correctness --


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", ["2w1s", "2w1s_local2"])
@pytest.mark.parametrize("van", UCX)
def test_every_dtype_sum_and_average(van, config):
    """Every dtype and shape, sum and average, in and out of place, a second round per name,
    64 MiB and odd-length tensors over 8 MiB (rendezvous transfers straight into place)."""
    rc, out = run_clean(config, van, "correctness")
    assert_ok(rc, out, world_size(CONFIGS[config]), min_cases=178)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("van", UCX)
def test_many_partitions_versioned_rounds(van):
    """BYTEPS_PARTITION_BYTES=65536: ~80 partitions per tensor, 4 rounds of changing values."""
    rc, out = run_clean("2w1s", van, "partitions", 4, env=["BYTEPS_PARTITION_BYTES=65536"])
    assert_ok(rc, out, 2, min_cases=9)


@pytest.mark.timeout(300)
@needs_ucx
@pytest.mark.parametrize("config", ["2w1s", "2w1s_local2"])
def test_one_way_pushes_over_shared_memory(config):
    """BYTEPS_UCX_ONE_WAY=1 over shared memory: from a key's second round on, its pushes above
    UCX's eager limit are written one-way into the server's slots (the server's shutdown line
    counts them, the local roots' their writes); where a machine has several processes, the
    server writes the sums one-way into its local root's aggregates (each counted by both),
    while a lone process takes them as frames into its own output; 6 rounds of changing values
    of 24 MB tensors in 256 KiB partitions (float32, int32, in and out of place; float64
    averaged) stay exact; with the default (auto) shared memory keeps frames, and nobody counts
    any."""
    counts = {}
    for one_way in ("1", "auto"):
        rc, out = run_clean(config, "ucx-shm", "partitions", 6, 24,
                            env=[f"BYTEPS_UCX_ONE_WAY={one_way}", "BYTEPS_LOG_LEVEL=INFO"])
        assert_ok(rc, out, world_size(CONFIGS[config]), min_cases=13)
        got = re.findall(r"\[(server 0|worker \d)\].* (\d+) payloads written one-way into a "
                         r"peer's window, (\d+) received so", out)
        counts[one_way] = {who: (int(w), int(r)) for who, w, r in got}
    on, auto = counts["1"], counts["auto"]
    assert on["server 0"][1] > 0, on
    roots = ["worker 0", "worker 1"] if config == "2w1s" else ["worker 0", "worker 2"]
    assert sum(on[r][0] for r in roots) == on["server 0"][1], on
    if config == "2w1s":
        assert on["server 0"][0] == 0 and all(on[r][1] == 0 for r in roots), on
    else:  # every round (the window goes before the first push): 6 x 2 roots x ~200 partitions
        assert on["server 0"][0] > 2000, on
        assert sum(on[r][1] for r in roots) == on["server 0"][0], on
    assert auto["server 0"][1] == 0 and all(w == 0 for w, _ in auto.values()), auto


@pytest.mark.timeout(300)
@needs_ucx
@skip_without_core_testing()  # the worker sets the fake device's delays
def test_one_way_sums_into_a_device_tensor_s_pinned_buffer():
    """A lone process's device tensor (the fake device) takes its sums in its pinned buffer, the
    same place every round: with BYTEPS_UCX_ONE_WAY=1 over shared memory the server writes them
    there one-way (as many as the two workers count received), and 3 rounds of 24 and 48 MB
    tensors (float32, float64 summed and averaged: divided after the write, in COPY_OUT; int32),
    in and out of place, are exact."""
    env = VANS["ucx-shm"] + ["BYTEPS_UCX_ONE_WAY=1", "BYTEPS_LOG_LEVEL=INFO"]
    with LiveJob(CONFIGS["2w1s"], "large", "3", env=env, script=DEVICE_WORKER) as job:
        rc = job.watch(240)
        job.assert_nothing_left()
        out = job.output
    assert_ok(rc, out, 2, min_cases=30)
    got = {who: (int(w), int(r)) for who, w, r in re.findall(
        r"\[(server 0|worker \d)\].* (\d+) payloads written one-way into a peer's window, "
        r"(\d+) received so", out)}
    assert got["server 0"][0] > 5000, got  # every round of every partition, both workers
    assert got["worker 0"][1] + got["worker 1"][1] == got["server 0"][0], got


# --------------------------------------------------------------------------------- faults --


#: seconds the job may take to end after a kill -9 (it takes ~1 s; a link left waiting for a dead
#: peer held each survivor's exit for two 5 s connection Join timeouts)
EXIT_AFTER_KILL_S = 9


def _kill(van, role, env=(), loop_args=(), config="2w1s"):
    """A job of ``config`` (2 machines) in ``loop`` mode (``loop_args``: its tensor's elements);
    kill -9 of ``role`` ("server", or "worker": the second machine's local root). Every
    survivor (every rank of the first machine, and the second machine's too when the server
    dies) reports PeerLostError within the heartbeat timeout and the job ends within
    :data:`EXIT_AFTER_KILL_S`, leaving nothing behind. Returns {surviving rank: (time,
    PeerLostError message)}, the output."""
    size = world_size(CONFIGS[config])
    survivors = list(range(size if role == "server" else size // 2))
    with LiveJob(CONFIGS[config], "loop", *loop_args,
                 env=VANS[van] + ["BYTEPS_TIMEOUT=100", *env], grace=40) as job:
        job.wait_for(r"^\[worker \d\] READY", count=size)
        victim = job.find("server") if role == "server" else job.find("worker", size // 2)
        caught, _, _ = kill_and_check(job, victim, survivors, bound=HEARTBEAT_TIMEOUT_S,
                                      grace_exit=EXIT_AFTER_KILL_S)
        job.assert_nothing_left(launcher_cleanup_ok=True)
        return caught, job.output


@pytest.mark.timeout(200)
@pytest.mark.parametrize("van", UCX)
def test_kill_server_fails_every_worker(van):
    """kill -9 of the server: both workers get PeerLostError naming the server, within the
    heartbeat timeout (BYTEPS_TIMEOUT is 100 s)."""
    caught, _ = _kill(van, "server")
    for r, (_, msg) in caught.items():
        assert "server" in msg.lower(), f"worker {r}'s PeerLostError does not name the server: " \
                                        f"{msg}"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("van", UCX)
def test_kill_worker_fails_the_other_worker(van):
    """kill -9 of worker 1: worker 0 gets PeerLostError naming worker 1, within the heartbeat
    timeout."""
    caught, out = _kill(van, "worker")
    msg = caught[0][1]
    assert re.search(r"worker\D{0,20}1", msg.lower()), (
        f"PeerLostError does not name the failed worker 1: {msg}\n--- output ---\n{out[-6000:]}")


@pytest.mark.timeout(200)
@needs_ucx
@pytest.mark.parametrize("config", ["2w1s", "2w1s_local2"])
@pytest.mark.parametrize("role", ["server", "worker"])
def test_kill_during_one_way_pushes(role, config):
    """Over shared memory with BYTEPS_UCX_ONE_WAY=1 and a 24 MB tensor (its 256 KiB pushes are
    written into the server's slab; with 2 processes per machine the sums into the local roots'
    aggregates too): kill -9 of the server (the slab's owner) or of the second machine's local
    root (the owner of a window the server writes into) fails every survivor with
    PeerLostError within the heartbeat timeout, and nothing of the job is left, System V
    segments included."""
    caught, out = _kill("ucx-shm", role, env=["BYTEPS_UCX_ONE_WAY=1"], loop_args=["6000000"],
                        config=config)
    for r, (_, msg) in caught.items():
        assert ("server" if role == "server" else "worker") in msg.lower(), (r, msg, out[-4000:])


# ------------------------------------------------------------------------- authentication --


@pytest.mark.timeout(120)
@pytest.mark.parametrize("van", UCX)
def test_wrong_secret_worker_gets_config_error(van):
    """The UCX van authenticates over TCP before any UCX link exists: a worker with the wrong
    BYTEPS_SECRET gets ConfigError naming the secret, and the scheduler logs the drop."""
    result, elapsed, out = wrong_secret_worker(env_dict(VANS[van]))
    assert result["raised"] == "ConfigError", result
    assert "BYTEPS_SECRET" in result["message"], result
    assert elapsed < 15, elapsed
    assert "dropped the connection from 127.0.0.1" in out, out


# ------------------------------------------------------------------------- van selection --


@pytest.mark.timeout(300)
@needs_ucx
def test_ipc_reaches_colocated_peers_over_ucx():
    """BYTEPS_ENABLE_IPC=1 with the TCP van, 2 machines x 2 processes on this host: correct
    sums and averages, and each machine's local root (ranks 0 and 2: the others reach the
    servers through it) connects to the scheduler and the server over UCX (the UCX van's INFO
    line per connection), over no TCP connection."""
    rc, out = run_clean("2w1s_local2", "tcp", "correctness", "--no-big",
                        env=["BYTEPS_ENABLE_IPC=1", "BYTEPS_LOG_LEVEL=INFO"])
    assert_ok(rc, out, 4, min_cases=170)
    lines = rank_lines(out, 4)
    for rank in (0, 2):
        links = [ln for ln in lines[rank] if "UCX van: connected to" in ln]
        for peer in ("scheduler", "server 0"):
            assert any(f"connected to {peer} " in ln and "over UCX" in ln for ln in links), (
                f"worker {rank} did not connect to the {peer} over UCX: {links}")
        assert not [ln for ln in links if "over TCP" in ln], (rank, links)


def _rdma_transports():
    """The RDMA transports UCX finds on this host (``rc_*``, ``dc_*``, ``ud_*``, ``ib*``)."""
    from byteps import _core

    info = _core.doctor.ucx_info() or {}
    return [r for r in info.get("resources", [])
            if r.split("/")[0].startswith(("rc_", "dc_", "ud_", "ib"))]


@pytest.mark.timeout(120)
@needs_ucx
def test_rdma_required_without_rdma_fails_every_process():
    """DMLC_ENABLE_RDMA=1 on a host whose UCX has no RDMA transport: the scheduler, the server
    and a worker, started by hand at once (no launcher stopping the others after the first
    failure), each fail at start (the worker with ConfigError) naming DMLC_ENABLE_RDMA, UCX
    and the transports found, within seconds; nothing hangs."""
    if _rdma_transports():
        pytest.skip(f"this host has RDMA transports: {_rdma_transports()}")
    port = free_port()
    env = clean_job_env({"DMLC_ENABLE_RDMA": "1", "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
                         "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                         "BYTEPS_SECRET": "c" * 64, "BYTEPS_TIMEOUT": "20",
                         "BYTEPS_FORCE_DISTRIBUTED": "1"})
    argv = {"scheduler": [PY, "-m", "byteps.server"], "server": [PY, "-m", "byteps.server"],
            "worker": [PY, "-c", INIT_PROBE]}
    t0 = time.monotonic()
    with Group() as group:  # stops (by PID) whatever still runs on the way out
        procs = {role: group.start(cmd, dict(env, DMLC_ROLE=role, DMLC_WORKER_ID="0"),
                                   label=role)
                 for role, cmd in argv.items()}
        for p in procs.values():
            p.wait(60)
    outputs = {role: p.output for role, p in procs.items()}
    elapsed = time.monotonic() - t0
    for role, p in procs.items():
        out = outputs[role]
        assert p.returncode != 0 or '"raised": "ConfigError"' in out, (role, p.returncode, out)
        assert "DMLC_ENABLE_RDMA" in out and "UCX" in out and "it has:" in out, (role, out)
    assert '"raised": "ConfigError"' in outputs["worker"], outputs["worker"]
    assert elapsed < 30, f"{elapsed:.1f} s"
