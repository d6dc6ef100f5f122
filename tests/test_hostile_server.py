"""A server that knows the job secret and lies to a worker: the worker fails with a typed error
within seconds and leaves nothing running, it never trusts what the server claims.

The server here is this test (a thread speaking the protocol over TCP: docs/architecture.md
§6); the scheduler and the worker are real byteps processes.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
import threading
import time

import pytest
from jobs import PY, Group
from test_security import MAGIC, _mac, handshake_on, recv_exact
from test_strangers import HEADER, _frame, _read_frame, bare_job_env, wait_listening

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")

REGISTER, ADDRESS_BOOK = 1, 2
HELLO, PUSH, PULL_RESPONSE, PUSH_ACK = 20, 21, 23, 28

WORKER = """
import numpy as np
import byteps, byteps.basics as b
from byteps.errors import BytePSError
b.init()
x = np.ones(1 << 18, np.float32)
try:
    byteps.push_pull(x, name="x")
    print("RESULT ok", flush=True)
except BytePSError as exc:
    print("RESULT", type(exc).__name__, exc, flush=True)
"""


def _accept_handshake(conn: socket.socket, secret: bytes) -> None:
    """The listening side of the job-secret handshake (comm/auth.cc)."""
    hello = recv_exact(conn, 5 + 32)
    assert hello[:5] == MAGIC, hello[:5]
    nonce_c, nonce_s = hello[5:], os.urandom(32)
    conn.sendall(MAGIC + nonce_s + _mac(secret, b"byteps-accept", nonce_c, nonce_s))
    assert recv_exact(conn, 32) == _mac(secret, b"byteps-connect", nonce_s, nonce_c)
    conn.sendall(b"\x01")


class LyingServer(threading.Thread):
    """Registers as the job's only server, accepts the worker, acknowledges its first push and
    answers it with a PULL_RESPONSE announcing bytes written one-way into a window the worker
    never offered (a TCP connection has none). Records what the worker did next."""

    def __init__(self, scheduler, secret: bytes):
        super().__init__(daemon=True)
        self.scheduler, self.secret = scheduler, secret
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.events, self.error = [], None

    def run(self):
        try:
            self._serve()
        except Exception as exc:  # reported by the test
            self.error = exc

    def _serve(self):
        ctl = socket.create_connection(self.scheduler, timeout=30)
        verdict, ok, *_ = handshake_on(ctl, self.secret)
        assert verdict == 1 and ok
        host, port = b"127.0.0.1", self.listener.getsockname()[1]
        reg = (struct.pack("<Bi", 1, -1) + struct.pack("<I", len(host)) + host +
               struct.pack("<IIIIQI", port, 1, 1, 1, 0, os.getpid()) + struct.pack("<Bi", 0, -1))
        ctl.sendall(_frame(REGISTER, reg))
        while _read_frame(ctl)[0][1] != ADDRESS_BOOK:
            pass
        self.listener.settimeout(30)
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        _accept_handshake(conn, self.secret)
        while True:
            h, _ = _read_frame(conn)
            if h[1] == HELLO:
                self.events.append("hello")
            elif h[1] == PUSH:
                key, rnd, dtype = h[6], h[5], h[2]
                self.events.append(f"push {h[7]} bytes")
                conn.sendall(_frame(PUSH_ACK, key=key, aux=rnd))
                conn.sendall(HEADER.pack(0x31535042, PULL_RESPONSE, dtype, 0, 0, rnd, key, 0, 0,
                                         h[7]))
                break
        conn.settimeout(20)
        try:
            while conn.recv(65536):
                pass
            self.events.append("closed by the worker")
        except OSError as exc:
            self.events.append(f"closed by the worker ({type(exc).__name__})")
        ctl.close()


def test_a_sum_claimed_written_without_a_window_fails_the_worker():
    """A PULL_RESPONSE announcing bytes written one-way where the worker offered no window:
    the worker drops that connection (it never takes the claim for data) and its push_pull
    fails with PeerLostError naming the server within seconds; the worker process ends."""
    port, secret, env = bare_job_env({"BYTEPS_FORCE_DISTRIBUTED": "1"})
    with Group() as group:  # stops (by PID) whatever still runs on the way out
        group.start([sys.executable, "-m", "byteps.server"], dict(env, DMLC_ROLE="scheduler"),
                    label="scheduler")
        wait_listening(port)
        server = LyingServer(("127.0.0.1", port), secret.encode())
        server.start()
        t0 = time.monotonic()
        worker = group.start([PY, "-c", WORKER],
                             dict(env, DMLC_ROLE="worker", DMLC_WORKER_ID="0"), label="worker")
        worker.wait(60)
        out = worker.output
        elapsed = time.monotonic() - t0
        server.join(30)
    assert server.error is None, repr(server.error)
    assert server.events[0] == "hello" and server.events[1].startswith("push "), server.events
    assert server.events[-1].startswith("closed by the worker"), server.events
    m = re.search(r"^RESULT (\w+) (.*)$", out, re.M)
    assert m and m.group(1) == "PeerLostError" and "server" in m.group(2), out[-3000:]
    assert "which has no window for it" in out, out[-3000:]
    assert elapsed < 20, elapsed
