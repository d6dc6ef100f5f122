"""Tests of the SIMD summation kernels (byteps._core.reduce, docs/architecture.md §7).

Every dtype is checked against NumPy, bit for bit, on every ISA this CPU offers (forced with
``force_isa`` and restored afterwards): sum_into, sum3 (with and without aliasing), divide,
odd sizes that exercise the SIMD tails, unaligned (offset by one element) buffers, float16 /
bfloat16 special values, integer wrap-around, argument validation and a hypothesis property.

bfloat16 has no NumPy dtype: arrays are uint16 views holding bfloat16 bits, the kernels are
called with ``dtype="bfloat16"``, and the reference below rounds float32 -> bfloat16 to
nearest even by bit manipulation.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from byteps._core import reduce

ISAS = reduce.available_isas()
DTYPES = ["float16", "float32", "float64", "bfloat16", "int8", "uint8", "int32", "int64"]
SIZES = [0, 1, 7, 15, 16, 17, 63, 1000, 100003]
STORAGE = {"bfloat16": np.uint16}  # NumPy storage dtype of types NumPy lacks


# ---- references ----------------------------------------------------------------------------


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> bfloat16 bits, round to nearest even; NaN stays NaN (quiet bit set)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = ((u >> 16) | 0x40).astype(np.uint16)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, nan, rounded).astype(np.uint16)


def ref_add(a, b, dtype):
    with np.errstate(all="ignore"):
        return _ref_add(a, b, dtype)


def _ref_add(a, b, dtype):
    if dtype == "bfloat16":
        return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b))
    if dtype == "float16":  # float32 sum, one RNE rounding (== NumPy's a + b, checked below)
        return (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    return a + b  # integers wrap modulo 2^bits in NumPy too


def ref_divide(a, d, dtype):
    with np.errstate(all="ignore"):
        return _ref_divide(a, d, dtype)


def _ref_divide(a, d, dtype):
    if dtype == "bfloat16":
        return f32_to_bf16(bf16_to_f32(a) / np.float32(d))
    if dtype == "float16":
        return (a.astype(np.float32) / np.float32(d)).astype(np.float16)
    if dtype == "float32":
        return a / np.float32(d)
    if dtype == "float64":
        return a / np.float64(d)
    return (a.astype(np.int64) // d).astype(a.dtype)  # floor division, any divisor size


def is_nan(x, dtype):
    if dtype == "bfloat16":
        return (x & 0x7FFF) > 0x7F80
    if np.dtype(x.dtype).kind == "f":
        return np.isnan(x)
    return np.zeros(x.shape, dtype=bool)


def assert_same(got, want, dtype):
    """Bit-exact equality; NaNs only need to be NaN in the same places (payloads may vary)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    gn, wn = is_nan(got, dtype), is_nan(want, dtype)
    np.testing.assert_array_equal(gn, wn)
    bits = got.view(np.uint8).reshape(len(got), -1) if got.size else got.view(np.uint8)
    wbits = want.view(np.uint8).reshape(len(want), -1) if want.size else want.view(np.uint8)
    np.testing.assert_array_equal(bits[~gn], wbits[~wn])


# ---- data ----------------------------------------------------------------------------------


def storage(dtype):
    return np.dtype(STORAGE.get(dtype, dtype))


def random_data(rng, dtype, n, specials=True):
    if dtype in ("float16", "bfloat16"):
        # Finite values over the whole range (bfloat16 through float32 then rounding).
        mag = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 4, n)
        x = mag.astype(np.float32)
        out = f32_to_bf16(x) if dtype == "bfloat16" else x.astype(np.float16)
        if specials and n:
            sp = special_bits(dtype)
            idx = rng.integers(0, n, size=max(1, n // 50))
            out.view(np.uint16)[idx] = rng.choice(sp, size=idx.size)
        return out
    if dtype in ("float32", "float64"):
        x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)).astype(dtype)
        if specials and n:
            idx = rng.integers(0, n, size=max(1, n // 50))
            tiny = np.finfo(dtype).smallest_subnormal
            pool = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -3 * tiny], dtype=dtype)
            x[idx] = rng.choice(pool, size=idx.size)
        return x
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)


def special_bits(dtype):
    """NaN (quiet, signalling, negative), +-inf, +-0, subnormals, max/min normals."""
    if dtype == "float16":
        v = [0x7E00, 0x7C01, 0xFE00, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x8001,
             0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x0200]
    else:
        v = [0x7FC0, 0x7F81, 0xFFC0, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x8001,
             0x007F, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0x0040]
    return np.array(v, dtype=np.uint16)


def make(rng, dtype, n, offset=0, specials=True):
    """Random array of n elements starting `offset` elements into a larger buffer."""
    buf = np.empty(n + offset, dtype=storage(dtype))
    buf[offset:] = random_data(rng, dtype, n, specials).view(storage(dtype))
    return buf[offset:]


