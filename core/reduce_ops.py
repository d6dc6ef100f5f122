"""Horovod's reduction ops by name, and how each maps onto push_pull (docs/collectives.md
"Reduction ops"): the one definition the adapters resolve ``op=`` / ``average=`` with.

Horovod's rules (``handle_average_backwards_compatibility``): ``op`` and the deprecated
``average`` together are an error; ``average=True`` / ``False`` mean Average / Sum; neither
means Average. Adasum is refused with an error naming it.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .errors import InvalidArgumentError

AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = "Average", "Sum", "Adasum", "Min", "Max", "Product"

#: Horovod op name -> (push_pull's op, average).
CORE_OPS = {AVERAGE: ("sum", True), SUM: ("sum", False), MIN: ("min", False),
            MAX: ("max", False), PRODUCT: ("product", False)}


def resolve(op: Optional[str], average: Optional[bool], fn: str) -> Tuple[str, bool]:
    """``op`` (a Horovod op name, or None) and ``average`` -> (push_pull's op, average).

    Raises:
        byteps.errors.InvalidArgumentError (a ``ValueError``): both given (the message says
            "not both": op supersedes average), Adasum, or an unknown op.
    """
    if op is not None and average is not None:
        raise InvalidArgumentError(f"{fn}: pass either op or the deprecated average, not both "
                                   "(op supersedes average)")
    if op is None:
        return "sum", average is None or bool(average)
    if op == ADASUM:
        raise InvalidArgumentError(f"{fn}: op=Adasum is not supported by byteps (use Average "
                                   "or Sum)")
    if op not in CORE_OPS:
        raise InvalidArgumentError(f"{fn}: unknown op {op!r}; expected Average, Sum, Min, Max "
                                   "or Product")
    return CORE_OPS[op]
