"""byteps.buffers: the collectives' large buffers (small-page mappings, reused once released)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from byteps import buffers

BIG = 2 * buffers.MAPPED_MIN_BYTES


def test_small_buffers_are_numpy_arrays_of_their_own():
    a = buffers.zeros(1000)
    assert a.dtype == np.uint8 and a.shape == (1000,) and not a.any()
    assert a.base is None  # NumPy's own memory, no mapping behind it


def test_a_released_mapping_is_reused_for_the_same_size_and_zeroed():
    a = buffers.empty(BIG)
    a[:] = 7
    address = a.ctypes.data
    view = a.view(np.float32).reshape(-1, 4)  # a view keeps the mapping in use
    del a
    other = buffers.empty(BIG)
    assert other.ctypes.data != address
    del view
    gc.collect()
    again = buffers.zeros(BIG)
    assert again.ctypes.data == address and not again.any()
    assert again.flags.writeable and again.dtype == np.uint8 and again.shape == (BIG,)
    del other, again


def test_other_sizes_get_new_mappings_and_the_kept_bytes_are_bounded(monkeypatch):
    monkeypatch.setattr(buffers, "KEPT_MAX_BYTES", 3 * BIG)
    arrays = [buffers.empty(BIG) for _ in range(5)]
    del arrays
    gc.collect()
    kept = buffers._kept_bytes
    assert BIG <= kept <= 3 * BIG
    bigger = buffers.empty(BIG + 4096)  # no kept mapping has that size: none is taken
    assert buffers._kept_bytes == kept and bigger.shape == (BIG + 4096,)
    del bigger


@pytest.mark.parametrize("shape", [(0, 3), (5, 3), (300000, 3)])
def test_copy_and_concatenate_keep_dtype_shape_and_values(shape):
    a = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    c = buffers.copy_of(a)
    assert c.dtype == a.dtype and c.shape == a.shape and np.array_equal(c, a)
    c[...] = 0
    assert a.size == 0 or a.any()  # a copy, not a view
    parts = [a[:2], a[2:], a[:1]]
    assert np.array_equal(buffers.concatenate(parts, a), np.concatenate(parts))
    assert buffers.concatenate([], a).shape == (0, 3)
