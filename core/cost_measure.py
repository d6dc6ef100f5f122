"""The start-up measurement of the cost model's α, β and γ (:mod:`byteps.cost_model`).

* **γ** (seconds per byte summed): the core's float32 summation kernel
  (``byteps._core.reduce.sum_into``, the kernel the servers use, docs/architecture.md §7) timed
  on a 1 MiB buffer in this process: the fastest of :data:`GAMMA_REPS` runs after a warm-up.
* **α** (seconds per message) and **β** (seconds per byte on one link direction): push_pulls
  through the summation service, over the job's own connections. A push_pull of one partition
  is two messages one after the other, the push and the pull response. A tiny one (8 bytes)
  costs ``t₀ = 2α``. A larger one of L bytes (:data:`LARGE_BYTES` = 64 KiB, or the partition
  bound when smaller: the largest tensor the core never cuts) goes to one server, which receives
  the n workers' pushes over its one link, sums n - 1 of them and sends n responses:
  ``t_L = 2α + 2nLβ + (n-1)Lγ``. So ``α = t₀ / 2`` and
  ``β = (t_L - t₀ - (n-1)(L-8)γ) / (2n(L-8))``. Each time is the fastest of :data:`ROUNDS`
  rounds (tiny and large alternate), which drops the rounds a busy host or a late peer
  slowed. Both include the core's own overhead per operation, which the schemes pay too.
* **Agreement.** Every rank then push_pulls the vector of its measurements (float64, summed by
  the service) and divides by the number of ranks: every rank gets the same bytes, so every
  rank computes the same choice.

Everything here is collective: every worker process calls :func:`run` at the same point (the
tensors ``__byteps_cost_model__.*`` are declared in the same order on every rank). It takes a
few milliseconds on a local network (the two declarations are most of it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

#: tensor names of the measurement (declared in this order on every rank)
NAME_TINY = "__byteps_cost_model__.tiny"
NAME_LARGE = "__byteps_cost_model__.large"
NAME_COMBINE = "__byteps_cost_model__.params"
#: priority of the measurement's push_pulls (above every default priority)
PRIORITY = 1 << 62
#: rounds of (tiny, large) push_pulls timed; each time is the fastest round
ROUNDS = 10
#: bytes of the tiny push_pull (two float32)
TINY_BYTES = 8
#: bytes of the larger push_pull: the core's smallest adaptive partition (one partition)
LARGE_BYTES = 64 << 10
#: bytes of the buffer the summation kernel is timed on, and how many times
GAMMA_BYTES = 1 << 20
GAMMA_REPS = 5
#: smallest β kept (s/B, 10 TB/s): a larger push_pull measured no slower than a tiny one
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
    """

    alpha: float
    beta: float
    gamma: float
    tiny_s: float
    large_s: float
    large_bytes: int
    beta_floored: bool


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


def _push_pull(name: str, buf) -> None:
    from . import basics

    h = basics.push_pull_async(name, buf.ctypes.data, buf.ctypes.data, buf.nbytes, "float32",
                               buf.shape, False, PRIORITY)
    basics.wait(h)


def large_bytes(partition_bound: int) -> int:
    """Bytes of the larger push_pull for a job whose partition bound is ``partition_bound``:
    :data:`LARGE_BYTES`, or the bound when smaller (one partition either way)."""
    return max(TINY_BYTES * 2, min(LARGE_BYTES, int(partition_bound)) // 4 * 4)


def network(workers: int, nbytes: int, gamma: float, rounds: int = ROUNDS):
    """Time tiny and ``nbytes``-byte push_pulls (collective); returns
    ``(alpha, beta, tiny_s, large_s, floored)`` for ``workers`` worker machines."""
    import numpy as np

    tiny = np.zeros(TINY_BYTES // 4, dtype=np.float32)
    large = np.zeros(nbytes // 4, dtype=np.float32)
    _push_pull(NAME_TINY, tiny)  # declares; the servers make the keys
    _push_pull(NAME_LARGE, large)
    t_tiny = t_large = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        _push_pull(NAME_TINY, tiny)
        t1 = time.perf_counter()
        _push_pull(NAME_LARGE, large)
        t2 = time.perf_counter()
        t_tiny, t_large = min(t_tiny, t1 - t0), min(t_large, t2 - t1)
    alpha = t_tiny / 2
    d = float(large.nbytes - tiny.nbytes)
    beta = (t_large - t_tiny - (workers - 1) * d * gamma) / (2 * workers * d)
    floored = beta < BETA_FLOOR
    return alpha, max(beta, BETA_FLOOR), t_tiny, t_large, floored


def run(workers: int, size: int, partition_bound: int, rounds: int = ROUNDS) -> Measurement:
    """Measure α, β, γ on this rank and average them over the ``size`` ranks (collective).

    Args:
        workers: worker machines (``DMLC_NUM_WORKER``); with 1 there is no network to measure
            and α = β = 0.
        size: worker processes of the job (``byteps.basics.size()``); with 1, nothing is
            exchanged.
        partition_bound: the job's partition bound, bytes (the larger push_pull stays one
            partition).
        rounds: timed rounds.

    Raises:
        byteps.errors.NotInitializedError: before ``init()``.
        byteps.errors.BytePSTimeoutError, PeerLostError: a rank did not take part.
    """
    import numpy as np

    gamma = gamma_local()
    nbytes = large_bytes(partition_bound)
    if workers > 1:
        alpha, beta, t_tiny, t_large, floored = network(workers, nbytes, gamma, rounds)
    else:
        alpha = beta = t_tiny = t_large = 0.0
        floored = False
    vec = np.array([alpha, beta, gamma, t_tiny, t_large, float(floored)], dtype=np.float64)
    if size > 1:
        from . import basics

        h = basics.push_pull_async(NAME_COMBINE, vec.ctypes.data, vec.ctypes.data, vec.nbytes,
                                   "float64", vec.shape, False, PRIORITY)
        basics.wait(h)
        vec = vec / float(size)
    a, b, g, t0, tl, fl = (float(x) for x in vec)
    return Measurement(a, b, g, t0, tl, nbytes, fl > 0)
