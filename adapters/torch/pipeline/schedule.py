"""The 1F1B schedule of byteps.torch.pipeline (PipeDream §3.2): which replica of a stage runs a
minibatch, how many minibatches a stage admits before its first backward (the startup phase),
and the order of one replica's forward (F) and backward (B) passes.

* Minibatch ``m`` runs on replica ``m mod r_s`` of stage ``s`` (round-robin, PipeDream's
  deterministic assignment), so a replica's minibatches are ``j, j + r_s, j + 2 r_s, ...``.
* Startup: replica ``j`` of stage ``s`` first runs ``w_s`` forwards, ``w_{S-1} = 0`` for the
  last stage and ``w_s = ceil((w_{s+1} + 1) r_{s+1} / r_s)`` before it (a straight pipeline:
  ``w_s = S - 1 - s``; the input stage keeps about ``N / r_0`` minibatches in flight, PipeDream's
  NOAM). Enough that every later stage has the forwards its next backward depends on, so the
  schedule cannot deadlock (checked by the tests' reference simulator for random plans).
* Steady state: one forward, then one backward (of the replica's oldest minibatch in flight);
  then the backwards left.
* The replicas of a stage synchronise their k-th backward's gradients (one push_pull round)
  and update together, so every replica runs the same number of minibatches: an epoch runs
  a multiple of ``lcm(r_s)`` minibatches (:func:`usable_minibatches`).
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

from byteps.errors import InvalidArgumentError

Op = Tuple[str, int]  # ("F" | "B", minibatch)


def warmup_counts(replicas: Sequence[int]) -> List[int]:
    """``w_s`` for every stage (see the module docstring)."""
    S = len(replicas)
    w = [0] * S
    for s in range(S - 2, -1, -1):
        w[s] = -(-(w[s + 1] + 1) * replicas[s + 1] // replicas[s])
    return w


def usable_minibatches(n: int, replicas: Sequence[int]) -> int:
    """The largest multiple of ``lcm(replicas)`` not above ``n``."""
    lcm = 1
    for r in replicas:
        lcm = lcm * r // math.gcd(lcm, r)
    return (n // lcm) * lcm


def replica_of(m: int, replicas: int) -> int:
    """The replica of a stage with ``replicas`` replicas that runs minibatch ``m``."""
    return m % replicas


def minibatches_of(replica: int, replicas: int, n: int) -> List[int]:
    """The minibatches of one replica, in order, among ``n``."""
    return list(range(replica, n, replicas))


def ops(stage: int, replica: int, replicas: Sequence[int], n: int) -> List[Op]:
    """The forward/backward order of ``replica`` of ``stage`` over ``n`` minibatches (``n`` a
    multiple of lcm(replicas), :func:`usable_minibatches`)."""
    if not 0 <= stage < len(replicas) or not 0 <= replica < replicas[stage]:
        raise InvalidArgumentError(f"schedule: no replica {replica} of stage {stage}")
    if n % usable_minibatches_lcm(replicas):
        raise InvalidArgumentError(f"schedule: {n} minibatches is not a multiple of "
                                   f"lcm{tuple(replicas)}")
    mbs = minibatches_of(replica, replicas[stage], n)
    w = min(warmup_counts(replicas)[stage], len(mbs))
    seq: List[Op] = [("F", m) for m in mbs[:w]]
    for k in range(len(mbs) - w):
        seq.append(("F", mbs[k + w]))
        seq.append(("B", mbs[k]))
    seq.extend(("B", m) for m in mbs[len(mbs) - w:])
    return seq


def usable_minibatches_lcm(replicas: Sequence[int]) -> int:
    """lcm of the replica counts (an epoch's minibatches are a multiple of it)."""
    lcm = 1
    for r in replicas:
        lcm = lcm * r // math.gcd(lcm, r)
    return lcm


# Tags of the channel's messages: (kind, minibatch) of one run, below 2**64.
ACT, ACT_META, GRAD, GRAD_META = 0, 1, 2, 3


def tag(run: int, kind: int, minibatch: int) -> int:
    """The channel tag of a message: run id (16 bits), kind (4 bits), minibatch (40 bits)."""
    return ((run & 0xFFFF) << 48) | ((kind & 0xF) << 40) | (minibatch & ((1 << 40) - 1))
