"""PipeDream's partitioner (Narayanan et al., SOSP 2019, §3.1): dynamic programming over layers,
stages and replication factors.

Given each layer's compute time, output (activation) bytes and parameter bytes
(:mod:`.profiler`), the number of workers ``N`` and the link bandwidth ``B`` (bytes/s), it
chooses contiguous stages of layers and a number of replicas for each, using all ``N`` workers,
that minimise the pipeline's time per minibatch in steady state: the slowest of

* a stage of layers ``i..j`` with ``m`` replicas: ``max(compute(i..j), sync(params(i..j), m))
  / m`` (the replicas take turns on minibatches and overlap their weight synchronisation with
  compute; PipeDream's T(i→j, m));
* a boundary after layer ``l``: ``comm_factor * activation_bytes[l] / B`` (PipeDream's C_l).
  The activations go forward and their gradients, as large, backward: on full-duplex links
  the two directions overlap, so the default ``comm_factor`` is 1; PipeDream's paper counts
  both on one link (``comm_factor=2``).

The recursion is PipeDream's::

    A(j, m) = min( T(0..j, m),
                   min_{i < j, 1 <= m' < m} max(A(i, m - m'), C_i, T(i+1..j, m')) )

and the answer ``A(L-1, N)`` is the predicted time per minibatch (its inverse the throughput).

``sync(P, m)``: the time to synchronise ``P`` bytes of gradients among ``m`` replicas. The
default models byteps' summation service with one server per worker machine, where every worker
of the job takes part in a stage's push_pull (the non-replicas push zeros, see
:mod:`.gradsync`): each worker's link carries ``2 (N - 1) / N * P`` bytes each way, so
``sync = 2 (N - 1) P / (N B)`` for ``m > 1`` and 0 for ``m = 1``. Pass ``sync_time`` to model
another set-up (e.g. PipeDream's ring all-reduce among the replicas, ``4 (m-1) P / (m B)``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence

from byteps.errors import InvalidArgumentError

from .profiler import LayerProfile


@dataclass
class Stage:
    """One pipeline stage: layers ``first..last`` (inclusive, indices into the model's layer
    list), ``replicas`` workers (the job's ranks ``ranks``, consecutive)."""

    first: int
    last: int
    replicas: int
    ranks: List[int] = field(default_factory=list)


@dataclass
class Plan:
    """The partitioner's answer (JSON-serialisable with :meth:`to_dict`).

    ``stages``: in pipeline order, covering every layer once and every rank once (stage 0 on
    ranks ``0..r0-1``, stage 1 on the next ``r1``...). ``time_per_minibatch`` (s) and
    ``throughput`` (minibatches/s) are the model's prediction; ``bottleneck`` names what bounds
    it (``"stage k"`` or ``"boundary after layer l"``).
    """

    stages: List[Stage]
    workers: int
    bandwidth: float
    time_per_minibatch: float
    bottleneck: str = ""

    @property
    def throughput(self) -> float:
        return 1.0 / self.time_per_minibatch if self.time_per_minibatch > 0 else math.inf

    def stage_of_rank(self, rank: int) -> tuple:
        """(stage index, replica index) of a job rank."""
        for s, st in enumerate(self.stages):
            if rank in st.ranks:
                return s, st.ranks.index(rank)
        raise InvalidArgumentError(f"pipeline plan: rank {rank} is in no stage "
                                   f"(plan of {self.workers} workers)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throughput"] = self.throughput
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(stages=[Stage(**s) for s in d["stages"]], workers=int(d["workers"]),
                   bandwidth=float(d["bandwidth"]),
                   time_per_minibatch=float(d["time_per_minibatch"]),
                   bottleneck=d.get("bottleneck", ""))


SyncFn = Callable[[float, int], float]


def byteps_sync_time(workers: int, bandwidth: float) -> SyncFn:
    """The default ``sync(P, m)``: ``2 (N-1) P / (N B)`` for m > 1, 0 for m = 1."""
    def sync(param_bytes: float, replicas: int) -> float:
        if replicas <= 1 or workers <= 1:
            return 0.0
        return 2.0 * (workers - 1) * param_bytes / (workers * bandwidth)
    return sync


class CostModel:
    """The partitioner's cost terms over a profile (seconds), shared with the brute-force
    check of the tests so both optimise exactly the same objective."""

    def __init__(self, layers: Sequence[LayerProfile], workers: int, bandwidth: float,
                 sync_time: Optional[SyncFn] = None, comm_factor: float = 1.0):
        if not layers:
            raise InvalidArgumentError("partition: an empty profile")
        if workers < 1:
            raise InvalidArgumentError(f"partition: workers must be >= 1, got {workers}")
        if not bandwidth > 0:
            raise InvalidArgumentError(f"partition: bandwidth must be > 0 bytes/s, "
                                       f"got {bandwidth}")
        self.layers = list(layers)
        self.workers = int(workers)
        self.bandwidth = float(bandwidth)
        self.sync = sync_time or byteps_sync_time(workers, bandwidth)
        self.comm_factor = float(comm_factor)
        self._compute = [0.0]
        self._params = [0.0]
        for lp in self.layers:
            self._compute.append(self._compute[-1] + lp.forward_s + lp.backward_s)
            self._params.append(self._params[-1] + lp.param_bytes)

    def stage_time(self, first: int, last: int, replicas: int) -> float:
        """T(first..last, m): per-minibatch time of a stage with ``replicas`` replicas."""
        compute = self._compute[last + 1] - self._compute[first]
        params = self._params[last + 1] - self._params[first]
        return max(compute, self.sync(params, replicas)) / replicas

    def boundary_time(self, layer: int) -> float:
        """C_l: the activations of ``layer`` forward and their gradients backward."""
        return self.comm_factor * self.layers[layer].activation_bytes / self.bandwidth

    def evaluate(self, stages: Sequence[tuple]) -> tuple:
        """(time per minibatch, bottleneck) of stages given as (first, last, replicas)."""
        worst, what = -1.0, ""
        for k, (first, last, reps) in enumerate(stages):
            t = self.stage_time(first, last, reps)
            if t > worst:
                worst, what = t, f"stage {k}"
            if k + 1 < len(stages):
                c = self.boundary_time(last)
                if c > worst:
                    worst, what = c, f"boundary after layer {last}"
        return worst, what


def partition(layers: Sequence[LayerProfile], workers: int, bandwidth: float, *,
              sync_time: Optional[SyncFn] = None, comm_factor: float = 1.0,
              max_stages: Optional[int] = None) -> Plan:
    """PipeDream's optimal partition of ``layers`` over ``workers`` workers.

    Args:
        layers: the model's profile (:func:`.profiler.profile`), in order.
        workers: N, every one of which the plan uses (int >= 1).
        bandwidth: bytes/s of each worker's link.
        sync_time: ``sync(param_bytes, replicas) -> s`` (default :func:`byteps_sync_time`).
        comm_factor: multiplies ``activation_bytes / bandwidth`` at a boundary (default 1).
        max_stages: at most this many stages (default: no limit but N and the layer count).

    Returns:
        a :class:`Plan` (ties broken towards fewer stages, then earlier splits).

    Raises:
        byteps.errors.InvalidArgumentError: an empty profile, ``workers < 1``, ``bandwidth <= 0``.
    """
    cm = CostModel(layers, workers, bandwidth, sync_time, comm_factor)
    L, N = len(cm.layers), cm.workers
    S = min(N, L) if max_stages is None else max(1, min(int(max_stages), N, L))
    inf = math.inf
    # best[s][j][m]: optimal time of layers 0..j on exactly m workers in exactly s+1 stages,
    # with a back-pointer (split layer i, replicas of the last stage).
    best = [[[inf] * (N + 1) for _ in range(L)] for _ in range(S)]
    back = [[[None] * (N + 1) for _ in range(L)] for _ in range(S)]
    for j in range(L):
        for m in range(1, N + 1):
            best[0][j][m] = cm.stage_time(0, j, m)
            back[0][j][m] = (-1, m)
    for s in range(1, S):
        for j in range(s, L):
            for m in range(s + 1, N + 1):
                cur, arg = inf, None
                for i in range(s - 1, j):  # the previous stages end at layer i
                    c = cm.boundary_time(i)
                    for mp in range(1, m - s + 1):  # replicas of the last stage
                        prev = best[s - 1][i][m - mp]
                        if prev >= cur or c >= cur:
                            continue
                        t = max(prev, c, cm.stage_time(i + 1, j, mp))
                        if t < cur:
                            cur, arg = t, (i, mp)
                best[s][j][m], back[s][j][m] = cur, arg
    s_best = min(range(S), key=lambda s: (best[s][L - 1][N], s))
    stages: List[tuple] = []
    j, m, s = L - 1, N, s_best
    while s >= 0:
        i, mp = back[s][j][m]
        stages.append((i + 1, j, mp))
        j, m, s = i, m - mp, s - 1
    stages.reverse()
    t, what = cm.evaluate(stages)
    out, rank = [], 0
    for first, last, reps in stages:
        out.append(Stage(first, last, reps, list(range(rank, rank + reps))))
        rank += reps
    return Plan(out, N, float(bandwidth), t, what)


def data_parallel_time(layers: Sequence[LayerProfile], workers: int, bandwidth: float, *,
                       sync_time: Optional[SyncFn] = None) -> float:
    """The model's time per minibatch of pure data parallelism (one stage, N replicas)."""
    cm = CostModel(layers, workers, bandwidth, sync_time)
    return cm.stage_time(0, len(cm.layers) - 1, cm.workers)


def make_plan(stage_layers: Sequence[tuple], replicas: Sequence[int],
              layers: Optional[Sequence[LayerProfile]] = None, bandwidth: float = 1e9) -> Plan:
    """A plan given by hand: ``stage_layers`` = [(first, last), ...] contiguous from layer 0,
    ``replicas`` per stage. With ``layers`` its predicted time is filled in."""
    if len(stage_layers) != len(replicas) or not stage_layers:
        raise InvalidArgumentError("make_plan: one replica count per stage")
    expect = 0
    for first, last in stage_layers:
        if first != expect or last < first:
            raise InvalidArgumentError(f"make_plan: stages {list(stage_layers)} are not "
                                       f"contiguous from layer 0")
        expect = last + 1
    if layers is not None and expect != len(layers):
        raise InvalidArgumentError(f"make_plan: stages cover {expect} layers, the profile "
                                   f"{len(layers)}")
    stages, rank = [], 0
    for (first, last), reps in zip(stage_layers, replicas):
        if reps < 1:
            raise InvalidArgumentError("make_plan: replicas must be >= 1")
        stages.append(Stage(first, last, int(reps), list(range(rank, rank + reps))))
        rank += reps
    t, what = 0.0, ""
    if layers is not None:
        cm = CostModel(layers, rank, bandwidth)
        t, what = cm.evaluate([(s.first, s.last, s.replicas) for s in stages])
    return Plan(stages, rank, float(bandwidth), t, what)
