"""The parameter-server schemes, simulated message by message: the BytePS summation service
(``byteps``) and a native PS (``ps``), over :mod:`byteps.sim.network`.

What is modelled, as the core does it (docs/architecture.md §4-§7):

* **partitions**: a tensor of ``b`` bytes is cut at ``TensorPartitionBound`` (the job's bound,
  or, for a tensor that the job's bound would cut into fewer than 32 n partitions, ``b / (32
  n)`` rounded down to a multiple of 60 KiB, at least one, in whole pages of 4096 x L bytes);
* **placement** (``byteps``): servers on the CPU machines and/or colocated on the worker
  machines as the emulated cluster places them (k = 0: one per worker machine; 0 < k < n: one
  per CPU machine and one per worker machine; k >= n: CPU machines only), shares from the
  weights ``2(n-1)`` (CPU machine) and ``max(n-k, 0)`` (colocated), each partition, largest
  first, to the server furthest below its share (``KeyPlanner``);
  ``ps``: one server per worker machine, each *tensor* whole on the least-loaded server (a
  native PS that places variables, without BytePS's partition-level balancing);
* **push order**: priority first (``priority``: the first layer first; ``fifo``: one priority,
  so the order gradients were produced), then the earlier-declared tensor, partitions starting
  at index ``worker id`` (``StaggeredPushPosition``); **credit**: at most ``credit x partition
  bound`` bytes pushed and not yet acknowledged (one always may go) -- with
  ``Scheme.adaptive_credit`` (``byteps``) a window per worker that the core's own rule
  (``byteps._core.PushWindow``) sizes from each push's acknowledgement delay --, returned by
  the server's ``PUSH_ACK`` on receipt, modelled as arriving one latency later (in the core it queues
  behind the pull responses on the same connection; modelled that way, the n = 4, k = 2 rows
  of the architecture table come out 15 % slower than measured, without it 1-3 %:
  docs/simulator.md);
* **the server**: the first push of a round costs no copy, each later one is summed at
  ``sum_rate`` bytes/s on the key's engine thread (keys bound to the least-loaded of
  ``server_threads``); when all n have been summed the sum goes back to every worker;
* **GPUs per machine** (L > 1): a partition passes the machine's local bus (``gpu_bus``
  bytes/s, one per machine, serving the reduces and broadcasts in priority order as the
  core's stage queues do) before its push (reduce, ``(L-1)/L`` of its bytes) and after
  its pull (broadcast, the same);
* colocated worker-server traffic takes the machine's loopback (``local_bandwidth``), not
  its NIC; compression divides every pushed and pulled byte by the ratio.

Not modelled: the CPU the TCP stack spends, the PCIe copy to host, optimizer work on the
server, stragglers.
"""

from __future__ import annotations

import heapq
from typing import Callable, Dict, List, Optional, Sequence

# the core's partition rule (PartitionBound, TensorPartitionBound, scheduling/partitioner.h),
# not a copy
from .._core import partition_bound, tensor_partition_bound
from .network import Conn, Port, PriorityConn, Sim

HEADER_BYTES = 48


def server_shares(n: int, colocated: Sequence[bool]) -> List[float]:
    """``ServerShares``: each server's share of the bytes."""
    k = sum(1 for c in colocated if not c)
    w = [float(max(n - k, 0)) if c else 2.0 * max(n - 1, 0) for c in colocated]
    s = sum(w)
    if s <= 0:
        return [1.0 / len(w)] * len(w)
    return [x / s for x in w]


class KeyPlanner:
    """``KeyPlanner``: assigns partitions to servers by share, across every tensor."""

    def __init__(self, shares: Sequence[float]):
        self.shares = list(shares)
        self.assigned = [0] * len(shares)
        self.total = 0

    def assign(self, sizes: Sequence[int]) -> List[int]:
        out = [0] * len(sizes)
        for idx in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
            after = self.total + sizes[idx]
            best, deficit = 0, -1e300
            for s, share in enumerate(self.shares):
                d = share * after - self.assigned[s]
                if d > deficit + 1e-9:
                    best, deficit = s, d
            self.assigned[best] += sizes[idx]
            self.total = after
            out[idx] = best
        return out


class _Server:
    def __init__(self, name: str, machine: int, threads: int):
        self.name, self.machine = name, machine
        self.free_at = [0.0] * threads  # per engine thread: when its queue drains
        self.busy = [0.0] * threads
        self.load = [0] * threads
        self.thread_of: Dict[int, int] = {}
        self.count: Dict[int, int] = {}
        self.summed: Dict[int, int] = {}


