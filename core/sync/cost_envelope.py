"""The choice of :class:`byteps.cost_model.CostModel` over every tensor size: the lower
envelope of the schemes' cost lines, as :class:`Interval` ranges (``CostModel.intervals``).

Each scheme's cost is a line ``a + b·S`` in the tensor's bytes S, except that the pipeline fill
(``CostModel.ps_fill_bytes``) is piecewise: S itself below the smallest partition, then a
constant between the sizes where the core's partition bound of a tensor changes
(:func:`fill_pieces`). :func:`envelope` finds, piece by piece, every size where the cheapest
scheme changes, exactly over the integers ``[0, MAX_BYTES)``. ``model`` is a ``CostModel``
(duck-typed here: ``scheme_costs``, ``latency_seconds``, ``beta``, ``gamma``,
``partition_bound``, ``workers``, ``local_size``, ``ps_fill_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

#: largest tensor size the intervals cover exactly (bytes)
MAX_BYTES = 1 << 63


@dataclass(frozen=True)
class Interval:
    """Tensor sizes ``lo <= nbytes < hi`` (``hi`` None: no upper end) get ``scheme``."""

    lo: int
    hi: Optional[int]
    scheme: str


def fill_pieces(model) -> list:
    """[(lo, hi, per_byte, const)]: the sizes ``lo <= S < hi`` (hi None: no end) on which
    ``ps_fill_bytes(S) = per_byte·S + const`` (per_byte 0 or 1). The core's partition bound of
    a tensor changes only where ``S // (PIPELINE_DEPTH·n)`` reaches a multiple of 60 KiB or the
    job's bound; the fill is S itself below the smallest bound b0 (one partition)."""
    if model.partition_bound <= 0 or model.workers <= 1:
        return [(0, None, 0, 0)]
    # the core's partition rule; imported here, not at the top: importing byteps (which
    # imports the cost model) loads no _core
    from .. import _core

    span = _core.PIPELINE_DEPTH * model.workers
    b0 = _core.tensor_partition_bound(0, model.partition_bound, model.workers, model.local_size)
    small = _core.SMALL_PARTITION_BYTES
    cuts = {0, b0, model.partition_bound * span}
    cuts.update(j * small * span for j in range(1, model.partition_bound // small + 2))
    cuts = sorted(c for c in cuts if c < MAX_BYTES)
    out = [(0, cuts[1] if len(cuts) > 1 else None, 1, 0)]  # below b0: the whole tensor
    for i, lo in enumerate(cuts[1:], 1):
        out.append((lo, cuts[i + 1] if i + 1 < len(cuts) else None, 0,
                    model.ps_fill_bytes(lo)))
    return out


def envelope(model) -> Tuple[Interval, ...]:
    """The cheapest scheme over every integer size in [0, MAX_BYTES): the lower envelope of
    the cost lines ``a + b·S``, piece by piece where the fill changes the lines
    (:func:`fill_pieces`). Within a piece the argmin can change only between floor(x) and
    floor(x) + 1 for a crossing x of two lines, so it is evaluated at the piece's start and at
    those integers; equal neighbours merge."""
    base = []
    for i, (s, c) in enumerate(model.scheme_costs().items()):
        base.append((s, model.latency_seconds(s),
                     c.wire * model.beta + c.summed * model.gamma,
                     i, c.fill * model.beta))
    out: list = []
    for lo, hi, per_byte, const in fill_pieces(model):
        top = MAX_BYTES if hi is None else hi
        lines = [(s, a + f * const, b + f * per_byte, i) for s, a, b, i, f in base]
        points = {lo}
        for i in range(len(lines)):
            for j in range(i + 1, len(lines)):
                (_, ai, bi, _), (_, aj, bj, _) = lines[i], lines[j]
                if bi == bj:
                    continue
                x = (aj - ai) / (bi - bj)
                if lo <= x < top - 1:
                    points.update((int(math.floor(x)), int(math.floor(x)) + 1))

        def best(size: int, lines=lines) -> str:
            return min(lines, key=lambda ln: (ln[1] + ln[2] * size, ln[3]))[0]

        for p in sorted(q for q in points if lo <= q < top):
            s = best(p)
            if not out or out[-1][1] != s:
                out.append((p, s))
    return tuple(Interval(lo, out[i + 1][0] if i + 1 < len(out) else None, s)
                 for i, (lo, s) in enumerate(out))