def kw(dtype):
    return {"dtype": "bfloat16"} if dtype == "bfloat16" else {}


@pytest.fixture(params=ISAS)
def isa(request):
    previous = reduce.active_isa()
    reduce.force_isa(request.param)
    yield request.param
    reduce.force_isa(previous)


# ---- references checked ----------------------------------------------------------------------


def test_float16_reference_is_numpy():
    rng = np.random.default_rng(0)
    a, b = make(rng, "float16", 200000), make(rng, "float16", 200000)
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    pairs = [(a, b), (every, every[rng.permutation(65536)]), (every, every[::-1].copy())]
    with np.errstate(all="ignore"):
        for x, y in pairs:
            assert_same(ref_add(x, y, "float16"), x + y, "float16")
            for d in (3, 7, 1000):  # d exactly representable in float16: same as NumPy
                assert_same(ref_divide(x, d, "float16"), x / np.float16(d), "float16")


@pytest.mark.parametrize(
    "f32_bits, bf16_bits",
    [
        (0x3F800000, 0x3F80),  # 1.0
        (0x3F808000, 0x3F80),  # tie, lower is even: down
        (0x3F818000, 0x3F82),  # tie, lower is odd: up
        (0x3F808001, 0x3F81),  # above the tie
        (0x3F807FFF, 0x3F80),  # below the tie
        (0x40490FDB, 0x4049),  # pi
        (0xC0490FDB, 0xC049),  # -pi
        (0x7F7FFFFF, 0x7F80),  # float32 max rounds to inf
        (0x7F7F7FFF, 0x7F7F),  # bfloat16 max stays
        (0x7F800000, 0x7F80),  # inf
        (0xFF800000, 0xFF80),  # -inf
        (0x7FC00000, 0x7FC0),  # quiet NaN
        (0x7F800001, 0x7FC0),  # signalling NaN with a low payload stays NaN
        (0xFFFFFFFF, 0xFFFF),  # negative NaN
        (0x80000000, 0x8000),  # -0.0
        (0x00008000, 0x0000),  # subnormal tie down to zero
        (0x00018000, 0x0002),  # subnormal tie, odd: up
    ],
)
def test_bfloat16_reference_hand_values(f32_bits, bf16_bits):
    x = np.array([f32_bits], dtype=np.uint32).view(np.float32)
    assert int(f32_to_bf16(x)[0]) == bf16_bits


