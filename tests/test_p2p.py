"""The worker-to-worker channel (``core/cpp/p2p/channel.h``, ``byteps.p2p``): round trips over
the TCP and the UCX van, large buffers, the order of one (sender, tag), receives posted before and
after their message, strangers refused (wrong secret, garbage, frames before HELLO, a claimed rank
out of range), a bound peer's out-of-bounds header, and a peer killed with SIGKILL failing every
pending operation at once instead of hanging.

Channels of several ranks live in this process (their links are real sockets on 127.0.0.1);
the killed peer is a child process started here and killed by its PID.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from jobs import clean_job_env, van_params
from test_security import handshake, handshake_on
from testing_hooks import core_testing

_core = pytest.importorskip("byteps._core", reason="the byteps core is not built")
from byteps.errors import (  # noqa: E402
    BytePSTimeoutError,
    InvalidArgumentError,
    PeerLostError,
)
from byteps.p2p import Channel  # noqa: E402

SECRET = "p2p-test-secret-" + "x" * 48
HELLO, DATA, GOODBYE = 60, 61, 62
FRAME = struct.Struct("<IHBBIIQQQQ")  # comm/frame.h FrameHeader (48 bytes)
MAGIC = 0x31535042


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    hooks = core_testing()
    monkeypatch.setenv("BYTEPS_SECRET", SECRET)  # a channel installs the environment's secret
    yield
    hooks.set_job_secret("")  # other tests expect a process without one


def mesh(size, van="tcp", **kw):
    """``size`` channels of one job in this process, every rank linked to every other."""
    chans = [Channel(r, size, "127.0.0.1", van=van, timeout=20, **kw) for r in range(size)]
    addrs = [c.address for c in chans]
    threads = [threading.Thread(target=c.connect_all, args=(addrs,)) for c in chans[1:]]
    for t in threads:
        t.start()
    chans[0].connect_all(addrs)
    for t in threads:
        t.join()
    return chans


def close_all(chans):
    for c in chans:
        c.close(flush_timeout=2)


def frame(type_, payload=b"", sender=0, key=0, length=None):
    n = len(payload) if length is None else length
    return FRAME.pack(MAGIC, type_, 0, 0, sender, 0, key, n, 0, 0) + payload


def hello(rank, size):
    return frame(HELLO, struct.pack("<III", 0x50325042, rank, size), sender=rank)


@pytest.mark.parametrize("van", van_params(["tcp", "ucx"]))
def test_round_trip_order_and_large_buffers(van):
    a, b, c = mesh(3, van)
    try:
        assert a.van_kind == van
        # posted first, then sent: straight into the buffer
        out = bytearray(11)
        op = b.irecv(0, 5, out=out)
        assert a.send(1, 5, b"hello world") == 11
        assert op.wait() is out and bytes(out) == b"hello world"
        # sent first, received later (held until posted), several in the order sent
        for i in range(5):
            a.isend(2, 9, struct.pack("<I", i)).wait()
        time.sleep(0.05)
        assert [struct.unpack("<I", bytes(c.recv(0, 9)))[0] for i in range(5)] == list(range(5))
        # tags are matched apart: the later tag's receive completes first
        o1, o2 = c.irecv(1, 1), c.irecv(1, 2)
        b.send(2, 2, b"two")
        assert bytes(o2.wait()) == b"two" and not o1.done()
        b.send(2, 1, b"one")
        assert bytes(o1.wait()) == b"one"
        # a 48 MiB buffer both ways, through allocated and caller memory
        big = bytearray(os.urandom(1 << 16)) * 768
        back = bytearray(len(big))
        ops = [b.irecv(0, 77), a.irecv(1, 78, out=back)]
        a.isend(1, 77, big)
        got = ops[0].wait()
        assert len(got) == len(big) and bytes(got) == bytes(big)
        b.send(0, 78, got)
        ops[1].wait()
        assert back == big
        # an empty message
        assert len(c.recv(0, 3, timeout=5) if a.send(2, 3, b"") == 0 else b"x") == 0
        # a message larger than the buffer: that receive fails, the channel goes on
        op = b.irecv(0, 4, out=bytearray(2))
        a.send(1, 4, b"too long")
        with pytest.raises(InvalidArgumentError, match="does not fit"):
            op.wait()
        a.send(1, 4, b"ok")
        assert bytes(b.recv(0, 4)) == b"ok"
        for ch in (a, b, c):
            ch.check()
    finally:
        close_all([a, b, c])


def test_timeout_then_goodbye():
    a, b = mesh(2)
    try:
        with pytest.raises(BytePSTimeoutError):
            b.recv(0, 1, timeout=0.2)
        op = b.irecv(0, 2)
        a.close()
        with pytest.raises(PeerLostError, match="closed its channel"):
            op.wait(timeout=5)
        b.check()  # a clean goodbye is no failure
    finally:
        close_all([a, b])


def test_strangers_are_refused_and_the_channel_goes_on():
    a, b = mesh(2)
    try:
        addr = ("127.0.0.1", a.port)
        # a wrong secret: refused by the handshake
        verdict, server_ok, *_ = handshake(addr, b"not the secret")
        assert verdict != 1 and not server_ok
        # garbage instead of a handshake (its first byte is not the handshake's magic): the
        # channel closes the connection without a byte in reply; a close with our bytes still
        # unread is a reset
        with socket.create_connection(addr, timeout=5) as s:
            s.sendall(b"\xff" + os.urandom(199))
            s.settimeout(5)
            try:
                reply = s.recv(100)
            except ConnectionResetError:
                reply = b""
            assert reply == b"", reply
        # the right secret, then: a frame before HELLO, a HELLO of another job size, a HELLO
        # claiming a rank out of range, one claiming this rank, one claiming a bound rank, a
        # header with a bad magic: every one dropped without binding a rank
        bad = [frame(DATA, b"x"), hello(1, 7), hello(5, 2), hello(0, 2), hello(1, 2),
               b"\0" * 48, frame(HELLO, b"short")]
        for payload in bad:
            with socket.create_connection(addr, timeout=5) as s:
                verdict, ok, *_ = handshake_on(s, SECRET.encode())
                assert verdict == 1 and ok
                s.sendall(payload)
                s.settimeout(5)
                try:
                    assert s.recv(1) == b""  # the channel closed it
                except ConnectionResetError:
                    pass
        a.check()
        b.check()
        b.send(0, 1, b"still fine")
        assert bytes(a.recv(1, 1)) == b"still fine"
    finally:
        close_all([a, b])


def test_bound_peer_with_an_out_of_bounds_header_is_lost():
    """A job member (right secret, valid HELLO) announcing more than max_message_bytes is
    dropped before anything is allocated, and its rank counts as lost: pending receives fail."""
    stranger_rank = None
    c0 = Channel(0, 2, "127.0.0.1", timeout=10, max_message_bytes=1 << 20)
    try:
        with socket.create_connection(("127.0.0.1", c0.port), timeout=5) as s:
            verdict, ok, *_ = handshake_on(s, SECRET.encode())
            assert verdict == 1
            s.sendall(hello(1, 2))
            c0.wait_inbound([1], timeout=5)
            op = c0.irecv(1, 1)
            s.sendall(frame(DATA, sender=1, key=1, length=1 << 40))
            with pytest.raises(PeerLostError, match="rank 1"):
                op.wait(timeout=5)
            stranger_rank = 1
        with pytest.raises(PeerLostError):
            c0.irecv(1, 5)
    finally:
        c0.close()
    assert stranger_rank == 1


PEER = textwrap.dedent("""
    import sys, time
    from byteps.p2p import Channel
    host, port, van = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ch = Channel(1, 3, "127.0.0.1", timeout=20, van=van)
    print(ch.address, flush=True)
    ch.connect(0, f"{host}:{port}")
    ch.wait_inbound([0])
    ch.send(0, 1, b"ready")
    time.sleep(60)
