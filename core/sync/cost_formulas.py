"""The α-β-γ costs of the synchronisation schemes, in closed form: the one definition that the
cost model (:mod:`byteps.cost_model`, which picks a scheme per tensor for ``BYTEPS_SYNC=auto``)
and the simulator (:mod:`byteps.sim`: ``collectives.bucket_time``, ``t_opt``) both use.

One synchronisation of a tensor of S bytes among n worker machines costs

    messages · α  +  wire · S · β  +  summed · S · γ  +  fill · b · β     (seconds)

with α the latency of one message (s), β the time of one byte on one link direction (s/B,
1 / bandwidth), γ the time to sum one byte (s/B) and b = min(S, the core's partition of the
tensor) the bytes of its first partition. The partitions of a tensor pipeline: ``wire`` is what
the busiest link direction carries, ``messages`` and ``fill`` what the first partition's path
adds before the pipeline is full. :class:`SchemeCost` holds the coefficients of a scheme (they
depend on n and the scheme's shape, not on S), so a cost is linear in S wherever b is.

* ``ring`` (reduce-scatter + all-gather): ``2(n-1) α + 2(n-1)/n · S β + (n-1)/n · S γ``; a
  chunk is forwarded as it arrives: no fill.
* ``tree`` (FlexTree, width w; w = 1 a binary tree, w = n the ring; G = n / w groups): the
  core's program (``BuildCollProgram``) for one partition is a ring reduce-scatter inside the
  group, a binary heap across the groups on the member's S / w chunk (up to the root, back
  down) and a ring all-gather. Busiest link direction: ``2(w-1)/w + d/w`` with d the heap's
  largest degree (parent + children: 1 for G = 2, 2 for G = 3 or 4, 3 from G = 5);
  ``2(w-1) + 2 floor(log2 G)`` messages (the deepest heap node's depth up and down); summed
  ``(w-1)/w + c/w``, c = min(G - 1, 2) children; fill: the first partition's path (each link
  carrying its chunks one after another, :func:`tree_pass`) less its share of the busiest
  link.
* ``hips`` (two-level PS in groups of g, G = ceil(n / g)): :func:`hips_placed` is byteps's
  placement for any server order (server i < G the first level of group i, the others the top
  level, traffic between a worker and a server on its own machine off the link);
  :func:`hips_servers` its closed form with every server on a host of its own,
  ``4 α + max(g + 1, G / T) · S β + ((g-1) + (G-1)/T) · S γ``, T = servers - G top-level
  servers; :func:`hips` the paper's placement, a server on every machine,
  ``4 α + (2(g-1)/g + 2(G-1)/(G g)) · S β + ((g-1)/g + (G-1)/(g G)) · S γ`` (the cost
  model's, when it does not know the job's servers). Fill: the first partition's path through
  both levels less its share of the busiest link.
* ``ps`` (the summation service, n workers and k CPU-only servers beside the n colocated ones,
  docs/architecture.md §4): a push and its pull response, ``2 α``; on the wire the optimum
  ``t_opt = 2n(n-1) / (n² + kn - 2k) · S β`` (with k capped at n: more CPU servers than
  workers cannot beat one push and one pull of S per worker, ``S β``); summed: the busiest
  server's share of the bytes times the n - 1 additions (the first push costs no copy), shares
  from the weights ``2(n-1)`` (CPU-only) and ``max(n-k, 0)`` (colocated) of ``KeyPlanner``;
  fill: one partition through the server.

With n = 1 nothing crosses a network: every coefficient is 0. Units: seconds, bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from .. import _core
from ..errors import InvalidArgumentError

#: The schemes, in the order that breaks ties (the summation service first: the default path).
SCHEMES = ("ps", "ring", "tree", "hips")


@dataclass(frozen=True)
class SchemeCost:
    """The coefficients of one scheme's cost ``messages·α + (wire·β + summed·γ)·S + fill·β·b``
    (b: the bytes of the tensor's first partition).

    Attributes:
        scheme (str): one of :data:`SCHEMES`.
        messages (float): α terms on the critical path (messages sent one after another by
            the first partition).
        wire (float): bytes on the busiest link direction per byte of the tensor (the β term;
            the tensor's partitions pipeline through it).
        summed (float): bytes the busiest node sums per byte of the tensor (the γ term).
        nic (float): bytes each NIC direction of the busiest machine carries per byte of the
            tensor; the simulator's busy-time accounting (``wire``).
        fill (float): the pipeline fill, bytes per byte of the first partition: what its path
            takes on the wire beyond its share ``wire`` of the busiest link (ps: one partition
            through a server, ``wire``; hips: both levels; the tree: up and down its heap; the
            ring: none).
    """

    scheme: str
    messages: float
    wire: float
    summed: float
    nic: float
    fill: float = 0.0

    def seconds(self, nbytes: float, alpha: float, beta: float, gamma: float,
                first_partition: float = 0.0) -> float:
        """The cost of ``nbytes`` bytes whose first partition is ``first_partition`` bytes,
        seconds (α s, β s/B, γ s/B; ``first_partition`` 0: without the fill)."""
        return self.messages * alpha + (self.wire * beta + self.summed * gamma) * float(nbytes) \
            + self.fill_seconds(first_partition, beta)

    def latency_seconds(self, alpha: float) -> float:
        """The α part, seconds."""
        return self.messages * alpha

    def wire_seconds(self, nbytes: float, beta: float) -> float:
        """The β part without the fill, seconds."""
        return self.wire * float(nbytes) * beta

    def sum_seconds(self, nbytes: float, gamma: float) -> float:
        """The γ part, seconds."""
        return self.summed * float(nbytes) * gamma

    def fill_seconds(self, first_partition: float, beta: float) -> float:
        """The pipeline fill of a tensor whose first partition is ``first_partition`` bytes,
        seconds."""
        return self.fill * float(first_partition) * beta


def _none(scheme: str) -> SchemeCost:
    return SchemeCost(scheme, 0.0, 0.0, 0.0, 0.0)


def _check(n: int, what: str, lo: int = 1) -> int:
    if isinstance(n, bool) or int(n) != n or n < lo:
        raise InvalidArgumentError(f"{what} must be an integer >= {lo}, got {n!r}")
    return int(n)


def ring(n: int) -> SchemeCost:
    """Ring all-reduce among ``n`` machines."""
    n = _check(n, "ring: machines")
    if n == 1:
        return _none("ring")
    f = (n - 1) / n
    return SchemeCost("ring", 2.0 * (n - 1), 2.0 * f, f, 2.0 * f)


def tree_width(n: int, width: int) -> int:
    """The FlexTree width used for ``n`` machines: ``width`` clipped to [1, n]."""
    return max(1, min(int(width or 1), n))


def default_tree_width(n: int) -> int:
    """The core's FlexTree width for ``n`` machines when ``BYTEPS_TREE_WIDTH`` is 0: the largest
    divisor of n not above ceil(sqrt(n)) (``byteps._core.tree_width``, ``ResolveTreeWidth``)."""
    return int(_core.tree_width(int(n), 0))


def _heap_children(g: int, groups: int) -> list:
    """The children of group ``g`` in the core's heap across ``groups`` groups (root 0)."""
    return [c for c in (2 * g + 1, 2 * g + 2) if c < groups]


def tree_degree(groups: int) -> int:
    """The largest number of heap neighbours (parent and children) of a group among
    ``groups``: the chunks a machine sends (and receives) in the tree's up and down passes."""
    return max((g > 0) + len(_heap_children(g, groups)) for g in range(groups))


def tree_depth(groups: int) -> int:
    """Levels below the root of the heap of ``groups`` groups: floor(log2 groups)."""
    return max(int(groups), 1).bit_length() - 1


def tree_pass(groups: int) -> int:
    """Chunk times of one partition's up and down passes through the heap of ``groups``
    groups, alone on the network: a parent receives its children's chunks one after another
    (in the order they are ready) and sends its sum up once both are in; down, it sends the
    total to its children one after another, in the program's order. The time the last
    machine has the total, in units of one chunk's time on a link."""
    up = [0] * groups
    for g in reversed(range(groups)):
        t = 0
        for r in sorted(up[c] for c in _heap_children(g, groups)):
            t = max(t, r) + 1
        up[g] = t
    down = [0] * groups
    down[0] = up[0]
    for g in range(groups):
        t = down[g]
        for c in _heap_children(g, groups):
            t += 1
            down[c] = t
    return max(down)


def tree(n: int, width: int = 1) -> SchemeCost:
    """FlexTree all-reduce of width ``width`` among ``n`` machines (1: binary tree), as the
    core's program runs it (``BuildCollProgram``): partitions pipelined through the group's
    ring and the heap across the groups, so the β term is the busiest link's bytes (every
    machine sends and receives the same: ``2(w-1)/w`` in the group, one chunk of S / w per
    heap neighbour)."""
    n = _check(n, "tree: machines")
    if n == 1:
        return _none("tree")
    w = tree_width(n, width)
    groups = math.ceil(n / w)
    c = min(groups - 1, 2)
    wire = (2.0 * (w - 1) + tree_degree(groups)) / w
    path = (2.0 * (w - 1) + tree_pass(groups)) / w
    messages = 2.0 * (w - 1) + 2.0 * tree_depth(groups)
    summed = (w - 1 + c) / w
    return SchemeCost("tree", messages, wire, summed, wire, path - wire)


def hips_group(n: int, group: int = 0) -> int:
    """The HiPS group size the core uses for ``n`` machines: ``group`` (``BYTEPS_HIPS_GROUP``)
    at most n, or for 0 ``ceil(sqrt(n))`` (``byteps._core.hips_group_size``,
    ``HipsGroupSize``)."""
    return int(_core.hips_group_size(int(n), int(group or 0)))


def hips(n: int, group: int = 0) -> SchemeCost:
    """Two-level hierarchical PS among ``n`` machines in groups of ``group`` (0: sqrt(n)) as the
    paper places it: a server on every machine, each summing 1/g of its group's bytes. byteps
    places one first-level server per group (:func:`hips_placed`, :func:`hips_servers`),
    whose link carries about g times these bytes; the cost model uses this one only when it
    does not know the job's servers."""
    n = _check(n, "hips: machines")
    if n == 1:
        return _none("hips")
    g = hips_group(n, group)
    G = math.ceil(n / g)
    wire = 2 * (g - 1) / g + 2 * (G - 1) / G / g
    summed = (g - 1) / g + (G - 1) / (g * G)
    return SchemeCost("hips", 4.0, wire, summed, wire, 2.0 * wire)


def _hips_levels(n: int, group: int, servers: int) -> tuple:
    """(g, G, T) of byteps's HiPS with ``servers`` servers in all.

    Raises:
        byteps.errors.InvalidArgumentError: fewer than G + 1 servers, a count out of range.
    """
    g = hips_group(n, group)
    G = math.ceil(n / g)
    return g, G, _check(servers, "hips: servers", G + 1) - G


def hips_placed(n: int, group: int, hosts: Sequence[Optional[int]]) -> SchemeCost:
    """HiPS as byteps runs it, with its servers where ``hosts`` puts them: ``hosts[r]`` is the
    worker machine server rank r shares a host with, or None for a host of its own. Servers
    0..G-1 (G = ceil(n / g)) are the first level, server i serving group i (machines
    i·g .. i·g + g - 1): their pushes in, the group's sum up to the top level, the total back
    and their pulls out; the other T servers are the top level, each summing 1/T of the
    partitions' G group sums. ``wire`` (= ``nic``) is the busiest link direction's bytes per
    byte of the tensor (traffic between a worker and a server on its own machine stays off
    the link); summed ``(g - 1) + (G - 1)/T``; 4 messages (push, up, down, pull); fill: the
    first partition's path through both levels (:func:`_hips_path`) less ``wire``.

    Raises:
        byteps.errors.InvalidArgumentError: fewer than G + 1 servers, a machine out of range.
    """
    n = _check(n, "hips: machines")
    hosts = list(hosts)
    if n == 1:
        return _none("hips")
    g, G, top = _hips_levels(n, group, len(hosts))
    if any(h is not None and (isinstance(h, bool) or h != int(h) or not 0 <= h < n)
           for h in hosts):
        raise InvalidArgumentError(f"hips: a server's machine must be None or in [0, {n}), "
                                   f"got {hosts!r}")
    where = [("machine", int(h)) if h is not None else ("server", r)
             for r, h in enumerate(hosts)]
    tx: Dict[tuple, float] = {}
    rx: Dict[tuple, float] = {}

    def move(src: tuple, dst: tuple, nbytes: float) -> None:
        if src != dst:
            tx[src] = tx.get(src, 0.0) + nbytes
            rx[dst] = rx.get(dst, 0.0) + nbytes

    for i in range(n):  # push and pull
        move(("machine", i), where[i // g], 1.0)
        move(where[i // g], ("machine", i), 1.0)
    for j in range(G):  # the group sum up, the total back, 1/T to and from each top server
        for t in range(G, G + top):
            move(where[j], where[t], 1.0 / top)
            move(where[t], where[j], 1.0 / top)
    wire = max(max(tx.values()), max(rx.values()))
    return SchemeCost("hips", 4.0, wire, (g - 1) + (G - 1) / top, wire,
                      _hips_path(n, g, G, where) - wire)


def _hips_path(n: int, g: int, G: int, where: Sequence[tuple]) -> float:
    """One partition alone through byteps's HiPS (top-level server G), in units of its time on
    a link: the first-level servers receive their groups' pushes one after another, the top
    server their sums one after another as they are ready, sends the total back to them in
    order, and each sends its group's pulls one after another; a message between a machine and
    a server on it takes no link time."""
    def hops(src: tuple, dsts: Sequence[tuple]) -> int:
        return sum(src != d for d in dsts)

    members = [[("machine", i) for i in range(j * g, min(n, (j + 1) * g))] for j in range(G)]
    pushed = [sum(hops(m, [where[j]]) for m in members[j]) for j in range(G)]
    t = 0
    for j in sorted(range(G), key=lambda j: pushed[j]):  # the sums into the top server
        t = max(t, pushed[j]) + hops(where[j], [where[G]])
    end = 0
    for j in range(G):  # the total back, then the pulls
        t += hops(where[G], [where[j]])
        end = max(end, t + hops(where[j], members[j]))
    return float(end)


def hips_servers(n: int, group: int, servers: int) -> SchemeCost:
    """HiPS as byteps runs it with each of its ``servers`` servers on a host of its own
    (:func:`hips_placed` with every host None): G = ceil(n / g) first-level servers, server i
    summing group i's g pushes on its own link, and T = ``servers`` - G top-level ones over
    which the partitions spread: a first-level server's link carries g pushes in and the total
    back (``wire = max(g + 1, G / T)``: ``(g + 1)·S`` each way, a top-level server's
    ``G·S / T``); it sums ``(g - 1)·S`` and ``(G - 1)·S / T``. 4 messages (push, up, down,
    pull); the first partition's path ``2g + 2G`` partitions' times (full groups).

    Raises:
        byteps.errors.InvalidArgumentError: fewer than G + 1 servers, a count out of range.
    """
    n = _check(n, "hips: machines")
    if n == 1:
        return _none("hips")
    return hips_placed(n, group, [None] * _check(servers, "hips: servers", 1))


def ps_shares(n: int, k: int) -> tuple:
    """(share of one CPU-only server, share of one colocated server) of the bytes, from
    ``KeyPlanner``'s weights ``2(n-1)`` and ``max(n-k, 0)`` (n colocated servers, k CPU-only)."""
    wc, wl = 2.0 * max(n - 1, 0), float(max(n - k, 0))
    total = k * wc + n * wl
    if total <= 0:
        return (1.0 / k if k else 0.0), 1.0 / n
    return wc / total, wl / total


def ps(n: int, k: int = 0) -> SchemeCost:
    """The summation service with ``n`` worker machines and ``k`` CPU-only servers."""
    n = _check(n, "ps: worker machines")
    k = _check(k, "ps: CPU-only servers", 0)
    if n == 1:
        return _none("ps")
    kk = min(k, n)
    wire = 2.0 * n * (n - 1) / (n * n + kk * n - 2 * kk)
    cpu, colocated = ps_shares(n, k)
    summed = (n - 1) * max(cpu if k else 0.0, colocated)
    return SchemeCost("ps", 2.0, wire, summed, wire, wire)


def scheme_cost(scheme: str, n: int, k: int = 0, width: int = 1, group: int = 0) -> SchemeCost:
    """The :class:`SchemeCost` of ``scheme`` (one of :data:`SCHEMES`) for ``n`` worker
    machines, ``k`` CPU-only servers (``ps``), tree width ``width``, HiPS group ``group``
    (``hips``: :func:`hips`, the paper's placement; byteps's needs the servers,
    :func:`hips_placed`).

    Raises:
        byteps.errors.InvalidArgumentError: an unknown scheme or a count out of range.
    """
    if scheme == "ps":
        return ps(n, k)
    if scheme == "ring":
        return ring(n)
    if scheme == "tree":
        return tree(n, width)
    if scheme == "hips":
        return hips(n, group)
    raise InvalidArgumentError(f"unknown scheme {scheme!r}: one of {', '.join(SCHEMES)}")


def t_opt(n: int, k: int, nbytes: float, bandwidth: float) -> float:
    """The summation service's communication optimum ``2n(n-1) M / ((n² + kn - 2k) B)``,
    seconds, for M = ``nbytes`` at ``bandwidth`` B bytes/s (docs/architecture.md §4,
    ``OptimalCommTime``; k capped at n)."""
    if n < 2:
        return 0.0
    return ps(n, k).wire_seconds(nbytes, 1.0 / bandwidth)
