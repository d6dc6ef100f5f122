"""The expected result of a push_pull, for every test and every worker script.

A push_pull over ``size`` ranks returns the element-wise sum of the ranks' inputs, or their
average: floor division of the sum for integer dtypes (as upstream on torch >= 1.5), the
quotient ``sum / size`` for floating dtypes. The tests make every rank's input a deterministic,
integer-valued function of the rank (e.g. :func:`rank_data`), small enough that the sum over a
few ranks is exact in every dtype; so the expected result is computed here exactly, in int64
(an average of a floating dtype: the float64 quotient; callers round it to their dtype or
compare within a tolerance).

NumPy and the standard library only. Imported as ``oracle``: pytest puts tests/ on
``sys.path`` (pyproject's ``pythonpath``); a worker script started by the launcher puts it
there itself (``sys.path.insert(0, <tests/>)``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

#: dtype names whose average is a floating quotient (every other dtype: floor division)
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def rank_data(rank: int, shape: Sequence[int], dtype: str = "int64", salt: int = 0) -> np.ndarray:
    """Small integers depending on ``rank``, the flat position and ``salt``, as int64 of
    ``shape``: in [-5, 5], or in [0, 10] for ``dtype == "uint8"``. Exactly representable in
    every supported dtype; sums over <= 8 ranks fit every dtype."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    v = (np.arange(n, dtype=np.int64) * 7 + rank * 13 + salt * 5 + 3) % 11
    if dtype != "uint8":
        v = v - 5
    return v.reshape(tuple(shape))


def expected_sum(inputs: Callable[[int], Any], size: int) -> np.ndarray:
    """Exact element-wise sum over ranks ``0 .. size-1`` of ``inputs(rank)`` (an array-like or
    a scalar, integer-valued), as an int64 array (0-d for scalars).

    Raises ValueError if ``size < 1`` or an input is not integer-valued (its sum would not be
    exact)."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    total = None
    for r in range(size):
        x = np.asarray(inputs(r))
        v = x.astype(np.int64)
        if not np.array_equal(v, x):
            raise ValueError(f"oracle: the input of rank {r} is not integer-valued")
        total = v if total is None else total + v
    return np.asarray(total)  # 0-d arithmetic gives NumPy scalars


def expected_push_pull(inputs: Callable[[int], Any], size: int, average: bool = False,
                       dtype: str = "int64") -> np.ndarray:
    """The result of push_pull over ``size`` ranks whose inputs are ``inputs(rank)``:
    :func:`expected_sum` (int64); with ``average`` the floor-divided sum (int64) for an integer
    ``dtype`` (a name such as ``"int32"``), the float64 quotient ``sum / size`` for a name in
    :data:`FLOAT_DTYPES`."""
    total = expected_sum(inputs, size)
    if not average:
        return total
    if dtype in FLOAT_DTYPES:
        return np.asarray(total.astype(np.float64) / size)
    return np.asarray(np.floor_divide(total, size))