# ---- sums --------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset1"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_into(isa, dtype, n, offset):
    rng = np.random.default_rng(n * 31 + offset)
    a, b = make(rng, dtype, n, offset), make(rng, dtype, n, offset)
    want = ref_add(a, b, dtype)
    b_before = b.copy()
    reduce.sum_into(a, b, **kw(dtype))
    assert_same(a, want, dtype)
    np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset1"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum3(isa, dtype, n, offset):
    rng = np.random.default_rng(n * 17 + offset)
    a, b = make(rng, dtype, n, offset), make(rng, dtype, n, offset)
    want = ref_add(a, b, dtype)
    dst = make(rng, dtype, n, 1 - offset)
    reduce.sum3(dst, a, b, **kw(dtype))
    assert_same(dst, want, dtype)
    # dst aliasing either input
    a2, b2 = a.copy(), b.copy()
    reduce.sum3(a2, a2, b, **kw(dtype))
    assert_same(a2, want, dtype)
    reduce.sum3(b2, a, b2, **kw(dtype))
    assert_same(b2, want, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_half_bit_pattern(isa, dtype):
    """All 65536 patterns (NaNs, infs, subnormals...) against shuffled partners."""
    rng = np.random.default_rng(5)
    every = np.arange(65536, dtype=np.uint16)
    if dtype == "float16":
        every = every.view(np.float16)
    for partner in (every[rng.permutation(65536)], every[::-1].copy(), every.copy()):
        dst = every.copy()
        with np.errstate(all="ignore"):
            want = ref_add(every, partner, dtype)
        reduce.sum_into(dst, partner, **kw(dtype))
        assert_same(dst, want, dtype)
    for d in (1, 3, 10):
        dst = every.copy()
        with np.errstate(all="ignore"):
            want = ref_divide(every, d, dtype)
        reduce.divide(dst, d, **kw(dtype))
        assert_same(dst, want, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_special_values(isa, dtype):
    sp = special_bits(dtype)
    a = np.repeat(sp, sp.size)  # every special against every special, 256 pairs
    b = np.tile(sp, sp.size)
    if dtype == "float16":
        a, b = a.view(np.float16), b.view(np.float16)
    with np.errstate(all="ignore"):
        want = ref_add(a, b, dtype)
    got = np.empty_like(a)
    reduce.sum3(got, a, b, **kw(dtype))
    assert_same(got, want, dtype)
    assert is_nan(got, dtype).any() and not is_nan(got, dtype).all()
    if dtype == "float16":
        one_ulp = np.array([0x0001, 0x0001], dtype=np.uint16).view(np.float16)
        reduce.sum_into(one_ulp, one_ulp.copy())  # subnormal + subnormal stays exact
        assert one_ulp.view(np.uint16).tolist() == [0x0002, 0x0002]
        big = np.full(20, 65504, dtype=np.float16)
        reduce.sum_into(big, big.copy())  # overflow -> inf
        assert np.isposinf(big).all()
        edge = np.full(21, 65504, dtype=np.float16)  # 65504 + 16 = 65520: tie -> inf (even)
        reduce.sum_into(edge, np.full(21, 16, dtype=np.float16))
        with np.errstate(over="ignore"):
            assert np.isposinf(edge).all() and np.isposinf(np.float16(65504) + np.float16(16))
        edge = np.full(21, 65504, dtype=np.float16)  # just below the tie stays finite
        reduce.sum_into(edge, np.full(21, 15.9921875, dtype=np.float16))
        assert (edge == 65504).all()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_integer_wraparound(isa, dtype):
    info = np.iinfo(dtype)
    n = 37  # SIMD body and tail
    a = np.full(n, info.max, dtype=dtype)
    reduce.sum_into(a, np.ones(n, dtype=dtype))
    assert (a == info.min).all()
    b = np.full(n, info.min, dtype=dtype)
    reduce.sum3(b, b, np.full(n, info.max, dtype=dtype))
    assert (b == -1 if info.min < 0 else b == info.max).all()
    c = np.full(n, info.max, dtype=dtype)
    reduce.sum_into(c, c.copy())
    assert (c == np.array(info.max, dtype=dtype) * 2).all()  # wraps like NumPy


# ---- divide ------------------------------------------------------------------------------------


@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 8, 1000, 2**40])
@pytest.mark.parametrize("n", [0, 1, 17, 1000, 100003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_divide(isa, dtype, n, divisor):
    rng = np.random.default_rng(n + divisor)
    x = make(rng, dtype, n, offset=n % 2)
    with np.errstate(all="ignore"):
        want = ref_divide(x, divisor, dtype)
    reduce.divide(x, divisor, **kw(dtype))
    assert_same(x, want, dtype)


def test_divide_matches_numpy_semantics(isa):
    ints = np.array([-7, -6, -5, -1, 0, 1, 5, 6, 7, -128, 127] * 3, dtype=np.int8)
    got = ints.copy()
    reduce.divide(got, 2)
    assert got.tolist() == (ints // 2).tolist()  # floor: -7 // 2 == -4
    assert got[0] == -4
    got = ints.copy()
    reduce.divide(got, 1000)  # wider than int8: 0 or -1
    assert got.tolist() == [int(v) // 1000 for v in ints]
    big = np.array([-(2**63), 2**63 - 1, -3, 3] * 5, dtype=np.int64)
    got = big.copy()
    reduce.divide(got, 3)
    assert got.tolist() == [int(v) // 3 for v in big]
    f = np.linspace(-100, 100, 1001, dtype=np.float32)
    got = f.copy()
    reduce.divide(got, 7)
    assert_same(got, f / 7, "float32")
    h = np.linspace(-100, 100, 1001).astype(np.float16)
    got = h.copy()
    reduce.divide(got, 7)
    assert_same(got, h / np.float16(7), "float16")
    with np.errstate(divide="ignore", invalid="ignore"):
        got = f.copy()
        reduce.divide(got, 0)  # floats: IEEE division by zero
        assert_same(got, f / np.float32(0), "float32")


# ---- dispatch and validation -------------------------------------------------------------------


def test_isa_listing_and_force():
    assert ISAS[-1] == "scalar"
    assert set(ISAS) <= {"avx512", "avx2", "scalar"}
    assert reduce.active_isa() == ISAS[0]  # best one is the default
    previous = reduce.active_isa()
    try:
        for name in ISAS:
            reduce.force_isa(name)
            assert reduce.active_isa() == name
        with pytest.raises(ValueError, match="not available"):
            reduce.force_isa("sse9")
    finally:
        reduce.force_isa(previous)
    assert reduce.active_isa() == previous


def test_validation_errors():
    f32 = np.zeros(8, dtype=np.float32)
    with pytest.raises(TypeError, match="supported: .*bfloat16"):
        reduce.sum_into(np.zeros(8, np.complex64), np.zeros(8, np.complex64))
    with pytest.raises(TypeError, match="supported"):
        reduce.sum_into(np.zeros(8, np.uint16), np.zeros(8, np.uint16))
    with pytest.raises(TypeError, match="supported"):
        reduce.sum_into(f32, f32.copy(), dtype="float8")
    with pytest.raises(TypeError, match="mismatch"):
        reduce.sum_into(f32, np.zeros(8, np.int32))
    with pytest.raises(TypeError):  # lists are not converted (dst would be a temporary)
        reduce.sum_into([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="size mismatch"):
        reduce.sum_into(f32, np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="size mismatch"):
        reduce.sum3(f32, f32.copy(), np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        reduce.sum_into(np.zeros(16, np.float32)[::2], f32)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        reduce.sum_into(ro, f32)
    reduce.sum_into(f32, ro)  # a read-only source is fine
    raw = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="aligned"):
        reduce.sum_into(raw[1:33], raw[32:64].copy(), dtype="float32")
    with pytest.raises(ValueError, match="whole number"):
        reduce.sum_into(np.zeros(6, np.uint8), np.zeros(6, np.uint8), dtype="float32")
    buf = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        reduce.sum_into(buf[:8], buf[4:12])
    with pytest.raises(ValueError, match="positive"):
        reduce.divide(np.zeros(4, np.int32), 0)
    with pytest.raises(ValueError, match="positive"):
        reduce.divide(np.zeros(4, np.int32), -2)


def test_dtype_override_only_needs_byte_sizes():
    a = np.arange(8, dtype=np.float32)
    b = np.ones(32, dtype=np.uint8).view(np.float32).copy()  # 32 bytes of float32 bits
    reduce.sum_into(a.view(np.uint8), b.view(np.uint8), dtype="float32")
    np.testing.assert_array_equal(a, np.arange(8, dtype=np.float32) + b)
    x = f32_to_bf16(np.array([1.5, -2.0, 3.0], dtype=np.float32))
    y = f32_to_bf16(np.array([0.25, 0.5, 1e10], dtype=np.float32))
    reduce.sum_into(x, y, dtype="bfloat16")
    np.testing.assert_array_equal(bf16_to_f32(x), np.array([1.75, -1.5, 9999220736.0], np.float32))


# ---- property ----------------------------------------------------------------------------------

PROP_DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bfloat16"]


@st.composite
def operand_pairs(draw):
    dtype = draw(st.sampled_from(PROP_DTYPES))
    n = draw(st.integers(0, 300))
    dt = storage(dtype)
    arrays = hnp.arrays(dt, n, elements=hnp.from_dtype(dt))
    return dtype, draw(arrays), draw(arrays), draw(st.integers(1, 1000))


@settings(max_examples=200, deadline=None)
@given(operand_pairs())
def test_property_all_isas_agree_with_reference(case):
    dtype, a, b, divisor = case
    previous = reduce.active_isa()
    try:
        with np.errstate(all="ignore"):
            want = ref_add(a, b, dtype)
            want_div = ref_divide(want, divisor, dtype)
        for name in ISAS:
            reduce.force_isa(name)
            got = np.empty_like(a)
            reduce.sum3(got, a, b, **kw(dtype))
            assert_same(got, want, dtype)
            got2 = a.copy()
            reduce.sum_into(got2, b, **kw(dtype))
            assert_same(got2, want, dtype)
            reduce.divide(got2, divisor, **kw(dtype))
            assert_same(got2, want_div, dtype)
    finally:
        reduce.force_isa(previous)


# ------------------------------------------------------------------------ streaming copy --


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 3000), dst_off=st.integers(0, 127), src_off=st.integers(0, 127))
def test_copy_streaming_any_length_and_alignment(n, dst_off, src_off):
    """reduce::CopyStreaming (large outputs of the worker): a memcpy for every length and
    misalignment of either side (unaligned head, 64-byte body, tail), touching nothing else."""
    rng = np.random.default_rng(n * 131 + dst_off * 7 + src_off)
    src_buf = rng.integers(0, 256, n + src_off, dtype=np.uint8)
    dst_buf = np.full(n + dst_off + 64, 0xAB, np.uint8)
    src = src_buf[src_off:]
    dst = dst_buf[dst_off:dst_off + n]
    reduce.copy_streaming(dst, src)
    assert np.array_equal(dst, src)
    assert (dst_buf[:dst_off] == 0xAB).all() and (dst_buf[dst_off + n:] == 0xAB).all()


def test_copy_streaming_large_and_typed():
    """A 9 MiB float32 copy (the size the pipeline streams), and the argument checks."""
    src = np.arange((9 << 20) // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    reduce.copy_streaming(dst, src)
    assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="size mismatch"):
        reduce.copy_streaming(dst[:-1], src)
    with pytest.raises(ValueError, match="overlaps"):
        reduce.copy_streaming(src[1:], src[:-1])
    with pytest.raises(ValueError, match="writable"):
        ro = np.zeros_like(src)
        ro.flags.writeable = False
        reduce.copy_streaming(ro, src)
