"""``byteps.p2p``: the worker-to-worker channel (``core/cpp/p2p/channel.h``).

Tagged, asynchronous send and receive of contiguous buffers between the worker processes of a
byteps job, over the job's van (TCP, or UCX when ``DMLC_ENABLE_RDMA=ucx`` / ``DMLC_ENABLE_UCX=1``
select it), every link authenticated with the job secret before anything is read from it.
``byteps.torch.pipeline`` moves activations and gradients between pipeline stages through it.

Typical use, inside a job started by ``bpslaunch`` (after ``byteps.init()``)::

    from byteps.p2p import Channel
    ch = Channel.for_job()                 # every rank, same order of calls
    if ch.rank == 0:
        ch.send(1, tag=7, data=torch.arange(4.0))
    else:
        out = torch.empty(4)
        ch.recv(0, tag=7, out=out)
    ch.close()

Peers find each other through the job: :meth:`Channel.for_job` listens, then every rank's
``host:port`` is all-gathered with one push_pull of a ``size`` x 64 byte tensor (each rank writes
its row, the others zeros: the sum is every row), so no new service or scheduler message is
needed. Then every rank links to every other (a full mesh, so that the death of any process
reaches every other one at once).

Data: a CPU ``torch.Tensor`` (contiguous; its memory is sent from and received into directly),
or any object with the buffer protocol (``bytes``, ``bytearray``, ``memoryview``, NumPy arrays;
a read-only one is copied once when sent). A message is at most ``max_message_bytes`` (default
1 GiB); messages of one (sender, tag) arrive in the order they were sent.

Errors (:mod:`byteps.errors`): ``PeerLostError`` once any rank of the job is lost (its process
died or its link broke: every pending and later operation, on every rank), or for a receive from
a rank that closed its channel; ``BytePSTimeoutError`` after ``timeout`` seconds (default
``BYTEPS_TIMEOUT``); ``InvalidArgumentError`` for a message larger than the receive's buffer;
``ConfigError`` without a job secret (``BYTEPS_SECRET``, or ``BYTEPS_ALLOW_UNAUTHENTICATED=1``);
``NotInitializedError`` after :meth:`Channel.close`.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from typing import Optional, Sequence

from . import _core
from .errors import InvalidArgumentError, InvalidTypeError

#: bytes of one rank's row in the address all-gather ("host:port", NUL-padded)
ADDRESS_BYTES = 64
_generation = itertools.count()


def _default_timeout() -> float:
    return float(_core.knob_values(dict(os.environ))["BYTEPS_TIMEOUT"])


def _address_of(data, writable: bool):
    """(address, nbytes, object keeping the memory alive) of a tensor or buffer."""
    if hasattr(data, "data_ptr") and hasattr(data, "element_size"):  # a torch.Tensor
        if data.device.type != "cpu":
            raise InvalidTypeError(f"p2p: a {data.device.type} tensor (CPU tensors only)")
        if not data.is_contiguous():
            raise InvalidArgumentError("p2p: a non-contiguous tensor (call .contiguous())")
        return data.data_ptr(), data.numel() * data.element_size(), data
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidTypeError(f"p2p: {type(data).__name__} is neither a tensor nor a "
                               f"buffer") from None
    if not view.c_contiguous:
        raise InvalidArgumentError("p2p: a non-contiguous buffer")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.readonly:
        if writable:
            raise InvalidArgumentError("p2p: a read-only buffer to receive into")
        view = memoryview(bytearray(view))  # sent from a copy
    n = view.nbytes
    if n == 0:
        return 0, 0, view
    holder = (ctypes.c_char * n).from_buffer(view)
    return ctypes.addressof(holder), n, (view, holder)


class Op:
    """A pending send or receive of a :class:`Channel`; :meth:`wait` finishes it."""

    def __init__(self, channel: Channel, op_id: int, keep, out):
        self._ch = channel
        self._id = op_id
        self._keep = keep
        self._out = out
        self._result = None
        self._finished = False

    def done(self) -> bool:
        """True when :meth:`wait` returns at once."""
        return self._finished or self._ch._core().test(self._id)

    def wait(self, timeout: Optional[float] = None):
        """Waits (GIL released) and returns: for a send, the bytes sent (int); for a receive
        into ``out``, ``out``; for a receive without one, the message (a read-only uint8 buffer,
        :class:`byteps._core.P2pMessage`). Raises the operation's error (module docstring);
        ``BytePSTimeoutError`` after ``timeout`` s (default: the channel's) leaves it pending."""
        if self._finished:
            return self._result
        t = self._ch.timeout if timeout is None else float(timeout)
        try:
            nbytes, msg = self._ch._core().wait(self._id, t)
        except Exception as exc:
            if type(exc).__name__ != "BytePSTimeoutError":
                self._finish(None)
            raise
        self._finish(msg if msg is not None else (self._out if self._out is not None
                                                   else nbytes))
        self.nbytes = nbytes
        return self._result

    def _finish(self, result):
        self._finished = True
        self._result = result
        self._keep = None
        self._ch._pending.pop(self._id, None)


class Channel:
    """One process's end of the job's worker-to-worker channel.

    Args:
        rank, size: this process's rank and the number of ranks (ints, 0 <= rank < size).
        host: address to listen at and advertise; ``""`` = ``DMLC_NODE_HOST``, else
            ``DMLC_INTERFACE``'s address, else the route to the scheduler, else 127.0.0.1.
        port: 0 = any free port.
        van: ``""`` = the job's van (``DMLC_ENABLE_RDMA`` / ``DMLC_ENABLE_UCX`` /
            ``BYTEPS_ENABLE_IPC``), or ``"tcp"`` / ``"ucx"``.
        max_message_bytes: largest message accepted (default 1 GiB).
        max_buffered_bytes: most bytes held for receives not posted yet (default 4 GiB).
        timeout: default seconds of every wait (default ``BYTEPS_TIMEOUT``).
    """

    def __init__(self, rank: int, size: int, host: str = "", port: int = 0, *, van: str = "",
                 max_message_bytes: int = 1 << 30, max_buffered_bytes: int = 4 << 30,
                 timeout: Optional[float] = None):
        self.timeout = _default_timeout() if timeout is None else float(timeout)
        self._ch = _core.P2pChannel(int(rank), int(size), host, int(port),
                                    int(max_message_bytes), int(max_buffered_bytes), van)
        self._pending: dict = {}  # op id -> Op (its memory stays alive until finished)
        self._lock = threading.Lock()
        self.rank, self.size = int(rank), int(size)
        self.host, self.port = self._ch.host, self._ch.port
        self.van_kind = self._ch.van_kind

    @property
    def address(self) -> str:
        """``host:port`` peers reach this channel at."""
        return f"{self.host}:{self.port}"

    @classmethod
    def for_job(cls, timeout: Optional[float] = None, **kwargs) -> Channel:
        """A channel of rank ``byteps.rank()`` among ``byteps.size()`` ranks, linked to every
        other rank of the job. Collective: every rank calls it, in the same order relative to
        its other push_pulls. Needs ``byteps.init()``. Raises ``BytePSTimeoutError`` when a rank
        does not link within ``timeout``; the push_pull's errors."""
        from . import basics
        ch = cls(basics.rank(), basics.size(), timeout=timeout, **kwargs)
        try:
            addrs = all_gather_addresses(ch.address, ch.rank, ch.size)
            ch.connect_all(addrs)
        except BaseException:
            ch.close(flush_timeout=0)
            raise
        return ch

    def connect_all(self, addresses: Sequence[str]) -> None:
        """Links to every other rank (``addresses[r]`` = rank r's ``host:port``) and waits for
        every rank's link to this one."""
        peers = [r for r in range(self.size) if r != self.rank]
        for r in peers:
            host, port = addresses[r].rsplit(":", 1)
            self._ch.connect(r, host, int(port), self.timeout)
        self._ch.wait_inbound(peers, self.timeout)

    def connect(self, peer: int, address: str) -> None:
        """Opens the link for sends to ``peer`` listening at ``address`` (``host:port``)."""
        host, port = address.rsplit(":", 1)
        self._ch.connect(int(peer), host, int(port), self.timeout)

    def wait_inbound(self, peers: Sequence[int], timeout: Optional[float] = None) -> None:
        """Waits until every rank in ``peers`` has linked to this one."""
        self._ch.wait_inbound(list(peers), self.timeout if timeout is None else timeout)

    def _core(self):
        return self._ch

    def _track(self, op: Op) -> Op:
        self._pending[op._id] = op
        return op

    def isend(self, peer: int, tag: int, data) -> Op:
        """Starts sending ``data`` (tensor or buffer, left untouched until the op finishes) to
        ``peer`` under ``tag`` (0 <= tag < 2**64)."""
        ptr, n, keep = _address_of(data, writable=False)
        return self._track(Op(self, self._ch.isend_ptr(int(peer), int(tag), ptr, n), keep, None))

    def irecv(self, peer: int, tag: int, out=None) -> Op:
        """Posts a receive of ``peer``'s next message under ``tag``: into ``out`` (a writable
        tensor or buffer of at least the message's bytes) or, without it, into a buffer the
        channel allocates."""
        if out is None:
            return self._track(Op(self, self._ch.irecv(int(peer), int(tag)), None, None))
        ptr, n, keep = _address_of(out, writable=True)
        if n == 0:
            raise InvalidArgumentError("p2p: an empty buffer to receive into")
        return self._track(Op(self, self._ch.irecv_ptr(int(peer), int(tag), ptr, n), keep, out))

    def send(self, peer: int, tag: int, data, timeout: Optional[float] = None) -> int:
        """Blocking :meth:`isend`; returns the bytes sent."""
        return self.isend(peer, tag, data).wait(timeout)

    def recv(self, peer: int, tag: int, out=None, timeout: Optional[float] = None):
        """Blocking :meth:`irecv`; returns ``out`` or the message."""
        return self.irecv(peer, tag, out).wait(timeout)

    def check(self) -> None:
        """Raises the channel's failure (``PeerLostError``), if it has failed."""
        self._ch.check()

    def close(self, flush_timeout: float = 5.0) -> None:
        """Says goodbye to every peer (its queued sends flushed within ``flush_timeout`` s),
        closes every link; operations still pending fail with ``NotInitializedError``.
        Idempotent."""
        self._ch.close(float(flush_timeout))
        for op in list(self._pending.values()):
            op._finish(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(flush_timeout=5.0 if exc[0] is None else 0.0)


def all_gather_addresses(address: str, rank: int, size: int) -> list:
    """Every rank's ``address`` (``host:port``), through one push_pull of a ``size`` x 64
    uint8 tensor named ``byteps.p2p.addresses.<n>`` (n counts the calls of this process)."""
    from . import basics
    raw = address.encode()
    if len(raw) >= ADDRESS_BYTES:
        raise InvalidArgumentError(f"p2p: address {address!r} is longer than "
                                   f"{ADDRESS_BYTES - 1} bytes")
    buf = (ctypes.c_uint8 * (size * ADDRESS_BYTES))()
    ctypes.memmove(ctypes.addressof(buf) + rank * ADDRESS_BYTES, raw, len(raw))
    ptr = ctypes.addressof(buf)
    handle = basics.push_pull_async(f"byteps.p2p.addresses.{next(_generation)}", ptr, ptr,
                                    len(buf), "uint8", [size, ADDRESS_BYTES], average=False)
    basics.wait(handle)
    data = bytes(buf)
    out = []
    for r in range(size):
        row = data[r * ADDRESS_BYTES:(r + 1) * ADDRESS_BYTES].rstrip(b"\0")
        out.append(row.decode())
    if out[rank] != address:
        raise InvalidArgumentError(f"p2p: address exchange garbled rank {rank}'s row")
    return out