class PSBackend:
    """The PS schemes' communication for one iteration. ``submit(j)`` hands tensor ``j``
    (ready now on every worker); ``done[w][j]`` gets the time worker ``w`` has its sum.

    Machines: worker machines 0..n-1 and CPU machines n..n+k-1 (used only by ``byteps``).
    """

    def __init__(self, sim: Sim, cluster, scheme, sizes: Sequence[int],
                 priorities: Sequence[int]):
        from ..errors import InvalidArgumentError

        self.sim, self.cl, self.sch = sim, cluster, scheme
        n, k, L = cluster.machines, cluster.cpu_machines, cluster.gpus_per_machine
        self.n, self.L = n, L
        self.sizes, self.prio = list(sizes), list(priorities)
        self.ports: List[Port] = []
        names = [f"w{i}" for i in range(n)] + [f"c{j}" for j in range(k)]
        if scheme.name == "ps" or (scheme.name == "byteps" and k == 0):
            placed = [(i, True) for i in range(n)]
        elif scheme.name == "byteps":
            placed = ([(i, True) for i in range(n)] if k < n else []) + \
                [(n + j, False) for j in range(k)]
        else:
            raise InvalidArgumentError(f"PSBackend: scheme {scheme.name!r} is not a PS scheme")
        self.servers = [_Server(names[m], m, cluster.server_threads) for m, _ in placed]
        self.planner = KeyPlanner(server_shares(n, [c for _, c in placed]) if
                                  scheme.name == "byteps" else [1.0] * len(placed))
        #: the workers simulated (all n here; one representative in the symmetric model)
        self.workers = n
        self.up: List[List[Conn]] = []  # [worker][server]
        self.down: List[List[Conn]] = []  # [worker][server]
        self.bus_conn: List[Conn] = []  # [worker]
        self._network(names)
        self.done: List[List[Optional[float]]] = [[None] * len(sizes)
                                                  for _ in range(self.workers)]
        self.job_bound = partition_bound(scheme.partition_bytes, L)
        self.credit_bytes = scheme.credit * self.job_bound if scheme.credit > 0 else 0
        #: the adaptive push window of every worker (None: the credit is fixed)
        self.windows = None
        if scheme.name == "byteps" and scheme.adaptive_credit and self.credit_bytes:
            from .._core import ADAPTIVE_CREDIT_MAX_BOUNDS, PushWindow

            self.windows = [PushWindow(self.credit_bytes, self.job_bound,
                                       ADAPTIVE_CREDIT_MAX_BOUNDS * self.job_bound)
                            for _ in range(n)]
        self.sent_at: Dict[tuple, float] = {}  # (worker, key) -> when its push left
        self.queue: List[List[tuple]] = [[] for _ in range(self.workers)]
        self.inflight = [0] * self.workers
        self.parts: Dict[int, List[tuple]] = {}  # tensor -> [(key, bytes, server)]
        self.order_of: Dict[int, tuple] = {}  # tensor -> (priority, declared): smaller first
        self.left = [[0] * len(sizes) for _ in range(self.workers)]
        self.declared = 0
        self.nkeys = 0
        self.on_tensor_done: Callable[[int, int], None] = lambda w, j: None

    def _network(self, names: List[str]) -> None:
        """Every machine's NIC (a tx and an rx port), each worker machine's loopback and GPU
        bus; one connection each way per worker and server."""
        cl, sim, n, lat = self.cl, self.sim, self.n, self.cl.latency
        nic = [(self._nic(f"{name}.tx"), self._nic(f"{name}.rx"))
               for name in names]
        loop = [self._port(f"w{i}.loopback", cl.local_bandwidth) for i in range(n)]
        if self.L > 1:
            self.bus_conn = [PriorityConn(sim, self._port(f"w{i}.gpu-bus", cl.gpu_bus_bandwidth),
                                          None, 0.0) for i in range(n)]
        for w in range(n):
            ups, downs = [], []
            for s in self.servers:
                if s.machine == w:
                    ups.append(Conn(sim, loop[w], None, 0.0))
                    downs.append(Conn(sim, loop[w], None, 0.0))
                else:
                    ups.append(Conn(sim, nic[w][0], nic[s.machine][1], lat))
                    downs.append(Conn(sim, nic[s.machine][0], nic[w][1], lat))
            self.up.append(ups)
            self.down.append(downs)

    def _nic(self, name: str) -> Port:
        """One direction of a machine's NIC (shaped by a token bucket where the cluster's
        links are)."""
        cl = self.cl
        return self._port(name, cl.bandwidth, cl.shaper_burst, cl.local_bandwidth)

    def _port(self, name: str, cap: float, burst: float = 0.0, peak: float = 0.0) -> Port:
        p = Port(name, cap, burst, peak)
        self.ports.append(p)
        return p

    # ------------------------------------------------------------------------- worker --
    def submit(self, j: int) -> None:
        """Tensor ``j`` is ready on every worker now."""
        size = self.sizes[j]
        if self.n == 1:  # one machine: no server, the local reduce and broadcast only
            self.left[0][j] = 1
            if self.L > 1:
                self.bus_conn[0].send(2 * size * (self.L - 1) / self.L,
                                      lambda: self._part_done(0, j), (self.prio[j], j, 0))
            else:
                self.sim.after(0.0, self._part_done, 0, j)
            return
        if self.sch.name == "ps":
            bound = self.job_bound
            srv = self.planner.assign([size])[0]
            cuts = [min(bound, size - o) for o in range(0, size, bound)] or [0]
            servers = [srv] * len(cuts)
        else:
            bound = tensor_partition_bound(size, self.job_bound, self.n, self.L)
            cuts = [min(bound, size - o) for o in range(0, size, bound)] or [0]
            servers = self.planner.assign(cuts)
        key0 = self.nkeys
        self.nkeys += len(cuts)
        self.parts[j] = [(key0 + i, b, s) for i, (b, s) in enumerate(zip(cuts, servers))]
        declared, self.declared = self.declared, self.declared + 1
        prio = self.prio[j] if self.sch.scheduling == "priority" else 0  # smaller first
        self.order_of[j] = (prio, declared)
        P = len(cuts)
        for w in range(self.workers):
            self.left[w][j] = P
            for i, (key, b, s) in enumerate(self.parts[j]):
                order = (prio, declared, (i + P - w % P) % P)
                if self.L > 1:
                    self.bus_conn[w].send(b * (self.L - 1) / self.L,
                                          lambda w=w, o=order, it=(j, key, b, s):
                                          self._enqueue(w, o, it), (prio, declared, key))
                else:  # the whole tensor enters the push queue at once (the core's
                    # dispatch loop), so the staggered order decides the first push too
                    heapq.heappush(self.queue[w], (order, (j, key, b, s)))
            if self.L == 1:
                self._try_push(w)

    def _enqueue(self, w: int, order: tuple, item: tuple) -> None:
        heapq.heappush(self.queue[w], (order, item))
        self._try_push(w)

    def _try_push(self, w: int) -> None:
        q = self.queue[w]
        while q:
            b = q[0][1][2]
            credit = self.windows[w].window if self.windows else self.credit_bytes
            if credit and self.inflight[w] > 0 and self.inflight[w] + b > credit:
                return
            _, (j, key, b, s) = heapq.heappop(q)
            self.inflight[w] += b
            if self.windows:
                self.windows[w].on_send(s, self.servers[s].machine == w, b)
                self.sent_at[(w, key)] = self.sim.now
            wire = b / self.sch.compression + HEADER_BYTES
            self.up[w][s].send(wire, lambda w=w, it=(j, key, b, s): self._on_push(w, it))

    def _on_ack(self, w: int, item: tuple) -> None:
        _, key, b, s = item
        self.inflight[w] -= b
        if self.windows:
            sent = self.sent_at.pop((w, key))
            self.windows[w].on_ack(s, b, max(1, int((self.sim.now - sent) * 1e9)),
                                   bool(self.queue[w]))
        self._try_push(w)

    def _on_pull(self, w: int, j: int, key: int, b: int) -> None:
        if self.L > 1:  # the broadcast: in priority order with the reduces (stage queues)
            self.bus_conn[w].send(b * (self.L - 1) / self.L, lambda: self._part_done(w, j),
                                  self.order_of[j] + (key,))
        else:
            self._part_done(w, j)

    def _part_done(self, w: int, j: int) -> None:
        self.left[w][j] -= 1
        if self.left[w][j] == 0:
            self.done[w][j] = self.sim.now
            self.on_tensor_done(w, j)

    # ------------------------------------------------------------------------- server --
    def _on_push(self, w: int, item: tuple) -> None:
        j, key, b, s = item
        srv = self.servers[s]
        self.sim.after(self.cl.latency, self._on_ack, w, item)
        if key not in srv.thread_of:
            t = min(range(len(srv.load)), key=lambda i: srv.load[i])
            srv.thread_of[key] = t
            srv.load[t] += b
        c = srv.count.get(key, 0)
        srv.count[key] = c + 1
        if c == 0:  # the first push of the round becomes the sum buffer: no copy
            self._summed(s, key, j, b)
            return
        t = srv.thread_of[key]
        dur = b / self.cl.sum_rate
        start = max(self.sim.now, srv.free_at[t])
        srv.free_at[t] = start + dur
        srv.busy[t] += dur
        self.sim.at(start + dur, self._summed, s, key, j, b)

    def _summed(self, s: int, key: int, j: int, b: int) -> None:
        srv = self.servers[s]
        srv.summed[key] = srv.summed.get(key, 0) + 1
        if srv.summed[key] < self.workers:
            return
        wire = b / self.sch.compression + HEADER_BYTES
        for w in range(self.workers):
            self.down[w][s].send(wire, lambda w=w: self._on_pull(w, j, key, b))

    # ---------------------------------------------------------------------- resources --
    def busy(self) -> Dict[str, float]:
        """Busy seconds per resource: every port, every server engine thread."""
        out = {p.name: p.busy_s for p in self.ports}
        for s in self.servers:
            for t, v in enumerate(s.busy):
                out[f"server {s.name} CPU (thread {t})"] = v
        return out
