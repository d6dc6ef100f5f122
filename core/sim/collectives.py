"""The all-reduce schemes (``ring``, ``tree``, ``hips``), simulated operation by operation.

Gradients are fused into buckets in the order the backward pass produces them (``bucket_bytes``,
torch DDP's 25 MiB by default); a bucket starts when its last gradient is ready and the
previous bucket has finished (one collective at a time, as NCCL's stream and Horovod's
background thread run them). A bucket of S bytes takes, on n machines with NIC bandwidth B,
per-message latency α and L GPUs per machine (the α-β-γ model, defined once in
:mod:`byteps.cost_formulas`, which the cost model of ``BYTEPS_SYNC=auto`` uses too):

* local phases, L > 1 (hierarchical all-reduce): reduce-scatter and all-gather inside the
  machine, ``2 (L-1)/L · S / gpu_bus``;
* ``ring``: ``2(n-1) α + 2(n-1)/n · S / B`` (reduce-scatter + all-gather among the machines);
* ``tree`` (FlexTree-style, width w): reduce-scatter and all-gather inside groups of w
  machines, ``2(w-1) α + 2(w-1)/w · S / B``, plus a pipelined binary tree across the
  g = ceil(n / w) groups on each S / w shard, ``2 ceil(log2 g) α + 2 c · S / (w B)`` with
  c = min(g - 1, 2) children per inner node (w = 1: a plain binary tree, w = n: the ring);
* ``hips`` (two-level hierarchical PS, groups of g machines, G = ceil(n / g) groups, a server
  colocated on every machine): ``4 α + 2(g-1)/g · S / B + 2(G-1)/G · S / (g B)`` plus the
  servers' summation ``((g-1)/g + (G-1)/(g G)) · S / (threads · γ)``.

The CPU machines are not used by these schemes; summation on the GPU is taken as free.
Busy time is charged to every machine's NIC ports (bytes / B) and to the engine itself (its
buckets' total time: what bounds an all-reduce whose buckets run back to back).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from .. import cost_formulas
from .network import Port, Sim


def bucket_time(scheme, cluster, nbytes: float) -> Dict[str, float]:
    """Seconds of one bucket of ``nbytes`` bytes: ``{"total", "net", "local", "sum"}`` and
    the bytes each NIC direction carries (``"nic_bytes"``, the busiest machine's).

    The network and summation terms are :mod:`byteps.cost_formulas`' (the cost model's
    definition) with β = 1 / bandwidth; summation on the GPU is free (γ = 0) for ``ring`` and
    ``tree``, and ``hips`` sums on the servers' CPUs at γ = 1 / (server_threads · sum_rate)."""
    n, L, B, a = cluster.machines, cluster.gpus_per_machine, cluster.bandwidth, cluster.latency
    S = float(nbytes)
    local = 2 * (L - 1) / L * S / cluster.gpu_bus_bandwidth if L > 1 else 0.0
    net = nic = summ = 0.0
    if n > 1 and scheme.name in ("ring", "tree", "hips"):
        cost = cost_formulas.scheme_cost(scheme.name, n, width=scheme.tree_width or 1,
                                         group=scheme.hips_group)
        gamma = 1.0 / (cluster.server_threads * cluster.sum_rate) if scheme.name == "hips" \
            else 0.0
        net = cost.latency_seconds(a) + cost.wire_seconds(S, 1.0 / B)
        nic = cost.nic * S
        summ = cost.sum_seconds(S, gamma)
    return {"total": local + net + summ, "net": net, "local": local, "sum": summ,
            "nic_bytes": nic}


class CollectiveBackend:
    """One iteration of an all-reduce scheme: ``submit(j)`` when tensor ``j`` is ready;
    ``done[w][j]`` gets the time its bucket finished (the same on every machine)."""

    def __init__(self, sim: Sim, cluster, scheme, sizes: Sequence[int],
                 backward_order: Sequence[int]):
        self.sim, self.cl, self.sch = sim, cluster, scheme
        n = cluster.machines
        self.done: List[List[Optional[float]]] = [[None] * len(sizes) for _ in range(n)]
        self.bucket_of: Dict[int, int] = {}
        self.buckets: List[List[int]] = []
        cur: List[int] = []
        acc = 0
        for j in backward_order:
            cur.append(j)
            acc += sizes[j]
            if acc >= scheme.bucket_bytes:
                self.buckets.append(cur)
                cur, acc = [], 0
        if cur:
            self.buckets.append(cur)
        for b, js in enumerate(self.buckets):
            for j in js:
                self.bucket_of[j] = b
        self.sizes = list(sizes)
        self.missing = [len(js) for js in self.buckets]
        self.ready: List[int] = []
        self.running = False
        self.ports = [Port(f"w{i}.{d}", cluster.bandwidth) for i in range(n) for d in ("tx", "rx")]
        self.bus = [Port(f"w{i}.gpu-bus", cluster.gpu_bus_bandwidth) for i in range(n)] \
            if cluster.gpus_per_machine > 1 else []
        self.engine_busy = 0.0
        self.sum_busy = 0.0
        self.latency_s = bucket_time(scheme, cluster, 0.0)["net"]  # the α terms of a bucket
        self.split = dict.fromkeys(("NIC", "GPU bus", "latency", "summation"), 0.0)
        self.on_tensor_done: Callable[[int, int], None] = lambda w, j: None

    def submit(self, j: int) -> None:
        b = self.bucket_of[j]
        self.missing[b] -= 1
        if self.missing[b] == 0:
            self.ready.append(b)
            self._next()

    def _next(self) -> None:
        if self.running or not self.ready:
            return
        b = self.ready.pop(0)
        S = sum(self.sizes[j] for j in self.buckets[b])
        c = bucket_time(self.sch, self.cl, S)
        for p in self.ports:
            p.bytes += c["nic_bytes"]
        for p in self.bus:
            p.bytes += c["local"] * p.capacity
        self.engine_busy += c["total"]
        self.sum_busy += c["sum"]
        lat = self.latency_s
        self.split["NIC"] += c["net"] - lat
        self.split["latency"] += lat
        self.split["GPU bus"] += c["local"]
        self.split["summation"] += c["sum"]
        self.running = True
        self.sim.after(c["total"], self._finished, b)

    def _finished(self, b: int) -> None:
        self.running = False
        for j in self.buckets[b]:
            for w in range(len(self.done)):
                self.done[w][j] = self.sim.now
                self.on_tensor_done(w, j)
        self._next()

    def busy(self) -> Dict[str, float]:
        """Busy seconds per resource (NIC ports, GPU buses, the servers' summation)."""
        out = {p.name: p.busy_s for p in self.ports + self.bus}
        if self.engine_busy:
            parts = ", ".join(f"{k} {100 * v / self.engine_busy:.0f} %"
                              for k, v in self.split.items() if v > 0)
            out[f"{self.sch.name} all-reduce, one bucket at a time ({parts})"] = \
                self.engine_busy
        if self.sum_busy:
            out["every server's CPU (summation)"] = self.sum_busy
        return out
