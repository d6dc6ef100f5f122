"""The van seam on its own (docs/architecture.md §6, ``core/cpp/comm/van.h``), through
``byteps._core_testing``: ``Van::Create`` knows its kinds and refuses others; a loopback
connection over 127.0.0.1 (listen, connect, authenticate) carries a frame from the sender's
memory into memory the receiving handler picks; the handler's ``ValidateHeader`` runs before
``OnHeader`` and a refused header drops the connection. The van carries any message type: what
the types mean is the PS layer's (``ps/protocol.h``), not the van's. Every loopback test runs
for each kind the build has ("tcp", and "ucx" in a build with UCX).

The UCX van's own guarantees (``comm/ucx/ucx_van.h``): a UCX link exists only behind the
bootstrap on an authenticated socket. A stranger's UCX context that knows the listener's worker
address but holds no token it handed out (or one already redeemed) is refused, and the listener
hands out nothing; the socket a link was bootstrapped on is its lifeline (its end of file fails
the link); a node whose van differs from the listener's is dropped with an error, not left
hanging.
"""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest
from jobs import skip_without_ucx
from test_security import recv_exact
from testing_hooks import core_testing

from byteps.errors import InvalidArgumentError, PeerLostError

T = core_testing()

needs_ucx = skip_without_ucx()
KINDS = ["tcp", pytest.param("ucx", marks=needs_ucx)]


def test_create_tcp():
    assert T.van_kind("tcp") == "tcp"


@needs_ucx
def test_create_ucx():
    assert T.van_kind("ucx") == "ucx"


@pytest.mark.parametrize("kind", ["rdma", "", "TCP", "tcp "])
def test_create_unknown_kind(kind):
    with pytest.raises(InvalidArgumentError, match=f"unknown van '{kind}'.*tcp"):
        T.van_kind(kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [0, 1, 48, 4096, 3 << 20])
