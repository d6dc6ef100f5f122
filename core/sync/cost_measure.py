"""The start-up measurement of the cost model's α, β and γ (:mod:`byteps.sync.cost_model`).

* **γ** (seconds per byte summed): the core's float32 summation kernel
  (``byteps._core.reduce.sum_into``, the kernel the servers use, docs/architecture.md §7) timed
  on a 1 MiB buffer in this process: the fastest of :data:`GAMMA_REPS` runs after a warm-up.
* **α** (seconds per message): a tiny push_pull (8 bytes, one partition) is two messages one
  after the other, the push and the pull response: ``t₀ = 2α``, the fastest of
  :data:`ROUNDS`.
* **Each scheme's latency** (:func:`scheme_latencies`): a tiny push_pull declared with each
  scheme the job can run, the schemes in turn round after round, the median of
  :data:`LATENCY_ROUNDS` per scheme. The cost model takes it as the scheme's whole α term:
  its messages differ in what they pass through (a server's receive, summation engine and
  response; a worker's forward in the ring or the heap), which one α per message cannot say.
  α of the worker mesh is the ring's over its ``2(n - 1)`` messages.
* **β** (seconds per byte on one link direction): a larger push_pull of M = 1 MiB through the
  summation service, over the job's own connections, cut into partitions of b bytes by the
  core's rule and pipelined: the cost model's ``ps`` cost (``cost_formulas.ps`` and the
  pipeline's fill, one partition: ``CostModel.ps_fill_bytes``) says it takes
  ``t_M = 2α + wire·(M + min(M, b))·β + summed·M·γ``, so
  ``β = (t_M - t₀ - summed·M·γ) / (wire·(M + min(M, b)))``: the β with which the cost model
  predicts the measured push_pull. The fastest of :data:`LARGE_ROUNDS`. Both times include the core's
  own overhead per operation, which the schemes pay too.
* **Agreement.** Every rank then push_pulls the vector of its measurements (float64, summed by
  the service) and divides by the number of ranks: every rank gets the same bytes, so every
  rank computes the same choice.

Everything here is collective: every worker process calls :func:`run` at the same point (the
tensors ``__byteps_cost_model__.*`` are declared in the same order on every rank, for the
summation service: :func:`declare_ps`). The fastest
of several rounds drops the rounds a busy host or a late peer slowed.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _core, basics
from .cost_formulas import SCHEMES, ps

#: tensor names of the measurement (declared in this order on every rank)
NAME_TINY = "__byteps_cost_model__.tiny"
NAME_LARGE = "__byteps_cost_model__.large"
NAME_COMBINE = "__byteps_cost_model__.params"
#: each scheme's tiny push_pull, ``NAME_LATENCY + "." + scheme``, declared after .large in the
#: order of ``cost_formulas.SCHEMES``
NAME_LATENCY = "__byteps_cost_model__.latency"
#: float32 elements per worker machine of the schemes' tiny push_pulls (every ring chunk
#: non-empty)
MESH_ELEMS_PER_MACHINE = 16
#: rounds of the schemes' tiny push_pulls (the schemes in turn; the median counts)
LATENCY_ROUNDS = 15
#: priority of the measurement's push_pulls (above every default priority)
PRIORITY = 1 << 62
#: rounds of the tiny push_pull timed (the fastest counts)
ROUNDS = 10
#: rounds of the larger push_pull timed (the fastest counts)
LARGE_ROUNDS = 4
#: bytes of the tiny push_pull (two float32)
TINY_BYTES = 8
#: bytes of the larger push_pull
LARGE_BYTES = 1 << 20
#: bytes of the buffer the summation kernel is timed on, and how many times
GAMMA_BYTES = 1 << 20
GAMMA_REPS = 5
#: smallest β kept (s/B, 10 TB/s): the larger push_pull measured hardly slower than a tiny one
BETA_FLOOR = 1e-13


@dataclass(frozen=True)
class Measurement:
    """What :func:`run` measured, averaged over every rank.

    Attributes:
        alpha (float): seconds per message (0.0 with one worker machine: no network).
        beta (float): seconds per byte on one link direction (0.0 with one worker machine).
        gamma (float): seconds per byte summed (float32).
        tiny_s (float): the tiny push_pull's time, seconds (0.0 with one worker machine).
        large_s (float): the larger push_pull's time, seconds (0.0 with one worker machine).
        large_bytes (int): the larger push_pull's bytes.
        beta_floored (bool): β came out below :data:`BETA_FLOOR` on some rank and was raised
            to it there.
        alpha_mesh (float): seconds per message of the worker mesh (a worker-to-worker
            message, no server): the ring's tiny push_pull over its 2(n - 1) messages;
            -1.0 when not measured (no mesh in the job, or one worker machine).
        tiny_mesh_s (float): that ring push_pull's time, seconds (0.0: not measured).
        latency (dict[str, float]): per scheme timed, its tiny push_pull's median seconds
            (:func:`scheme_latencies`); empty with one worker machine.
    """

    alpha: float
    beta: float
    gamma: float
    tiny_s: float
    large_s: float
    large_bytes: int
    beta_floored: bool
    alpha_mesh: float = -1.0
    tiny_mesh_s: float = 0.0
    latency: dict = field(default_factory=dict)


def gamma_local(nbytes: int = GAMMA_BYTES, reps: int = GAMMA_REPS) -> float:
    """Seconds per byte of the core's float32 summation kernel (``dst += src`` on ``nbytes``
    bytes), the fastest of ``reps`` timed runs after one warm-up. Local, not collective."""
    dst = np.ones(nbytes // 4, dtype=np.float32)
    src = np.full(nbytes // 4, 0.5, dtype=np.float32)
    _core.reduce.sum_into(dst, src)  # warm-up: page faults, caches
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        _core.reduce.sum_into(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best / dst.nbytes


def declare_ps(name: str) -> None:
    """Declare ``name`` for the summation service (``sync="ps"``), so that ``BYTEPS_SYNC=auto``
    never asks the cost model about its own measurement."""
    basics.declare(name, sync="ps")


def _push_pull(name: str, buf) -> None:
    h = basics.push_pull_async(name, buf.ctypes.data, buf.ctypes.data, buf.nbytes, "float32",
                               buf.shape, False, PRIORITY)
    basics.wait(h)


def network(workers: int, servers: int, part_bytes: int, gamma: float,
            nbytes: int = LARGE_BYTES, rounds: int = ROUNDS, large_rounds: int = LARGE_ROUNDS):
    """Time tiny and ``nbytes``-byte push_pulls (collective); returns
    ``(alpha, beta, tiny_s, large_s, floored)``.

    Args:
        workers, servers: n and k of the summation service's formula (``cost_formulas.ps``).
        part_bytes: the core's partition bound of the larger tensor (its pipeline's fill).
        gamma: seconds per byte summed.
        nbytes: the larger push_pull's bytes.
    """
    tiny = np.zeros(TINY_BYTES // 4, dtype=np.float32)
    large = np.zeros(nbytes // 4, dtype=np.float32)
    declare_ps(NAME_TINY)
    declare_ps(NAME_LARGE)
    _push_pull(NAME_TINY, tiny)  # the first: the servers make the keys
    _push_pull(NAME_LARGE, large)
    t_tiny = t_large = math.inf
    for i in range(max(rounds, large_rounds)):
        if i < rounds:
            t0 = time.perf_counter()
            _push_pull(NAME_TINY, tiny)
            t_tiny = min(t_tiny, time.perf_counter() - t0)
        if i < large_rounds:
            t0 = time.perf_counter()
            _push_pull(NAME_LARGE, large)
            t_large = min(t_large, time.perf_counter() - t0)
    cost = ps(workers, servers)
    m = float(large.nbytes)
    beta = (t_large - t_tiny - cost.summed * m * gamma) / (
        cost.wire * (m + min(m, part_bytes)))
    floored = beta < BETA_FLOOR
    return t_tiny / 2, max(beta, BETA_FLOOR), t_tiny, t_large, floored


def scheme_latencies(workers: int, schemes, rounds: int = LATENCY_ROUNDS) -> dict:
    """{scheme: seconds}: for each of ``schemes``, the median over ``rounds`` of a push_pull of
    :data:`MESH_ELEMS_PER_MACHINE` float32 per machine declared with that scheme (one
    partition; every ring chunk non-empty), after one untimed each. The schemes take turns
    round by round, so a load burst of the host hits them alike; the median, not the fastest,
    because a tensor's steady-state time is what the choice is for (the fastest of a few rounds
    favours the scheme whose time scatters most). Collective; ``ring`` and ``tree`` need the
    worker mesh (``BYTEPS_SYNC`` ring, tree or auto), ``ps`` and ``hips`` servers."""
    buf = np.zeros(MESH_ELEMS_PER_MACHINE * workers, dtype=np.float32)
    for s in schemes:
        basics.declare(f"{NAME_LATENCY}.{s}", sync=s)
        _push_pull(f"{NAME_LATENCY}.{s}", buf)
    times: dict = {s: [] for s in schemes}
    for _ in range(rounds):
        for s in schemes:
            t0 = time.perf_counter()
            _push_pull(f"{NAME_LATENCY}.{s}", buf)
            times[s].append(time.perf_counter() - t0)
    return {s: statistics.median(ts) for s, ts in times.items()}


def run(workers: int, servers: int, size: int, local_size: int, partition_bytes: int,
        rounds: int = ROUNDS, schemes=("ps",)) -> Measurement:
    """Measure α, β, γ on this rank and average them over the ``size`` ranks (collective).

    Args:
        workers: worker machines (``DMLC_NUM_WORKER``); with 1 there is no network to measure
            and α = β = 0.
        servers: k of the summation service's formula (``DMLC_NUM_SERVER``).
        size: worker processes of the job (``byteps.basics.size()``); with 1, nothing is
            exchanged.
        local_size: worker processes per machine (``BYTEPS_LOCAL_SIZE``).
        partition_bytes: ``BYTEPS_PARTITION_BYTES`` (the job's partition bound before
            rounding).
        rounds: timed rounds of the tiny push_pull.
        schemes: the schemes whose latency is timed (:func:`scheme_latencies`), in the
            order of ``cost_formulas.SCHEMES``: those the job can run (``ring`` and ``tree``
            only with the worker mesh). With ``ring`` among them α of the mesh is its
            latency over its 2(n - 1) messages.

    Raises:
        byteps.errors.NotInitializedError: before ``init()``.
        byteps.errors.BytePSTimeoutError, PeerLostError: a rank did not take part.
    """
    gamma = gamma_local()
    if workers > 1:
        part = _core.tensor_partition_bound(
            LARGE_BYTES, _core.partition_bound(partition_bytes, local_size), workers, local_size)
        alpha, beta, t_tiny, t_large, floored = network(workers, servers, part, gamma,
                                                        LARGE_BYTES, rounds)
    else:
        alpha = beta = t_tiny = t_large = 0.0
        floored = False
    timed = [s for s in SCHEMES if s in schemes] if workers > 1 else []
    lat = scheme_latencies(workers, timed) if timed else {}
    vec = np.array([alpha, beta, gamma, t_tiny, t_large, float(floored)]
                   + [lat.get(s, 0.0) for s in SCHEMES], dtype=np.float64)
    if size > 1:
        declare_ps(NAME_COMBINE)
        h = basics.push_pull_async(NAME_COMBINE, vec.ctypes.data, vec.ctypes.data, vec.nbytes,
                                   "float64", vec.shape, False, PRIORITY)
        basics.wait(h)
        vec = vec / float(size)
    a, b, g, t0, tl, fl = (float(x) for x in vec[:6])
    latency = {s: float(v) for s, v in zip(SCHEMES, vec[6:]) if s in timed}
    t_ring = latency.get("ring", 0.0)
    return Measurement(a, b, g, t0, tl, LARGE_BYTES, fl > 0,
                       t_ring / (2 * (workers - 1)) if "ring" in latency else -1.0, t_ring,
                       latency)
