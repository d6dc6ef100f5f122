"""The summation service simulated with one representative worker: the symmetric model.

The message-by-message model (:mod:`byteps.sim.ps_sim`) moves ``2 n`` messages per partition
through a network of ``2 (n + k)`` ports, and each message start or end recomputes the max-min
rates of every path in flight: its cost grows as n^4 (the partition count per tensor grows
with n, ``b / (32 n)``). Every worker machine is alike, though, and the staggered push order
(``StaggeredPushPosition``) spreads what the workers push at one moment over the servers.
This model takes that spreading as perfect and simulates **worker 0 alone**, message by
message, on a network of five ports that each stand for every machine of a kind:

* ``worker NICs (tx)`` / ``worker NICs (rx)``: one worker machine's NIC. Worker 0's push to a
  server colocated on another worker machine crosses its own tx and, standing for the
  machine that receives it, the worker rx (each worker machine receives, on average, what
  each one sends to the colocated servers); pulls alike in the other direction.
* ``CPU machines' NICs (tx)`` / ``(rx)``: one CPU machine's NIC; worker 0's flow to a CPU
  machine's server counts ``n / k`` times there (n workers share k CPU machines).
* ``worker loopback`` and ``worker GPU bus``: worker 0's own (its own colocated server's keys
  go over the loopback, as in the full model).

Everything else is the full model's: the core's partition rule, ``KeyPlanner`` placement over
the n + k real servers (each key's server decides which ports worker 0's push and pull use),
priority + credit or FIFO, the header bytes, compression, the GPU bus stages. A key is summed
when worker 0's push has arrived (every worker's push of it, by symmetry); the server's
engine thread does the ``n - 1`` additions from the moment that push started to arrive (the
first copies arrive while it is on the wire) and the last one after it arrived.

What this leaves out: the lag of the staggered pushes (a key is complete when its last
worker's push arrives: for a tensor of P partitions, n - 1 of the P keys are complete only at
the tensor's end) and the transient imbalance of one small tensor on one server (its n pushes
arrive together there). ``docs/simulator.md`` compares both models (within a few per cent at
4-16 machines); ``simulate(method="auto")`` uses this one from 16 worker machines up.
"""

from __future__ import annotations

from typing import List

from .network import Conn, PriorityConn
from .ps_sim import HEADER_BYTES, PSBackend


class SymmetricPSBackend(PSBackend):
    """``byteps`` with one representative worker (module docstring). ``done[0][j]``: when
    every worker has tensor ``j``'s sum."""

    def __init__(self, sim, cluster, scheme, sizes, priorities):
        from ..errors import InvalidArgumentError

        if scheme.name != "byteps":
            raise InvalidArgumentError("the symmetric model is for the byteps scheme only "
                                       "(a native PS places whole tensors: not symmetric)")
        super().__init__(sim, cluster, scheme, sizes, priorities)
        self.need: dict = {}  # tensor -> per partition: pushes of worker 0 still awaited

    def _network(self, names: List[str]) -> None:
        cl, sim, n, k, lat = self.cl, self.sim, self.n, self.cl.cpu_machines, self.cl.latency
        self.workers = 1
        wtx = self._nic("worker NICs (tx)")
        wrx = self._nic("worker NICs (rx)")
        if k:
            ctx = self._nic("CPU machines' NICs (tx)")
            crx = self._nic("CPU machines' NICs (rx)")
        loop = self._port("worker loopback", cl.local_bandwidth)
        if self.L > 1:
            self.bus_conn = [PriorityConn(sim, self._port("worker GPU bus",
                                                          cl.gpu_bus_bandwidth), None, 0.0)]
        ups, downs = [], []
        for s in self.servers:
            if s.machine == 0:  # worker 0's own colocated server
                ups.append(Conn(sim, loop, None, 0.0))
                downs.append(Conn(sim, loop, None, 0.0))
            elif s.machine < n:  # a colocated server on another worker machine
                ups.append(Conn(sim, wtx, wrx, lat))
                downs.append(Conn(sim, wtx, wrx, lat))
            else:  # a CPU machine: n workers' flows share k machines
                ups.append(Conn(sim, wtx, crx, lat, dst_weight=n / k))
                downs.append(Conn(sim, ctx, wrx, lat, src_weight=n / k))
        self.up, self.down = [ups], [downs]

    def submit(self, j: int) -> None:
        super().submit(j)
        if j in self.parts:
            P = len(self.parts[j])
            self.need[j] = [min(self.n, P)] * P

    def _on_push(self, w: int, item: tuple) -> None:
        """Worker 0's push of partition q arrived. Worker v pushes partition i at its step
        (i - v) mod P, when worker 0 pushes partition (i - v) mod P: key i is complete once
        worker 0's pushes of partitions i, i-1, ..., i-n+1 (mod P) have all arrived."""
        j, key, b, s = item
        self.sim.after(self.cl.latency, self._on_ack, w, item)
        parts, need = self.parts[j], self.need[j]
        P = len(parts)
        q = key - parts[0][0]
        for d in range(min(self.n, P)):
            i = (q + d) % P
            need[i] -= 1
            if need[i] == 0:
                self._complete(j, parts[i])

    def _complete(self, j: int, part: tuple) -> None:
        """Every worker's push of ``part`` is in: the server's engine thread has summed the
        first n - 1 while they arrived (from one push time before now, at the earliest) and
        sums the last now."""
        key, b, s = part
        srv = self.servers[s]
        if key not in srv.thread_of:
            t = min(range(len(srv.load)), key=lambda i: srv.load[i])
            srv.thread_of[key] = t
            srv.load[t] += b
        t = srv.thread_of[key]
        one = b / self.cl.sum_rate
        work = (self.n - 1) * one
        wire = b / self.sch.compression + HEADER_BYTES
        began = self.sim.now - wire / self.cl.bandwidth
        start = max(began, srv.free_at[t])
        end = max(start + work, self.sim.now + one)
        srv.free_at[t] = end
        srv.busy[t] += work
        self.sim.at(end, self._summed, s, key, j, b)
