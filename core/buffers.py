"""Host buffers for the collectives (``byteps.collectives``): the large ones in anonymous
memory of the kernel's small pages, kept for reuse once released.

NumPy asks the kernel to back every array of 4 MiB or more with transparent huge pages
(``madvise(MADV_HUGEPAGE)``). Where the kernel's THP ``defrag`` setting is ``madvise`` (the
default of many distributions), the first touch of such a page may compact memory
synchronously: a collective of 64 MiB that wrote its output into fresh NumPy memory stalled
every rank by 0.1-0.7 s in about one call out of five on the development hosts
(docs/performance-notes.md, "Collectives' stalls"). Buffers from :data:`MAPPED_MIN_BYTES` up
are therefore an anonymous mapping of their own (``mmap``, no advice: the system's default
pages). Faulting small pages in costs time too (some 10 ms per 64 MiB), so a mapping whose
arrays are all gone is kept (up to :data:`KEPT_MAX_BYTES` in all, the most recent first) and
handed out again for a buffer of the same size: a training loop that gathers the same sizes
every step touches no new memory after its first. Smaller buffers are NumPy's. Every buffer is
an ordinary writable ``uint8`` array. Thread-safe.
"""

from __future__ import annotations

import collections
import mmap
import threading
import weakref
from typing import Sequence

import numpy as np

#: Buffers of at least this many bytes get an anonymous mapping of their own.
MAPPED_MIN_BYTES = 1 << 20
#: Released mappings kept for reuse, bytes in all (the oldest go first).
KEPT_MAX_BYTES = 512 << 20

_lock = threading.Lock()
_kept: collections.OrderedDict[int, mmap.mmap] = collections.OrderedDict()  # id -> mapping
_kept_bytes = 0


def _release(m: mmap.mmap) -> None:
    """The last array over ``m`` is gone: keep ``m`` for reuse (or unmap the oldest)."""
    global _kept_bytes
    drop = []
    with _lock:
        _kept[id(m)] = m
        _kept_bytes += len(m)
        while _kept_bytes > KEPT_MAX_BYTES:
            _, old = _kept.popitem(last=False)
            _kept_bytes -= len(old)
            drop.append(old)
    for old in drop:
        old.close()


def _mapped(nbytes: int) -> tuple:
    """(array, reused): a ``uint8`` array over a mapping of exactly ``nbytes``."""
    global _kept_bytes
    m = None
    with _lock:
        for key in reversed(_kept):  # the most recently released first
            if len(_kept[key]) == nbytes:
                m = _kept.pop(key)
                _kept_bytes -= nbytes
                break
    reused = m is not None
    if m is None:
        m = mmap.mmap(-1, nbytes)  # anonymous memory reads as zeros
    a = np.frombuffer(m, np.uint8)
    weakref.finalize(a, _release, m).atexit = False
    return a, reused


def zeros(nbytes: int) -> np.ndarray:
    """A new writable ``uint8`` array of ``nbytes`` (>= 0) zero bytes."""
    if nbytes < MAPPED_MIN_BYTES:
        return np.zeros(nbytes, np.uint8)
    a, reused = _mapped(nbytes)
    if reused:
        a.fill(0)
    return a


def empty(nbytes: int) -> np.ndarray:
    """A new writable ``uint8`` array of ``nbytes`` (>= 0) bytes, contents unspecified."""
    return np.empty(nbytes, np.uint8) if nbytes < MAPPED_MIN_BYTES else _mapped(nbytes)[0]


def empty_like(a: np.ndarray) -> np.ndarray:
    """A new C-contiguous array of ``a``'s dtype and shape in a buffer of this module, contents
    unspecified."""
    return empty(a.nbytes).view(a.dtype).reshape(a.shape)


def copy_of(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` (same dtype and shape) in a buffer of this module."""
    out = empty_like(a)
    out[...] = a
    return out


def concatenate(parts: Sequence[np.ndarray], like: np.ndarray) -> np.ndarray:
    """``np.concatenate(parts)`` along the first dimension into a buffer of this module;
    ``like`` gives the dtype and the trailing dimensions (``parts`` may be empty)."""
    rows = sum(p.shape[0] for p in parts)
    out = empty(rows * int(np.prod(like.shape[1:], dtype=np.int64)) * like.dtype.itemsize)
    out = out.view(like.dtype).reshape((rows,) + tuple(like.shape[1:]))
    at = 0
    for p in parts:
        out[at:at + p.shape[0]] = p
        at += p.shape[0]
    return out
