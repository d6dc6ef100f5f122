"""Tests of the min, max and product kernels (byteps._core.reduce.reduce3; docs/collectives.md
"Reduction ops"): the kernels the servers, the local reduce and the all-reduce schemes combine
values with when a push_pull's op is not a sum.

Every dtype, on every ISA this CPU offers, against a NumPy reference of the documented rule:
``min``/``max`` pick ``a`` when ``a`` is NaN or strictly smaller/larger, else ``b`` (so a NaN in
either operand gives NaN, as ``torch.minimum``), and equal ``np.minimum``/``np.maximum`` in value;
``product`` is the float32 product rounded once for float16/bfloat16 and wraps for integers.
Sizes cover the SIMD tails, unaligned buffers and exact aliasing (dst is a or b).
"""

import numpy as np
import pytest
from test_reduce import (
    ISAS,
    SIZES,
    assert_same,
    bf16_to_f32,
    f32_to_bf16,
    is_nan,
    kw,
    make,
    storage,
)

from byteps._core import reduce

DTYPES = ["float16", "float32", "float64", "bfloat16", "int8", "uint8", "int32", "int64"]
OPS = ["min", "max", "product"]


def values(x, dtype):
    """The numbers the bits stand for (float32 for the half types)."""
    if dtype == "bfloat16":
        return bf16_to_f32(x)
    if dtype == "float16":
        return x.astype(np.float32)
    return x


def ref(a, b, op, dtype):
    with np.errstate(all="ignore"):
        va, vb = values(a, dtype), values(b, dtype)
        if op == "product":
            out = va * vb
        else:
            nan_a = is_nan(a, dtype)
            better = va < vb if op == "min" else va > vb
            return np.where(nan_a | better, a, b)
    if dtype == "bfloat16":
        return f32_to_bf16(out)
    if dtype == "float16":
        return out.astype(np.float16)
    return out


@pytest.fixture(params=ISAS)
def isa(request):
    previous = reduce.active_isa()
    reduce.force_isa(request.param)
    yield request.param
    reduce.force_isa(previous)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_reduce3(isa, op, dtype, n):
    rng = np.random.default_rng(hash((op, dtype, n)) % (1 << 32))
    a, b = make(rng, dtype, n, offset=1), make(rng, dtype, n)
    want = ref(a, b, op, dtype)
    out = np.empty(n, dtype=storage(dtype))
    reduce.reduce3(out, a, b, op, **kw(dtype))
    assert_same(out, want, dtype)
    # exact aliasing both ways: dst is a, then dst is b
    a2, b2 = a.copy(), b.copy()
    reduce.reduce3(a2, a2, b, op, **kw(dtype))
    assert_same(a2, want, dtype)
    reduce.reduce3(b2, a, b2, op, **kw(dtype))
    assert_same(b2, want, dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_min_max_equal_numpy_in_value_and_propagate_nan(isa, dtype):
    rng = np.random.default_rng(7)
    a, b = make(rng, dtype, 4099), make(rng, dtype, 4099)
    for op, np_op in (("min", np.minimum), ("max", np.maximum)):
        out = np.empty_like(a)
        reduce.reduce3(out, a, b, op, **kw(dtype))
        got, want = values(out, dtype), np_op(values(a, dtype), values(b, dtype))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok], want[ok])


def test_integer_min_max_are_signed_and_product_wraps(isa):
    a = np.array([-128, 127, -1, 5], dtype=np.int8)
    b = np.array([127, -128, 1, 100], dtype=np.int8)
    out = np.empty_like(a)
    reduce.reduce3(out, a, b, "min")
    assert out.tolist() == [-128, -128, -1, 5]
    reduce.reduce3(out, a, b, "max")
    assert out.tolist() == [127, 127, 1, 100]
    reduce.reduce3(out, a, b, "product")
    assert out.tolist() == (a.astype(np.int64) * b).astype(np.int8).tolist()  # wrapped
    big = np.array([1 << 62, -(1 << 62)], dtype=np.int64)
    wide = np.empty_like(big)
    reduce.reduce3(wide, big, np.array([4, 4], dtype=np.int64), "product")
    assert wide.tolist() == [0, 0]


def test_sum_op_is_the_sum_kernel():
    rng = np.random.default_rng(3)
    a, b = make(rng, "float32", 1001), make(rng, "float32", 1001)
    via_op, via_sum = np.empty_like(a), np.empty_like(a)
    reduce.reduce3(via_op, a, b, "sum")
    reduce.sum3(via_sum, a, b)
    assert_same(via_op, via_sum, "float32")


def test_unknown_op_is_refused():
    a = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="unsupported op 'mean'"):
        reduce.reduce3(a, a, a, "mean")
