"""The van seam on its own (docs/architecture.md §6, ``core/cpp/comm/van.h``), through
``byteps._core.testing``: ``Van::Create`` knows its kinds and refuses others; a loopback
connection over 127.0.0.1 (listen, connect, authenticate) carries a frame from the sender's
memory into memory the receiving handler picks; the handler's ``ValidateHeader`` runs before
``OnHeader`` and a refused header drops the connection. The van carries any message type: what
the types mean is the PS layer's (``ps/protocol.h``), not the van's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from jobs import clean_job_env

from byteps._core import testing as T
from byteps.errors import InvalidArgumentError


def test_create_tcp():
    assert T.van_kind("tcp") == "tcp"


@pytest.mark.parametrize("kind", ["rdma", "", "TCP", "tcp "])
def test_create_unknown_kind(kind):
    with pytest.raises(InvalidArgumentError, match=f"unknown van '{kind}'.*tcp"):
        T.van_kind(kind)


@pytest.mark.parametrize("size", [0, 1, 48, 4096, 3 << 20])
def test_loopback_carries_the_payload(size):
    payload = os.urandom(size)
    got = T.van_loopback("tcp", 21, payload, aux=(1 << 64) - 2)
    assert got == {"type": 21, "aux": (1 << 64) - 2, "payload": payload, "peer": "loopback peer"}


@pytest.mark.parametrize("type_", [0, 999, 0xFFFF])
def test_van_carries_any_message_type(type_):
    """Types the PS protocol refuses are the handler's business, not the van's."""
    assert T.van_loopback("tcp", type_, b"abc")["type"] == type_


def test_refused_header_never_reaches_on_header():
    with pytest.raises(InvalidArgumentError, match="message type 7 refused by the handler"):
        T.van_loopback("tcp", 7, b"x" * 100, refused_type=7, timeout_s=5)
    # another type on the same kind of link still passes
    assert T.van_loopback("tcp", 8, b"y", refused_type=7)["payload"] == b"y"


def test_loopback_unknown_kind():
    with pytest.raises(InvalidArgumentError, match="unknown van"):
        T.van_loopback("rdma", 21, b"")


@pytest.mark.skipif(not T.ucx_available, reason="this build has no UCX transport")
def test_ucx_van_start_failure_is_a_config_error():
    """A UCX van whose context cannot start (UCX_TLS names nothing) is a ConfigError naming
    UCX_TLS, not a crash of the half-made van (run in a child: a crash must not take pytest)."""
    code = ("from byteps._core import testing as T\n"
            "try:\n    T.van_kind('ucx')\nexcept Exception as e:\n"
            "    print('RESULT', type(e).__name__, e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=clean_job_env({"UCX_TLS": "nonsense"}), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT ConfigError" in proc.stdout and "UCX_TLS=nonsense" in proc.stdout, proc.stdout
