"""Authenticated connections: every TCP connection of a job starts with the job-secret
handshake of ``core/cpp/comm/auth.h`` (mutual HMAC-SHA256 over fresh nonces).

The handshake is spoken here from Python (``hmac``/``hashlib``) against the scheduler and the
server of a running job, whose addresses and secret the test reads from the job's processes
(``/proc/<pid>/environ``, ``/proc/<pid>/net/tcp``): the right secret is accepted; a wrong secret,
a replayed handshake and garbage are dropped and logged; the job itself finishes normally.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs import (
    INIT_PROBE,
    Group,
    LiveJob,
    assert_ok,
    clean_job_env,
    free_port,
    job_pids_alive,
    rss_and_fds,
    wrong_secret_worker,
)
from testing_hooks import core_testing

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

MAGIC = b"BPSA\x01"


def _mac(secret: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, label + a + b, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes from ``sock``: fewer only if the peer closed the connection."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def handshake_on(s: socket.socket, secret: bytes, nonce_c: bytes | None = None,
                 client_mac: bytes | None = None):
    """Run the connecting side on the connected socket ``s``. Returns (verdict byte or None if
    closed, whether the peer's MAC was right, nonce_c, nonce_s, the MAC this side sent)."""
    nonce_c = nonce_c or os.urandom(32)
    s.sendall(MAGIC + nonce_c)
    reply = recv_exact(s, 5 + 32 + 32)
    assert reply[:5] == MAGIC, reply[:5]
    nonce_s, server_mac = reply[5:37], reply[37:69]
    server_ok = hmac.compare_digest(server_mac, _mac(secret, b"byteps-accept", nonce_c, nonce_s))
    sent = client_mac or _mac(secret, b"byteps-connect", nonce_s, nonce_c)
    s.sendall(sent)
    verdict = recv_exact(s, 1)
    return (verdict[0] if verdict else None), server_ok, nonce_c, nonce_s, sent


def handshake(addr, secret: bytes, nonce_c: bytes | None = None, client_mac: bytes | None = None):
    """Connect to ``addr`` and run :func:`handshake_on`."""
    with socket.create_connection(addr, timeout=10) as s:
        return handshake_on(s, secret, nonce_c, client_mac)


def listening_ports(pid: int) -> list[int]:
    """TCP ports the process ``pid`` listens on (its sockets' inodes in /proc/<pid>/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # state LISTEN
                ports.append(int(parts[1].split(":")[1], 16))
    return ports


def test_strangers_are_dropped_and_the_job_goes_on(tmp_path: Path):
    go = tmp_path / "go"
    job = LiveJob(["--workers", "2", "--servers", "1"], "shm", str(go))
    try:
        job.wait_for(r"READY", count=2, timeout=120)
        sched_pid, server_pid = job.find("scheduler"), job.find("server")
        env = job.snapshot()[sched_pid]
        secret = env["BYTEPS_SECRET"].encode()
        assert len(secret) >= 32
        targets = {"scheduler": (env["DMLC_PS_ROOT_URI"], int(env["DMLC_PS_ROOT_PORT"])),
                   "server": ("127.0.0.1", listening_ports(server_pid)[0])}
        for role, addr in targets.items():
            # The right secret: mutual proof (the test checks the peer's MAC, the peer ours).
            verdict, server_ok, nonce_c, nonce_s, mac = handshake(addr, secret)
            assert server_ok and verdict == 1, role
            # A wrong secret: the peer's MAC does not verify here, and ours is rejected there.
            verdict, server_ok, *_ = handshake(addr, b"not the job secret")
            assert not server_ok and verdict in (0, None), role
            # A replayed handshake: the same hello and MAC again meet a fresh server nonce.
            verdict, _, _, nonce_s2, _ = handshake(addr, secret, nonce_c=nonce_c, client_mac=mac)
            assert nonce_s2 != nonce_s and verdict in (0, None), role
            # Garbage instead of a handshake, and a silent connection cut short.
            with socket.create_connection(addr, timeout=10) as s:
                s.sendall(os.urandom(4096))
                s.settimeout(10)
                try:
                    assert s.recv(100) == b""  # closed by the peer, nothing answered
                except ConnectionResetError:
                    pass
            socket.create_connection(addr, timeout=10).close()
        go.touch()
        rc = job.wait(120)
    finally:
        job.kill()
    assert_ok(rc, job.output, 2)
    assert "dropped the connection from 127.0.0.1" in job.output
    assert job_pids_alive(job.seen_pids, job.job_id) == []




def test_manual_launch_without_secret_refuses_to_start():
    env = clean_job_env({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0",
                         "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
                         "DMLC_PS_ROOT_PORT": "1"})
    r = subprocess.run([sys.executable, "-c", INIT_PROBE], env=env, capture_output=True,
                       text=True, timeout=60)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["raised"] == "ConfigError", (result, r.stderr)
    assert "BYTEPS_SECRET" in result["message"]
    assert "BYTEPS_ALLOW_UNAUTHENTICATED=1" in result["message"]


def test_wrong_secret_worker_gets_config_error():
    """A worker whose BYTEPS_SECRET differs from the scheduler's fails with ConfigError naming
    the secret, within the time it takes to connect, instead of joining the job."""
    result, elapsed, out = wrong_secret_worker()
    assert result["raised"] == "ConfigError", result
    assert "BYTEPS_SECRET" in result["message"], result
    assert elapsed < 15, elapsed
    assert "dropped the connection from 127.0.0.1" in out, out


# ------------------------------------------------------------------------------- fuzzing --

HEADER = struct.Struct("<IHBBIIQQQQ")  # magic, type, dtype, flags, sender, round, key, len, aux, written
FRAME_MAGIC = 0x31535042
_TYPES = list(range(1, 12)) + list(range(20, 30)) + [34]


def malformed_frame(rng: random.Random) -> bytes:
    """One frame a byteps server must refuse: random bytes, a bad magic / type / dtype, an
    absurd payload length, or a well-formed frame that is not allowed before HELLO (including
    HELLO for a worker id that is taken or does not exist)."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))
    magic = FRAME_MAGIC if kind != 1 else rng.getrandbits(32) | 1
    typ = rng.choice(_TYPES) if kind != 2 else rng.choice([0, 12, 19, 35, 0xFFFF])
    dtype = rng.randrange(8) if kind != 3 else rng.randrange(8, 256)
    plen = rng.randrange(0, 64) if kind != 4 else rng.choice([1 << 40, (1 << 64) - 1, 1 << 34])
    sender = rng.choice([0, 1, 2, 7, 0xFFFFFFFF])
    # a one-way push's announcement (no window was ever exported to this peer) now and then
    written = rng.choice([0, 0, 0, 4096, 1 << 20, (1 << 64) - 1])
    hdr = HEADER.pack(magic, typ, dtype, rng.getrandbits(8), sender, rng.getrandbits(32),
                       rng.getrandbits(64), plen, rng.getrandbits(64), written)
    return hdr + rng.randbytes(min(plen, 64))


def test_fuzz_decoders_100k_frames():
    """100 000 malformed frames through the frame and control-message decoders (the code every
    received byte goes through): each is accepted or refused with ValueError; nothing crashes."""
    T = core_testing()

    rng = random.Random(5)
    refused = 0
    for _ in range(100_000):
        frame = malformed_frame(rng)
        head = frame[:48].ljust(48, b"\0")
        try:
            T.decode_header(head)
        except ValueError:
            refused += 1
        body = frame[48:] or rng.randbytes(rng.randrange(0, 40))
        for decode in (T.decode_declare, T.decode_register, T.decode_key_config):
            try:
                decode(body)
            except ValueError:
                pass
    assert refused > 50_000  # most of them are refused at the header already


def _fuzz_live_server(frames: int, iterations: int):
    job = LiveJob(["--workers", "2", "--servers", "1"], "soak", iterations)
    try:
        job.wait_for(r"MEASURE start", count=2, timeout=300)
        server = job.find("server")
        secret = job.snapshot()[server]["BYTEPS_SECRET"].encode()
        addr = ("127.0.0.1", listening_ports(server)[0])
        rss0, fds0 = rss_and_fds(server)
        rng = random.Random(7)
        t0 = time.monotonic()
        dropped_early = 0
        for i in range(frames):
            # Spread over 250 loopback source addresses: 100 000 connections from one address
            # would reuse 4-tuples still in the server's TIME_WAIT (refused).
            source = (f"127.0.1.{1 + i % 250}", 0)
            with socket.create_connection(addr, timeout=10, source_address=source) as s:
                try:
                    if i % 10 == 0:  # no handshake at all: garbage straight away
                        s.sendall(malformed_frame(rng))
                    else:
                        verdict, ok, *_ = handshake_on(s, secret if i % 10 != 1 else b"wrong")
                        assert (verdict == 1) == (i % 10 != 1)  # only the job secret gets in
                        if verdict == 1:
                            s.sendall(malformed_frame(rng))
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(65536):  # until the server closes it (after a DATA_ERROR, maybe)
                        pass
                except (ConnectionResetError, BrokenPipeError, OSError) as exc:
                    if isinstance(exc, TimeoutError):
                        raise  # the server kept a bad connection open for 10 s
                    dropped_early += 1  # the server closed it before we were done writing
        fuzz_s = time.monotonic() - t0
        time.sleep(1.0)  # the last connections are reaped on the next accept or at exit
        rss1, fds1 = rss_and_fds(server)
        rc = job.wait(900)
    finally:
        job.kill()
    assert_ok(rc, job.output, 2, min_cases=iterations * 50)
    print(f"fuzzed the live server with {frames} malformed frames in {fuzz_s:.1f} s "
          f"({dropped_early} closed by the server before the frame was written); "
          f"server RSS {rss0} -> {rss1} KiB, descriptors {fds0} -> {fds1}")
    assert rss1 - rss0 <= 32 << 10, (rss0, rss1)
    assert fds1 <= fds0 + 8, (fds0, fds1)


def test_fuzz_live_server_keeps_serving():
    """3 000 malformed frames (each on its own connection: garbage, a wrong secret, or a bad
    frame after a good handshake) against the server of a job whose 2 workers keep push_pulling
    50 tensors with exact checks: the job finishes correctly, the server's memory and descriptors
    stay bounded. The 100 000-frame run is in the slow session."""
    _fuzz_live_server(3_000, 1_500)


@pytest.mark.slow
def test_fuzz_live_server_100k_frames():
    _fuzz_live_server(100_000, 12_000)


def test_allow_unauthenticated_runs_and_warns_once(tmp_path: Path):
    """A manual launch without BYTEPS_SECRET but with BYTEPS_ALLOW_UNAUTHENTICATED=1 runs (no
    handshake on either side) and every process says so once."""
    port = free_port()
    env = clean_job_env({"DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
                         "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                         "BYTEPS_ALLOW_UNAUTHENTICATED": "1", "BYTEPS_FORCE_DISTRIBUTED": "1",
                         "BYTEPS_TIMEOUT": "30"})
    worker = ("import numpy as np, byteps.basics as bps; bps.init(); a = np.arange(10.0); "
              "bps.wait(bps.push_pull_async('a', a.ctypes.data, a.ctypes.data, a.nbytes, "
              "'float64', a.shape, False)); print('SUM', a.sum()); bps.shutdown()")
    with Group() as group:  # stops (by PID) whatever still runs on the way out
        services = [group.start([sys.executable, "-m", "byteps.server"],
                                dict(env, DMLC_ROLE=role), label=role)
                    for role in ("scheduler", "server")]
        r = subprocess.run([sys.executable, "-c", worker], env=dict(env, DMLC_ROLE="worker",
                           DMLC_WORKER_ID="0"), capture_output=True, text=True, timeout=60)
        for p in services:
            p.wait(30)
        outs = [p.output for p in services]
    assert r.returncode == 0 and "SUM 45.0" in r.stdout, r.stdout + r.stderr
    for text in [r.stderr] + outs:
        assert text.count("BYTEPS_ALLOW_UNAUTHENTICATED=1: this process makes and accepts "
                          "unauthenticated connections") == 1, text