""")


@pytest.mark.parametrize("van", van_params(["tcp", "ucx"]))
def test_killed_peer_fails_every_pending_operation(van):
    chans = [Channel(0, 3, "127.0.0.1", timeout=20, van=van), None,
             Channel(2, 3, "127.0.0.1", timeout=20, van=van)]
    env = clean_job_env({"BYTEPS_SECRET": SECRET, "PYTHONPATH": os.environ.get("PYTHONPATH",
                                                                               "")})
    proc = subprocess.Popen([sys.executable, "-c", PEER, "127.0.0.1", str(chans[0].port), van],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        peer_addr = proc.stdout.readline().strip()
        a, c = chans[0], chans[2]
        a.connect(1, peer_addr)
        a.connect(2, c.address)
        c.connect(0, a.address)
        a.wait_inbound([1, 2])
        assert bytes(a.recv(1, 1)) == b"ready"
        pending = [a.irecv(1, 2), a.irecv(2, 3), c.irecv(0, 4)]
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        with pytest.raises(PeerLostError, match="rank 1"):
            pending[0].wait(timeout=10)
        # every operation of the channel fails, not only those waiting for rank 1
        with pytest.raises(PeerLostError, match="rank 1"):
            pending[1].wait(timeout=10)
        # and rank 0 tells rank 2 (FAILED), whose own pending receive fails too
        with pytest.raises(PeerLostError):
            pending[2].wait(timeout=10)
        assert time.monotonic() - t0 < 5
        with pytest.raises(PeerLostError):
            a.send(2, 9, b"after")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for ch in chans:
            if ch is not None:
                ch.close(flush_timeout=1)
