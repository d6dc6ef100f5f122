"""The start-up measurement of the cost model's α, β and γ (:mod:`byteps.cost_model`).

* **γ** (seconds per byte summed): the core's float32 summation kernel
  (``byteps._core.reduce.sum_into``, the kernel the servers use, docs/architecture.md §7) timed
  on a 1 MiB buffer in this process: the fastest of :data:`GAMMA_REPS` runs after a warm-up.
* **α** (seconds per message): a tiny push_pull (8 bytes, one partition) is two messages one
  after the other, the push and the pull response: ``t₀ = 2α``, the fastest of
  :data:`ROUNDS`.
* **α of the worker mesh** (``mesh=True``: the job has it): a tiny ring push_pull
  (:func:`mesh_alpha`), its ``2(n - 1)`` worker-to-worker messages one after another.
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
import time
from dataclasses import dataclass

#: tensor names of the measurement (declared in this order on every rank)
NAME_TINY = "__byteps_cost_model__.tiny"
NAME_LARGE = "__byteps_cost_model__.large"
NAME_COMBINE = "__byteps_cost_model__.params"
#: the worker mesh's tiny push_pull (a ring; only in a job with the mesh), declared after .large
NAME_TINY_MESH = "__byteps_cost_model__.tiny_mesh"
#: float32 elements per worker machine of the mesh's tiny push_pull (every ring chunk non-empty)
MESH_ELEMS_PER_MACHINE = 16
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
            message, no server): a tiny ring push_pull's time over its 2(n - 1) messages;
            -1.0 when not measured (no mesh in the job, or one worker machine).
        tiny_mesh_s (float): that ring push_pull's time, seconds (0.0: not measured).
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


def gamma_local(nbytes: int = GAMMA_BYTES, reps: int = GAMMA_REPS) -> float:
    """Seconds per byte of the core's float32 summation kernel (``dst += src`` on ``nbytes``
    bytes), the fastest of ``reps`` timed runs after one warm-up. Local, not collective."""
    import numpy as np

    from . import _core

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
    from . import basics

    basics.declare(name, sync="ps")


def _push_pull(name: str, buf) -> None:
    from . import basics

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
    import numpy as np

    from .cost_formulas import ps

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


def mesh_alpha(workers: int, rounds: int = ROUNDS) -> tuple:
    """(α of the worker mesh, the tiny ring push_pull's seconds): the fastest of ``rounds``
    push_pulls of :data:`MESH_ELEMS_PER_MACHINE` float32 per machine declared ``sync="ring"``
    (after one untimed), over its ``2(n - 1)`` messages one after another. Collective; the
    job must have the mesh (``BYTEPS_SYNC`` ring, tree or auto)."""
    import numpy as np

    from . import basics

    buf = np.zeros(MESH_ELEMS_PER_MACHINE * workers, dtype=np.float32)
    basics.declare(NAME_TINY_MESH, sync="ring")
    _push_pull(NAME_TINY_MESH, buf)
    t = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        _push_pull(NAME_TINY_MESH, buf)
        t = min(t, time.perf_counter() - t0)
    return t / (2 * (workers - 1)), t


def run(workers: int, servers: int, size: int, local_size: int, partition_bytes: int,
        rounds: int = ROUNDS, mesh: bool = False) -> Measurement:
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
        mesh: the job has the worker mesh (``BYTEPS_SYNC`` ring, tree or auto): α of the mesh
            is measured too (:func:`mesh_alpha`).

    Raises:
        byteps.errors.NotInitializedError: before ``init()``.
        byteps.errors.BytePSTimeoutError, PeerLostError: a rank did not take part.
    """
    import numpy as np

    from .sim.ps_sim import partition_bound, tensor_partition_bound

    gamma = gamma_local()
    if workers > 1:
        part = tensor_partition_bound(LARGE_BYTES, partition_bound(partition_bytes, local_size),
                                      workers, local_size)
        alpha, beta, t_tiny, t_large, floored = network(workers, servers, part, gamma,
                                                        LARGE_BYTES, rounds)
    else:
        alpha = beta = t_tiny = t_large = 0.0
        floored = False
    a_mesh, t_mesh = mesh_alpha(workers, rounds) if mesh and workers > 1 else (0.0, 0.0)
    vec = np.array([alpha, beta, gamma, t_tiny, t_large, float(floored), a_mesh, t_mesh],
                   dtype=np.float64)
    if size > 1:
        from . import basics

        declare_ps(NAME_COMBINE)
        h = basics.push_pull_async(NAME_COMBINE, vec.ctypes.data, vec.ctypes.data, vec.nbytes,
                                   "float64", vec.shape, False, PRIORITY)
        basics.wait(h)
        vec = vec / float(size)
    a, b, g, t0, tl, fl, am, tm = (float(x) for x in vec)
    measured = mesh and workers > 1
    return Measurement(a, b, g, t0, tl, LARGE_BYTES, fl > 0, am if measured else -1.0,
                       tm if measured else 0.0)
