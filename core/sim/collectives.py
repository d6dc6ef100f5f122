"""The all-reduce schemes (``ring``, ``tree``, ``hips``), simulated operation by operation.

Gradients are fused into buckets in the order the backward pass produces them (``bucket_bytes``,
torch DDP's 25 MiB by default); a bucket starts when its last gradient is ready and the
previous bucket has finished (one collective at a time, as NCCL's stream and Horovod's
background thread run them). A bucket of S bytes takes, on n machines with NIC bandwidth B,
per-message latency α and L GPUs per machine (the α-β-γ model, defined once in
:mod:`byteps.sync.cost_formulas`, which the cost model of ``BYTEPS_SYNC=auto`` uses too), with b the
bytes of its first partition (byteps's partition rule, ``Scheme.partition_bytes``):

* local phases, L > 1 (hierarchical all-reduce): reduce-scatter and all-gather inside the
  machine, ``2 (L-1)/L · S / gpu_bus``;
* ``ring``: ``2(n-1) α + 2(n-1)/n · S / B`` (reduce-scatter + all-gather among the machines);
* ``tree`` (byteps's FlexTree, width w, G = n / w groups): its partitions pipelined through a
  ring inside each group and a binary heap across the groups, so the busiest link sets the
  time: ``(2(w-1) + 2 floor(log2 G)) α + (2(w-1) + d)/w · S / B + fill · b / B``, d the heap's
  largest degree (1 for G = 2, 2 for G = 3 or 4, 3 beyond), the fill the first partition's
  trip up and down the heap (``cost_formulas.tree``);
* ``hips`` (two-level PS, groups of g machines, G = ceil(n / g)) as byteps places its servers:
  the job's servers (:func:`hips_hosts`: the cluster's CPU machines, then one on every worker
  machine when there are fewer CPU machines than worker machines), ranks 0..G-1 the first level
  (server i for group i), the rest the top level: ``4 α + wire · S / B + fill · b / B`` with
  wire the busiest link's bytes per byte (``cost_formulas.hips_placed``: 3 at n = 4 on CPU
  machines of their own, 4 with the servers on the worker machines, where first-level server
  1 serves machines 2 and 3 from machine 1), plus the servers' summation
  ``((g-1) + (G-1)/T) · S / (threads · γ)``.

The CPU machines carry only HiPS's servers; summation on the GPU is taken as free. Busy time is
charged to every worker machine's NIC ports (the busiest machine's bytes) and to the engine
itself (its buckets' total time: what bounds an all-reduce whose buckets run back to back).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from .._core import partition_bound, tensor_partition_bound
from ..sync import cost_formulas
from .network import Port, Sim


def hips_hosts(cluster) -> List[Optional[int]]:
    """Where byteps's HiPS servers run on ``cluster``, by server rank: None for a CPU machine,
    else the worker machine. The servers are the job's (``bpslaunch`` and the emulated
    cluster: one per CPU machine and, with fewer CPU machines than worker machines, one on
    every worker machine); byteps ranks them by host address and port, which on the emulated
    cluster puts the CPU machines first and the worker machines in order."""
    n, k = cluster.machines, cluster.cpu_machines
    return [None] * k + (list(range(n)) if k < n else [])


def scheme_cost(scheme, cluster) -> cost_formulas.SchemeCost:
    """The :class:`byteps.sync.cost_formulas.SchemeCost` of an all-reduce ``scheme`` on
    ``cluster`` (``hips``: byteps's placement, :func:`hips_hosts`).

    Raises:
        byteps.errors.InvalidArgumentError: HiPS without the G + 1 servers it needs.
    """
    n = cluster.machines
    if scheme.name == "hips" and n > 1:
        return cost_formulas.hips_placed(n, scheme.hips_group, hips_hosts(cluster))
    return cost_formulas.scheme_cost(scheme.name, n, width=scheme.tree_width or 1,
                                     group=scheme.hips_group)


def bucket_time(scheme, cluster, nbytes: float) -> Dict[str, float]:
    """Seconds of one bucket of ``nbytes`` bytes: ``{"total", "net", "local", "sum"}`` and
    the bytes each NIC direction carries (``"nic_bytes"``, the busiest machine's).

    The network and summation terms are :func:`scheme_cost`'s (the cost model's definition)
    with β = 1 / bandwidth, the fill paid on the bucket's first partition (the core's bound of
    an S-byte tensor under ``scheme.partition_bytes``); summation on the GPU is free (γ = 0)
    for ``ring`` and ``tree``, and ``hips`` sums on the servers' CPUs at
    γ = 1 / (server_threads · sum_rate)."""
    n, L, B, a = cluster.machines, cluster.gpus_per_machine, cluster.bandwidth, cluster.latency
    S = float(nbytes)
    local = 2 * (L - 1) / L * S / cluster.gpu_bus_bandwidth if L > 1 else 0.0
    net = nic = summ = 0.0
    if n > 1 and scheme.name in ("ring", "tree", "hips"):
        cost = scheme_cost(scheme, cluster)
        gamma = 1.0 / (cluster.server_threads * cluster.sum_rate) if scheme.name == "hips" \
            else 0.0
        first = min(S, tensor_partition_bound(int(S), partition_bound(scheme.partition_bytes, L),
                                              n, L))
        net = cost.latency_seconds(a) + cost.wire_seconds(S, 1.0 / B) + \
            cost.fill_seconds(first, 1.0 / B)
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
