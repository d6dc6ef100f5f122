"""The event loop and the fluid network of the simulator.

* :class:`Sim`: a discrete-event loop (a heap of timed callbacks, seconds) that also advances
  the network between events.
* :class:`Port`: one direction of a NIC (or a machine's local bus), capacity in bytes/s.
* :class:`Conn`: a FIFO channel from one port to another (a TCP connection, one direction):
  its messages leave one at a time, in order; a message in flight is a *flow* that gets a
  max-min fair share of both ports (progressive filling, recomputed whenever a flow starts or
  ends), and is delivered ``latency`` seconds after its last byte left.

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple


class Port:
    """A resource that moves bytes: one direction of a NIC, or a local bus.

    Attributes:
        name (str): e.g. ``w0.tx`` (worker machine 0's uplink), ``c1.rx``, ``w0.local``.
        capacity (float): bytes/s.
        bytes (float): bytes moved so far; ``bytes / capacity`` is its busy time, seconds.
    """

    __slots__ = ("name", "capacity", "bytes", "flows")

    def __init__(self, name: str, capacity: float):
        if not capacity > 0:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError(f"port {name}: capacity must be > 0 bytes/s, "
                                       f"got {capacity}")
        self.name, self.capacity, self.bytes = name, float(capacity), 0.0
        self.flows: List[_Flow] = []

    @property
    def busy_s(self) -> float:
        """Seconds this port would need to move what it moved at full rate."""
        return self.bytes / self.capacity


class _Flow:
    __slots__ = ("conn", "left", "rate", "ports", "done")

    def __init__(self, conn: Conn, nbytes: float, done: Callable[[], None]):
        self.conn, self.left, self.rate, self.done = conn, float(nbytes), 0.0, done
        self.ports = tuple(p for p in (conn.src, conn.dst) if p is not None)


class Sim:
    """Discrete-event loop with a fluid network. ``now``: simulated seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: List[Tuple[float, int, Callable, tuple]] = []
        self._seq = 0
        self._flows: List[_Flow] = []
        self._dirty = False
        self.events = 0

    # ------------------------------------------------------------------------- events --
    def at(self, t: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` at simulated time ``t`` (seconds, not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))

    def after(self, dt: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` ``dt`` seconds from now."""
        self.at(self.now + dt, fn, *args)

    # ------------------------------------------------------------------------ network --
    def _start(self, flow: _Flow) -> None:
        self._flows.append(flow)
        for p in flow.ports:
            p.flows.append(flow)
        self._dirty = True

    def _rates(self) -> None:
        """Max-min fair rates by progressive filling."""
        for f in self._flows:
            f.rate = -1.0
        cap: Dict[Port, float] = {}
        cnt: Dict[Port, int] = {}
        for f in self._flows:
            for p in f.ports:
                if p not in cap:
                    cap[p], cnt[p] = p.capacity, len(p.flows)
        left = len(self._flows)
        while left:
            best, share = None, math.inf
            for p, c in cnt.items():
                if c > 0 and cap[p] / c < share:
                    best, share = p, cap[p] / c
            if best is None:
                break
            for f in best.flows:
                if f.rate < 0:
                    f.rate = share
                    left -= 1
                    for q in f.ports:
                        cap[q] -= share
                        cnt[q] -= 1
        self._dirty = False

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self._flows:
                moved = f.rate * dt
                f.left -= moved
                for p in f.ports:
                    p.bytes += moved
        self.now = t

    def _next_flow_end(self) -> Tuple[float, Optional[_Flow]]:
        if self._dirty:
            self._rates()
        best, t = None, math.inf
        for f in self._flows:
            if f.rate > 0:
                e = self.now + max(f.left, 0.0) / f.rate
                if e < t:
                    best, t = f, e
        return t, best

    def _finish(self, flow: _Flow) -> None:
        self._flows.remove(flow)
        for p in flow.ports:
            p.flows.remove(flow)
        flow.left = 0.0
        self._dirty = True
        flow.conn._flow_done(flow)

    def run(self, until: float = math.inf) -> float:
        """Run until nothing is left to do (or ``until`` seconds); returns the time."""
        while True:
            t_net, flow = self._next_flow_end()
            t_ev = self._heap[0][0] if self._heap else math.inf
            if min(t_net, t_ev) > until or (flow is None and not self._heap):
                if until < math.inf:
                    self._advance(until)
                return self.now
            self.events += 1
            if flow is not None and t_net <= t_ev:
                self._advance(t_net)
                # every flow ending now (symmetric traffic ends in batches): one recompute
                eps = 1e-12 + 1e-9 * t_net
                ending = [f for f in self._flows
                          if f.rate > 0 and max(f.left, 0.0) / f.rate <= eps]
                for f in ending or [flow]:
                    self._finish(f)
            else:
                t, _, fn, args = heapq.heappop(self._heap)
                self._advance(t)
                fn(*args)
                while self._heap and self._heap[0][0] <= t:  # the same instant: no recompute
                    _, _, fn, args = heapq.heappop(self._heap)
                    fn(*args)


class Conn:
    """A FIFO channel from port ``src`` to port ``dst`` (either may be None: not limited
    there) with a one-way delivery latency (seconds) after the last byte.

    ``send(nbytes, on_delivered)``: queue a message; ``on_delivered()`` runs on arrival.
    """

    __slots__ = ("sim", "src", "dst", "latency", "queue", "busy", "name")

    def __init__(self, sim: Sim, src: Optional[Port], dst: Optional[Port], latency: float,
                 name: str = ""):
        self.sim, self.src, self.dst, self.latency, self.name = sim, src, dst, latency, name
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
        self.sim._start(_Flow(self, nbytes, cb))

    def _flow_done(self, flow: _Flow) -> None:
        self.sim.after(self.latency, flow.done)
        self._next()
