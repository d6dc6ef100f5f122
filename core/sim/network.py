"""The event loop and the fluid network of the simulator.

* :class:`Sim`: a discrete-event loop (a heap of timed callbacks, seconds) that also advances
  the network between events.
* :class:`Port`: one direction of a NIC (or a machine's local bus), capacity in bytes/s;
  optionally shaped by a token bucket (``burst`` bytes at ``peak`` bytes/s before the
  capacity holds, as ``tc``'s ``tbf`` lets through after an idle link).
* :class:`Conn`: a FIFO channel from one port to another (a TCP connection, one direction):
  its messages leave one at a time, in order; a message in flight is a *flow* that gets a
  max-min fair share of both ports (progressive filling, recomputed whenever the set of
  flows changes), and is delivered ``latency`` seconds after its last byte left.

How it stays fast at many machines (the result is the same max-min allocation):

* flows with the same ports (a *path*) get the same max-min rate, so rates are computed per
  path, with its flow count as a weight;
* a recompute covers only the ports connected (through flows) to a path whose flow count
  changed: a machine's loopback or GPU bus is a component of its own, so its traffic does not
  recompute the NICs' shares;
* a message that follows another on the same connection at the instant the first ends
  changes no count: no recompute at all;
* progressive filling takes the port with the smallest fair share from a heap;
* each flow's end is an entry in a heap, re-scheduled only when its rate changes, and bytes
  are settled per flow when its rate changes (not every flow at every event).

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

_ids = itertools.count()
_EPS = 1e-9  # a port's weighted flow count at or below this: no flows


class Port:
    """A resource that moves bytes: one direction of a NIC, or a local bus.

    Attributes:
        name (str): e.g. ``w0.tx`` (worker machine 0's uplink), ``c1.rx``, ``w0.local``.
        capacity (float): bytes/s.
        bytes (float): bytes of the flows through it that have ended; at the end of a run,
            ``bytes / capacity`` is its busy time, seconds.
        tokens (float): what is left of its token bucket, bytes (constructor ``burst``,
            default 0: none, a NIC's line rate). The bucket starts full; while it holds tokens
            the port moves the constructor's ``peak`` bytes/s (required with a burst) and
            spends what it moves above ``capacity``; once empty the port moves ``capacity``
            for the rest of the run (the bucket is not refilled: a run is one iteration after
            an idle link, as a ``tbf`` shaper sees a benchmark's timed push_pull).
    """

    __slots__ = ("name", "capacity", "bytes", "paths", "id", "cnt", "rcap", "rcnt", "stamp",
                 "cap", "tokens", "tok_rate", "tok_t", "tok_ver")

    def __init__(self, name: str, capacity: float, burst: float = 0.0, peak: float = 0.0):
        from ..errors import InvalidArgumentError

        if not capacity > 0:
            raise InvalidArgumentError(f"port {name}: capacity must be > 0 bytes/s, "
                                       f"got {capacity}")
        if burst < 0 or (burst > 0 and not peak > capacity):
            raise InvalidArgumentError(f"port {name}: burst >= 0 bytes, and with a burst a "
                                       f"peak rate above the capacity ({capacity} bytes/s)")
        self.name, self.capacity, self.bytes = name, float(capacity), 0.0
        #: the capacity now (peak while the bucket holds tokens)
        self.cap = float(peak) if burst > 0 else self.capacity
        self.tokens = float(burst)
        self.tok_rate, self.tok_t, self.tok_ver = 0.0, 0.0, 0  # rate through it, since when
        self.paths: Dict[_Path, None] = {}  # paths with flows now (an ordered set)
        self.id = next(_ids)
        self.cnt = 0.0  # flows through it now (weighted: Conn.src_weight, dst_weight)
        self.rcap, self.rcnt, self.stamp = 0.0, 0, 0  # scratch of a rate computation

    @property
    def busy_s(self) -> float:
        """Seconds this port would need to move what it moved at full rate."""
        return self.bytes / self.capacity


class _Path:
    """The flows between the same ports: one max-min rate, ``count`` flows."""

    __slots__ = ("ports", "pw", "count", "rated_count", "rate", "flows", "stamp")

    def __init__(self, ports: Tuple[Port, ...], weights: Tuple[float, ...]):
        self.ports = ports
        self.pw = tuple(zip(ports, weights))  # (port, flows of the port each flow stands for)
        self.count = 0
        self.rated_count = 0  # count when ``rate`` was computed
        self.rate = 0.0
        self.flows: Dict[_Flow, None] = {}
        self.stamp = 0


class _Flow:
    __slots__ = ("conn", "size", "left", "rate", "t", "ver", "path", "done")

    def __init__(self, conn: Conn, nbytes: float, path: _Path, done: Callable[[], None]):
        self.conn, self.size, self.left, self.done = conn, float(nbytes), float(nbytes), done
        self.rate, self.t, self.ver, self.path = 0.0, 0.0, 0, path


class Sim:
    """Discrete-event loop with a fluid network. ``now``: simulated seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: List[Tuple[float, int, Callable, tuple]] = []
        self._seq = 0
        self._ends: List[Tuple[float, int, int, _Flow]] = []  # (end, seq, version, flow)
        self._paths: Dict[Tuple[Optional[Port], Optional[Port]], _Path] = {}
        self._changed: Dict[_Path, None] = {}
        self._unrated: List[_Flow] = []
        self.events = 0
        self.recomputes = 0
        self._stamp = 0

    # ------------------------------------------------------------------------- events --
    def at(self, t: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` at simulated time ``t`` (seconds, not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))

    def after(self, dt: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` ``dt`` seconds from now."""
        self.at(self.now + dt, fn, *args)

    # ------------------------------------------------------------------------ network --
    def _start(self, conn: Conn, nbytes: float, done: Callable[[], None]) -> None:
        key = (conn.src, conn.dst, conn.src_weight, conn.dst_weight)
        path = self._paths.get(key)
        if path is None:
            pw = [(p, w) for p, w in ((conn.src, conn.src_weight), (conn.dst, conn.dst_weight))
                  if p is not None]
            path = self._paths[key] = _Path(tuple(p for p, _ in pw), tuple(w for _, w in pw))
        flow = _Flow(conn, nbytes, path, done)
        flow.t = self.now
        path.flows[flow] = None
        if path.count == 0:
            for p in path.ports:
                p.paths[path] = None
        path.count += 1
        for p, w in path.pw:
            p.cnt += w
        self._changed[path] = None
        self._unrated.append(flow)

    def _finish(self, flow: _Flow) -> None:
        path = flow.path
        del path.flows[flow]
        path.count -= 1
        for p, w in path.pw:
            p.cnt -= w
        if path.count == 0:
            for p in path.ports:
                del p.paths[path]
        self._changed[path] = None
        flow.ver += 1
        flow.left = 0.0
        for p, w in path.pw:
            p.bytes += flow.size * w
        flow.conn._flow_done(flow)

    def _schedule(self, flow: _Flow) -> None:
        flow.ver += 1
        self._seq += 1
        heapq.heappush(self._ends, (flow.t + flow.left / flow.rate, self._seq, flow.ver, flow))

    def _rates(self) -> None:
        """Max-min fair rates of the paths connected to a changed one (progressive filling,
        smallest fair share first), then the flows whose rate changed are re-scheduled."""
        changed = [p for p in self._changed if p.count != p.rated_count]
        self._changed.clear()
        if changed:
            self.recomputes += 1
            self._stamp += 1
            stamp = self._stamp
            # the component: ports reachable from the changed paths through paths with flows
            comp: List[Port] = []
            for p in changed:
                p.rated_count = p.count
                for q in p.ports:
                    if q.stamp != stamp:
                        q.stamp = stamp
                        comp.append(q)
            i = 0
            while i < len(comp):
                for path in comp[i].paths:
                    for r in path.ports:
                        if r.stamp != stamp:
                            r.stamp = stamp
                            comp.append(r)
                i += 1
            heap = []
            for q in comp:
                c = q.cnt
                q.rcap, q.rcnt = q.cap, c
                if c > _EPS:
                    heap.append((q.cap / c, q.id, q))
            heapq.heapify(heap)
            now = self.now
            pop, push, schedule = heapq.heappop, heapq.heappush, self._schedule
            while heap:
                share, _, q = pop(heap)
                c = q.rcnt
                if c <= _EPS:
                    continue
                cur = q.rcap / c
                if cur > share:  # stale: shares only grow as paths are fixed
                    push(heap, (cur, q.id, q))
                    continue
                for path in q.paths:
                    if path.stamp == stamp:
                        continue
                    path.stamp = stamp
                    pc = path.count
                    path.rated_count = pc
                    for r, w in path.pw:
                        r.rcap -= cur * pc * w
                        r.rcnt -= pc * w
                    if path.rate != cur:
                        path.rate = cur
                        for f in path.flows:
                            if f.rate > 0:  # running: settle at the old rate
                                f.left -= f.rate * (now - f.t)
                                f.t = now
                                f.rate = cur
                                schedule(f)
            for q in comp:
                if q.tokens > 0:
                    self._spend_tokens(q)
        for f in self._unrated:
            if f.ver == 0:  # not finished in the meantime
                f.rate = f.path.rate
                self._schedule(f)
        self._unrated.clear()

    def _spend_tokens(self, q: Port) -> None:
        """Settle a shaped port's bucket at the rate it had, take its new rate through it,
        and schedule the instant the bucket runs empty at that rate."""
        q.tokens -= max(q.tok_rate - q.capacity, 0.0) * (self.now - q.tok_t)
        q.tok_t = self.now
        q.tok_rate = sum(path.rate * path.count * w for path in q.paths
                         for p, w in path.pw if p is q)
        q.tok_ver += 1
        if q.tokens <= 0:
            self._bucket_empty(q, q.tok_ver)
        elif q.tok_rate > q.capacity:
            self.after(q.tokens / (q.tok_rate - q.capacity), self._bucket_empty, q, q.tok_ver)

    def _bucket_empty(self, q: Port, ver: int) -> None:
        """The port's bucket ran empty: from now on it moves its capacity."""
        if ver != q.tok_ver:  # the port's rate changed since, or the bucket is empty already
            return
        q.tokens, q.cap = 0.0, q.capacity
        q.tok_ver += 1
        for path in q.paths:
            path.rated_count = -1  # force a recompute of the paths through it
            self._changed[path] = None

    def run(self, until: float = math.inf) -> float:
        """Run until nothing is left to do (or ``until`` seconds); returns the time."""
        ends, heap = self._ends, self._heap
        while True:
            if self._changed or self._unrated:
                self._rates()
            while ends and ends[0][2] != ends[0][3].ver:  # superseded
                heapq.heappop(ends)
            t_net = ends[0][0] if ends else math.inf
            t_ev = heap[0][0] if heap else math.inf
            if min(t_net, t_ev) > until or (not ends and not heap):
                if until < math.inf:
                    self.now = max(self.now, until)
                return self.now
            self.events += 1
            if t_net <= t_ev:
                self.now = max(self.now, t_net)
                # every flow ending now (symmetric traffic ends in batches): one recompute
                eps = 1e-12 + 1e-9 * t_net
                batch = []
                while ends and ends[0][0] <= t_net + eps:
                    _, _, ver, f = heapq.heappop(ends)
                    if ver == f.ver:
                        batch.append(f)
                for f in batch:
                    self._finish(f)
            else:
                t, _, fn, args = heapq.heappop(heap)
                self.now = max(self.now, t)
                fn(*args)
                while heap and heap[0][0] <= t:  # the same instant: no recompute
                    _, _, fn, args = heapq.heappop(heap)
                    fn(*args)


class Conn:
    """A FIFO channel from port ``src`` to port ``dst`` (either may be None: not limited
    there) with a one-way delivery latency (seconds) after the last byte. ``src_weight`` /
    ``dst_weight``: how many flows each of its flows counts as at that port (default 1; the
    symmetric model's ports that stand for several machines).

    ``send(nbytes, on_delivered)``: queue a message; ``on_delivered()`` runs on arrival.
    """

    __slots__ = ("sim", "src", "dst", "latency", "queue", "busy", "name", "src_weight",
                 "dst_weight")

    def __init__(self, sim: Sim, src: Optional[Port], dst: Optional[Port], latency: float,
                 name: str = "", src_weight: float = 1.0, dst_weight: float = 1.0):
        self.sim, self.src, self.dst, self.latency, self.name = sim, src, dst, latency, name
        self.src_weight, self.dst_weight = float(src_weight), float(dst_weight)
        self.queue: Deque[Tuple[float, Callable[[], None]]] = deque()
        self.busy = False

    def send(self, nbytes: float, on_delivered: Callable[[], None]) -> None:
        """Queue ``nbytes`` bytes; ``on_delivered()`` runs when they have arrived."""
        self.queue.append((float(nbytes), on_delivered))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.queue:
            self.busy = False
            return
        nbytes, cb = self.queue.popleft()
        self.busy = True
        if self.src is None and self.dst is None:
            self.sim.after(self.latency, cb)
            self._next()
            return
        self.sim._start(self, nbytes, cb)

    def _flow_done(self, flow: _Flow) -> None:
        self.sim.after(self.latency, flow.done)
        self._next()


class PriorityConn(Conn):
    """A :class:`Conn` whose waiting messages leave smallest ``order`` first (ties in the
    order sent) instead of first in, first out: a stage queue of the core
    (``ScheduledQueue``), e.g. a machine's GPU bus shared by the local reduce and broadcast.

    ``send(nbytes, on_delivered, order)``: ``order`` is any comparable value (a tuple).
    """

    __slots__ = ("heap", "seq")

    def __init__(self, sim: Sim, src: Optional[Port], dst: Optional[Port], latency: float,
                 name: str = ""):
        super().__init__(sim, src, dst, latency, name)
        self.heap: List[tuple] = []
        self.seq = 0

    def send(self, nbytes: float, on_delivered: Callable[[], None], order=()) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (order, self.seq, float(nbytes), on_delivered))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.heap:
            self.busy = False
            return
        _, _, nbytes, cb = heapq.heappop(self.heap)
        self.busy = True
        self.sim._start(self, nbytes, cb)
