"""byteps.launch.torchrun without torch, the core or root: the children a torchrun-style
``init()`` starts (stand-in commands on 127.0.0.1 instead of ``python -m byteps.server``), their
failure reports, and activate()/deactivate() on an environment dict."""

from __future__ import annotations

import os
import sys
import time

import pytest

from byteps.errors import PeerLostError
from byteps.launch import torchrun as tl
from byteps.launch.torchrun_env import TorchrunEnvError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and /proc are Linux's")

# Listens on 127.0.0.1 (a free port) until killed, like a scheduler.
LISTENER = [sys.executable, "-c",
            "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print('listening', flush=True); time.sleep(120)"]
# Fails at once, like a scheduler whose port is taken.
FAILING = [sys.executable, "-c",
           "import sys; print('cannot bind 127.0.0.1:1: Address already in use', "
           "file=sys.stderr); sys.exit(1)"]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def child(label: str, argv: list[str]) -> tl._Child:
    return tl._Child(label, argv, {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1",
                                   "DMLC_PS_ROOT_PORT": "1"})


def test_scheduler_that_fails_to_listen_fails_start_at_once(capfd):
    services = tl.Services([child("scheduler", FAILING), child("server of node 0", LISTENER)],
                           rank=0)
    t0 = time.monotonic()
    with pytest.raises(PeerLostError, match=r"rank 0: the byteps scheduler \(pid \d+\) this "
                       r"process started exited with code 1 before it listened on "
                       r"127.0.0.1:1 .*Address already in use") as info:
        services.start()
    assert time.monotonic() - t0 < 8
    assert all(not alive(pid) for pid in services.pids())  # the server was stopped too
    assert "while the job was running" not in capfd.readouterr().err  # reported once, raised
    assert isinstance(info.value, ConnectionError)


def test_listening_scheduler_starts_and_stop_ends_everything(capfd):
    services = tl.Services([child("scheduler", LISTENER), child("server of node 0", LISTENER)],
                           rank=0)
    services.start()
    pids = services.pids()
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert tl._listens(pids[0]) is True
    t0 = time.monotonic()
    services.stop(0.2)  # they do not end by themselves: SIGTERM after 0.2 s
    assert time.monotonic() - t0 < 4
    assert not any(alive(p) for p in pids)
    err = capfd.readouterr().err
    assert "[byteps scheduler] listening" in err and "[byteps server of node 0] listening" in err
    assert "while the job was running" not in err  # stopped, not failed


def test_service_dying_mid_job_is_reported_once(capfd):
    dying = [sys.executable, "-c", "import sys, time; time.sleep(0.5); "
             "print('lost the scheduler', file=sys.stderr); sys.exit(1)"]
    services = tl.Services([child("server of node 1", dying)], rank=2)
    services.start()
    time.sleep(1.5)
    err = capfd.readouterr().err
    assert err.count("byteps: rank 2: the byteps server of node 1") == 1, err
    assert "exited with code 1 while the job was running; its last output: lost the scheduler" \
        in err
    services.stop(0)


def torchrun_env(rank: int, **extra) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999", "RANK": str(rank), "WORLD_SIZE": "4",
           "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank // 2),
           "TORCHELASTIC_RUN_ID": "job7", "DMLC_INTERFACE": "lo"}
    env.update(extra)
    return env


def test_activate_sets_the_worker_env_and_deactivate_restores_it():
    env = torchrun_env(0, BYTEPS_SECRET="s3cret", BYTEPS_JOB_ID="old", DMLC_NODE_HOST="")
    before = dict(env)
    assert tl.activate(env, timeout=5, server_argv=LISTENER) is True
    try:
        assert tl.active() and len(tl.service_pids()) == 2  # scheduler + this node's server
        assert tl.activate(env) is False  # already active
        assert env["DMLC_ROLE"] == "worker" and env["DMLC_PS_ROOT_PORT"] == "30000"
        assert env["BYTEPS_SECRET"] == "s3cret" and env["BYTEPS_JOB_ID"] == "old"
        assert env["DMLC_INTERFACE"] == "lo" and env["BYTEPS_LOCAL_SIZE"] == "2"
        pids = tl.service_pids()
    finally:
        tl.deactivate(env, wait_s=0.2)
    assert not tl.active() and tl.service_pids() == []
    assert env == before
    assert not any(alive(p) for p in pids)


def test_activate_without_a_shareable_secret_changes_nothing():
    env = torchrun_env(1)
    before = dict(env)
    with pytest.raises(TorchrunEnvError, match="BYTEPS_SECRET is not set"):
        tl.activate(env, timeout=5, server_argv=LISTENER)
    assert env == before and not tl.active()


def test_activate_ignores_dmlc_descriptions_and_plain_environments():
    assert tl.activate({"DMLC_ROLE": "worker", "RANK": "0", "WORLD_SIZE": "2"}) is False
    assert tl.activate({"PATH": "/bin"}) is False
    assert not tl.active()


def test_loopback_master_addr_is_warned_about():
    assert "resolves to 127.0.0.1" in tl.loopback_warning("127.0.0.1")
    assert "cannot reach it" in tl.loopback_warning("localhost")
    assert tl.loopback_warning("10.77.0.11") is None
    assert tl.loopback_warning("no-such-host.invalid") is None