def test_loopback_carries_the_payload(kind, size):
    payload = os.urandom(size)
    got = T.van_loopback(kind, 21, payload, aux=(1 << 64) - 2)
    assert got == {"type": 21, "aux": (1 << 64) - 2, "payload": payload, "peer": "loopback peer"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("type_", [0, 999, 0xFFFF])
def test_van_carries_any_message_type(kind, type_):
    """Types the PS protocol refuses are the handler's business, not the van's."""
    assert T.van_loopback(kind, type_, b"abc")["type"] == type_


@pytest.mark.parametrize("kind", KINDS)
def test_refused_header_never_reaches_on_header(kind):
    with pytest.raises(InvalidArgumentError, match="message type 7 refused by the handler"):
        T.van_loopback(kind, 7, b"x" * 100, refused_type=7, timeout_s=5)
    # another type on the same kind of link still passes
    assert T.van_loopback(kind, 8, b"y", refused_type=7)["payload"] == b"y"


def _stream_ok(r, total):
    assert r["completed"] == total and r["failed"] == 0, r
    assert r["received"] == total and r["out_of_order"] == 0 and r["corrupt"] == 0, r


@pytest.mark.parametrize("kind", KINDS)
def test_frames_of_concurrent_senders_keep_each_sender_s_order(kind):
    """4 threads send 64 frames of 48 KiB each on one connection while the receiver pauses:
    every frame arrives, each thread's in order, byte-exact, and completes."""
    r = T.van_stream(kind, threads=4, frames=64, bytes=48 << 10, pause_s=0.3)
    _stream_ok(r, 256)


def test_loopback_unknown_kind():
    with pytest.raises(InvalidArgumentError, match="unknown van"):
        T.van_loopback("rdma", 21, b"")


# ------------------------------------------------------------------------------ UCX van --

HELLO = struct.Struct("<4sHHI")    # magic, version, flags (1: wants UCX), address length
REPLY = struct.Struct("<4sHHQI")   # magic, version, flags, token, address length


def bootstrap(port: int):
    """The connecting side of the UCX van's bootstrap, by hand (this test process has no job
    secret, so the listener runs no handshake first). Returns (the socket, the token, the
    listener's worker address)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(HELLO.pack(b"BPSV", 1, 1, 8) + b"\0" * 8)
    magic, version, flags, token, length = REPLY.unpack(recv_exact(s, REPLY.size))
    assert (magic, version, flags) == (b"BPSV", 1, 1)
    address = recv_exact(s, length)
    assert len(address) == length > 0
    return s, token, address


@needs_ucx
@pytest.mark.parametrize("token", [0, 1, (1 << 64) - 1])
def test_ucx_stranger_without_a_token_gets_no_link(token, capfd):
    """A CONNECT straight to the listener's worker address with a token it never handed out
    is refused (PeerLostError, no hang) and logged; no connection reaches the listener's
    owner."""
    probe = T.UcxVanProbe()
    try:
        t0 = time.monotonic()
        with pytest.raises(PeerLostError, match="refused"):
            probe.raw_connect(probe.worker_address, token, timeout_s=5)
        assert time.monotonic() - t0 < 5
        assert probe.accepted == 0
    finally:
        probe.close()
    assert "never handed out" in capfd.readouterr().err


@needs_ucx
def test_ucx_token_opens_one_link_and_its_socket_is_the_lifeline():
    """A token from the bootstrap opens exactly one link (the listener hands it out); the same
    token again is refused; when the bootstrap socket closes, the link fails with PeerLost."""
    probe = T.UcxVanProbe()
    try:
        sock, token, address = bootstrap(probe.port)
        assert address == probe.worker_address
        probe.raw_connect(address, token)
        deadline = time.monotonic() + 5
        while probe.accepted < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert probe.accepted == 1
        with pytest.raises(PeerLostError, match="refused"):
            probe.raw_connect(address, token)  # one-time
        assert probe.accepted == 1
        assert probe.wait_closed(0, timeout_s=0.5) is None  # the lifeline holds it open
        sock.close()
        closed = probe.wait_closed(0, timeout_s=5)
        assert closed is not None and closed[0] == "PEER_LOST", closed
        assert "lifeline" in closed[1], closed
    finally:
        probe.close()


@needs_ucx
def test_ucx_token_expires_with_the_handshake_timeout():
    """A token not redeemed within the handshake timeout (5 s) is forgotten (and its socket
    closed): redeeming it later is refused."""
    probe = T.UcxVanProbe()
    try:
        sock, token, address = bootstrap(probe.port)
        sock.settimeout(10)
        t0 = time.monotonic()
        # the listener closes the socket of an expired token when it next looks at its tokens:
        # a second bootstrap after the deadline makes it look
        time.sleep(5.2)
        other, _, _ = bootstrap(probe.port)
        assert sock.recv(1) == b"", "the expired token's socket is still open"
        assert time.monotonic() - t0 < 8
        with pytest.raises(PeerLostError, match="refused"):
            probe.raw_connect(address, token)
        assert probe.accepted == 0
        other.close()
    finally:
        probe.close()


@needs_ucx
@pytest.mark.parametrize("listener,connector", [("ucx", "tcp"), ("tcp", "ucx")])
def test_a_node_with_another_van_is_dropped_with_an_error(listener, connector, capfd):
    """A TCP van's frames to a UCX listener, or a UCX van's bootstrap to a TCP listener: the
    connection is dropped at once with PeerLostError, not left hanging; the UCX side (the
    listener's log, the connecting van's error) names the variables that select the van."""
    t0 = time.monotonic()
    with pytest.raises(PeerLostError) as err:
        T.van_loopback(listener, 21, b"z" * 64, connect_kind=connector, timeout_s=8)
    assert time.monotonic() - t0 < 5, f"took {time.monotonic() - t0:.1f} s: {err.value}"
    logged = capfd.readouterr().err
    if listener == "ucx":
        assert "does not speak the UCX van's bootstrap" in logged, logged
        assert "DMLC_ENABLE_RDMA" in logged, logged
    else:
        assert "must select the same van" in str(err.value), err.value
        assert "DMLC_ENABLE_RDMA" in str(err.value), err.value
