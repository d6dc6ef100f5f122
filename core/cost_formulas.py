"""The α-β-γ costs of the synchronisation schemes, in closed form: the one definition that the
cost model (:mod:`byteps.cost_model`, which picks a scheme per tensor for ``BYTEPS_SYNC=auto``)
and the simulator (:mod:`byteps.sim`: ``collectives.bucket_time``, ``t_opt``) both use.

One synchronisation of a tensor of S bytes among n worker machines costs

    messages · α  +  wire · S · β  +  summed · S · γ     (seconds)

with α the latency of one message (s), β the time of one byte on one link direction (s/B,
1 / bandwidth) and γ the time to sum one byte (s/B). :class:`SchemeCost` holds the three
coefficients of a scheme (they depend on n and the scheme's shape, not on S), so a cost is
linear in S and the cheapest scheme changes only where two lines cross.

* ``ring`` (reduce-scatter + all-gather): ``2(n-1) α + 2(n-1)/n · S β + (n-1)/n · S γ``.
* ``tree`` (FlexTree, width w; w = 1 a binary tree, w = n the ring): reduce-scatter and
  all-gather inside groups of w machines, ``2(w-1) α + 2(w-1)/w · S β``, plus a pipelined binary
  tree across the G = ceil(n / w) groups on each S / w shard, ``2 ceil(log2 G) α + 2c · S/w β``
  with c = min(G - 1, 2) children per inner node; summed ``(w-1)/w + c/w`` (G > 1).
* ``hips`` (two-level PS, groups of g machines, G = ceil(n / g), a server on every machine; the
  simulator's model): ``4 α + (2(g-1)/g + 2(G-1)/(G g)) · S β + ((g-1)/g + (G-1)/(g G)) · S γ``;
  :func:`hips_servers` is byteps's placement (a first-level server per group on one link, T
  top-level servers): ``4 α + max(g + 1, G / T) · S β + ((g-1) + (G-1)/T) · S γ``, what the cost
  model uses when it knows the job's servers.
* ``ps`` (the summation service, n workers and k CPU-only servers beside the n colocated ones,
  docs/architecture.md §4): a push and its pull response, ``2 α``; on the wire the optimum
  ``t_opt = 2n(n-1) / (n² + kn - 2k) · S β`` (with k capped at n: more CPU servers than
  workers cannot beat one push and one pull of S per worker, ``S β``); summed: the busiest
  server's share of the bytes times the n - 1 additions (the first push costs no copy), shares
  from the weights ``2(n-1)`` (CPU-only) and ``max(n-k, 0)`` (colocated) of ``KeyPlanner``.

With n = 1 nothing crosses a network: every coefficient is 0. Units: seconds, bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The schemes, in the order that breaks ties (the summation service first: the default path).
SCHEMES = ("ps", "ring", "tree", "hips")


@dataclass(frozen=True)
class SchemeCost:
    """The coefficients of one scheme's cost ``messages·α + (wire·β + summed·γ)·S``.

    Attributes:
        scheme (str): one of :data:`SCHEMES`.
        messages (float): α terms on the critical path (messages sent one after another).
        wire (float): bytes on the busiest link direction per byte of the tensor (the β term).
        summed (float): bytes the busiest node sums per byte of the tensor (the γ term).
        nic (float): bytes each NIC direction of the busiest machine carries per byte of the
            tensor (``wire`` unless the scheme's critical path passes a link twice, as the
            tree's up and down passes do); the simulator's busy-time accounting.
    """

    scheme: str
    messages: float
    wire: float
    summed: float
    nic: float

    def seconds(self, nbytes: float, alpha: float, beta: float, gamma: float) -> float:
        """The cost of ``nbytes`` bytes, seconds (α s, β s/B, γ s/B)."""
        return self.messages * alpha + (self.wire * beta + self.summed * gamma) * float(nbytes)

    def latency_seconds(self, alpha: float) -> float:
        """The α part, seconds."""
        return self.messages * alpha

    def wire_seconds(self, nbytes: float, beta: float) -> float:
        """The β part, seconds."""
        return self.wire * float(nbytes) * beta

    def sum_seconds(self, nbytes: float, gamma: float) -> float:
        """The γ part, seconds."""
        return self.summed * float(nbytes) * gamma


def _none(scheme: str) -> SchemeCost:
    return SchemeCost(scheme, 0.0, 0.0, 0.0, 0.0)


def _check(n: int, what: str, lo: int = 1) -> int:
    from .errors import InvalidArgumentError

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
    divisor of n not above ceil(sqrt(n)) (``ResolveTreeWidth``)."""
    target = math.isqrt(n - 1) + 1 if n > 1 else 1  # ceil(sqrt(n))
    return max(d for d in range(1, target + 1) if n % d == 0)


def tree(n: int, width: int = 1) -> SchemeCost:
    """FlexTree all-reduce of width ``width`` among ``n`` machines (1: binary tree)."""
    n = _check(n, "tree: machines")
    if n == 1:
        return _none("tree")
    w = tree_width(n, width)
    groups = math.ceil(n / w)
    c = min(groups - 1, 2)
    messages = 2.0 * (w - 1)
    wire = 2.0 * (w - 1) / w
    summed = (w - 1) / w
    nic = 2.0 * (w - 1) / w
    if groups > 1:
        messages += 2.0 * math.ceil(math.log2(groups))
        wire += 2.0 * c / w
        summed += c / w
        nic += c / w
    return SchemeCost("tree", messages, wire, summed, nic)


def hips_group(n: int, group: int = 0) -> int:
    """The HiPS group size used for ``n`` machines: ``group`` (0: ``max(2, round(sqrt(n)))``)
    clipped to n."""
    g = int(group) if group else max(2, round(math.sqrt(n)))
    return max(1, min(g, n))


def hips(n: int, group: int = 0) -> SchemeCost:
    """Two-level hierarchical PS among ``n`` machines in groups of ``group`` (0: sqrt(n))."""
    n = _check(n, "hips: machines")
    if n == 1:
        return _none("hips")
    g = hips_group(n, group)
    G = math.ceil(n / g)
    wire = 2 * (g - 1) / g + 2 * (G - 1) / G / g
    summed = (g - 1) / g + (G - 1) / (g * G)
    return SchemeCost("hips", 4.0, wire, summed, wire)


def hips_servers(n: int, group: int, servers: int) -> SchemeCost:
    """HiPS as byteps runs it (docs/schemes.md): G = ceil(n / g) first-level servers, server i
    summing group i's g pushes on its own link, and T = ``servers`` - G top-level ones over
    which the partitions spread: a first-level server's link carries g pushes in and the total
    back (``(g + 1)·S`` each way), a top-level server's ``G·S / T``; it sums ``(g - 1)·S`` and
    ``(G - 1)·S / T``. 4 messages (push, up, down, pull). :func:`hips` is the simulator's model
    (a server on every machine), cheaper by about g.

    Raises:
        byteps.errors.InvalidArgumentError: fewer than G + 1 servers, a count out of range.
    """
    n = _check(n, "hips: machines")
    if n == 1:
        return _none("hips")
    g = hips_group(n, group)
    G = math.ceil(n / g)
    top = _check(servers, "hips: servers", G + 1) - G
    wire = max(g + 1.0, G / top)
    return SchemeCost("hips", 4.0, wire, (g - 1) + (G - 1) / top, wire)


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
    return SchemeCost("ps", 2.0, wire, summed, wire)


def scheme_cost(scheme: str, n: int, k: int = 0, width: int = 1, group: int = 0) -> SchemeCost:
    """The :class:`SchemeCost` of ``scheme`` (one of :data:`SCHEMES`) for ``n`` worker
    machines, ``k`` CPU-only servers (``ps``), tree width ``width``, HiPS group ``group``.

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
    from .errors import InvalidArgumentError

    raise InvalidArgumentError(f"unknown scheme {scheme!r}: one of {', '.join(SCHEMES)}")


def t_opt(n: int, k: int, nbytes: float, bandwidth: float) -> float:
    """The summation service's communication optimum ``2n(n-1) M / ((n² + kn - 2k) B)``,
    seconds, for M = ``nbytes`` at ``bandwidth`` B bytes/s (docs/architecture.md §4,
    ``OptimalCommTime``; k capped at n)."""
    if n < 2:
        return 0.0
    return ps(n, k).wire_seconds(nbytes, 1.0 / bandwidth)
