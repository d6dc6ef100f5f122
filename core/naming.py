"""Framework-independent helpers shared by the adapters: tensor names whose dtype and shape
never change (the core fixes both at a name's first use), and broadcast of Python objects.
"""

from __future__ import annotations

import io
import threading
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import basics as _b
from .errors import InvalidArgumentError, InvalidTypeError

__all__ = ["name_for", "broadcast_object", "check_root", "resolve_priority"]

_names_lock = threading.Lock()
_name_sigs: Dict[str, Tuple[str, Tuple[int, ...], Tuple[Tuple[str, str], ...]]] = {}


def name_for(base: str, dtype: str, shape: Sequence[int],
             compression: Optional[Mapping[str, str]] = None) -> str:
    """A tensor name derived from ``base`` that has only ever been used (through this helper)
    with this dtype name, shape and compressor: ``base`` itself, or ``base~1``, ``base~2``...

    The core fixes a name's dtype, shape and compressor at first use, so e.g. the parameters of
    two different models (both with a ``"0.weight"``), or a second optimizer with other
    ``compression_params`` over the same model, could otherwise not be reduced one after the
    other (upstream crashed). Deterministic: every rank making the same calls gets the same
    names. ``compression``: the core compressor kwargs the name is declared with (default
    none).
    """
    comp = tuple(sorted((str(k), str(v)) for k, v in (compression or {}).items()))
    sig = (str(dtype), tuple(int(s) for s in shape), comp)
    with _names_lock:
        name, k = base, 0
        while _name_sigs.setdefault(name, sig) != sig:
            k += 1
            name = f"{base}~{k}"
        return name


def check_root(root_rank: Any, fn: str) -> int:
    """``root_rank`` as an int in ``[0, size())``.

    Raises:
        byteps.errors.InvalidArgumentError (a ``ValueError``): not an int (bools refused) or out
            of range.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    n = _b.size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) \
            or not 0 <= int(root_rank) < n:
        raise InvalidArgumentError(f"{fn}: root_rank must be an int in [0, {n}), got {root_rank!r}")
    return int(root_rank)


def resolve_priority(priority: Any, fn: str) -> Optional[int]:
    """An adapter's ``priority`` argument as the core takes it: ``None`` for 0 or ``None``
    (upstream's default: the core orders by declaration, earlier-declared first), else the int
    (larger runs first).

    Raises:
        byteps.errors.InvalidTypeError (a ``TypeError``): not an int (Python or NumPy integer;
            bools and floats refused).
    """
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
        raise InvalidTypeError(f"{fn}: priority must be an int or None, got "
                               f"{type(priority).__name__}")
    return None if priority == 0 else int(priority)


def _broadcast_array(arr: np.ndarray, dtype: str, name: str, is_root: bool) -> np.ndarray:
    """Zero-and-sum broadcast of a C-contiguous NumPy array, in place."""
    if not is_root:
        arr[...] = 0
    ptr = arr.ctypes.data
    handle = _b.push_pull_async(name_for(name, dtype, arr.shape), ptr, ptr, arr.nbytes, dtype,
                                arr.shape, False)
    _b.wait(handle)
    return arr


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Send a picklable Python object from ``root_rank`` to every rank and return it
    (Horovod's ``broadcast_object``).

    The root serialises ``obj`` with cloudpickle (lambdas and local classes work); the byte
    count goes out as an int64 tensor (name ``"BroadcastObject.<name>.sz"``), then the bytes as
    a uint8 tensor (``"BroadcastObject.<name>.t"``, with a ``~k`` suffix for each new byte count).
    Every rank must call it with the same ``name``, in the same order.

    Args:
        obj: any object cloudpickle can serialise (only the root's is used; the other ranks
            may pass anything, e.g. ``None``).
        root_rank: the sending rank (default 0).
        name: distinguishes unrelated broadcasts; default ``type(obj).__name__`` (as Horovod;
            give an explicit name when the ranks pass objects of different types).

    Returns:
        ``obj`` itself on the root; the unpickled copy elsewhere.

    Raises:
        byteps.errors.InvalidArgumentError (a ``ValueError``): bad ``root_rank``, or a name
            that is not a non-empty str.
        byteps.errors.NotInitializedError: before ``init()``.
        byteps.errors.BytePSError subclasses: the underlying push_pull failed.
    """
    import cloudpickle

    root = check_root(root_rank, "broadcast_object")
    if name is None:
        name = type(obj).__name__
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"broadcast_object: name must be a non-empty str, got {name!r}")
    is_root = _b.rank() == root
    base = f"BroadcastObject.{name}"
    payload = cloudpickle.dumps(obj) if is_root else b""
    size = np.array([len(payload)], dtype=np.int64)
    nbytes = int(_broadcast_array(size, "int64", base + ".sz", is_root)[0])
    if is_root:
        buf = np.frombuffer(bytearray(payload), dtype=np.uint8)
    else:
        buf = np.zeros(nbytes, dtype=np.uint8)
    _broadcast_array(buf, "uint8", base + ".t", is_root)
    if is_root:
        return obj
    return cloudpickle.load(io.BytesIO(buf.tobytes()))
