"""Tests of the core's gradient compressors (core/cpp/compress/, upstream BytePS's onebit, topk,
randomk, dithering, an fp16 cast, vanilla error feedback and nesterov momentum) through
``byteps._core_testing.Compressor``.

* Every compressor x dtype (float16/32/64) x parameters x chain (plain, error feedback,
  momentum, both; worker and server side): over several calls with changing scale and
  learning rate, the decoded values *equal* the NumPy reference's (tests/compression_reference.py:
  same operations, same order, same random stream), NaN for NaN. (Upstream's tests allow
  float32 eps; equality is stronger.)
* DecompressAdd equals the reference's add of the decoded values; encoded sizes (onebit n/8 +
  scale, k pairs, 2n for fp16, dithering within its worst-case bound, which a constant
  tensor reaches); special values (zeros, -0.0, ties, NaN, inf, subnormals); topk's tie order;
  the xorshift128+ stream against upstream's formula written independently.
* kwargs: format / parse / validate, each bad key or value an InvalidArgumentError naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
from compression_reference import (
    XorShift128Plus,
    dithering_max_bytes,
    encoded_nbytes,
    reference_compressor,
    sparse_k,
)
from testing_hooks import core_testing

from byteps.errors import InvalidArgumentError, InvalidTypeError

T = core_testing()

DTYPES = ["float16", "float32", "float64"]

BASES = {
    "onebit": {"compressor_type": "onebit"},
    "onebit_scaled": {"compressor_type": "onebit", "compressor_onebit_scaling": "True"},
    "topk_1": {"compressor_type": "topk", "compressor_k": "1"},
    "topk_5": {"compressor_type": "topk", "compressor_k": "5"},
    "topk_frac": {"compressor_type": "topk", "compressor_k": "0.1"},
    "randomk_3": {"compressor_type": "randomk", "compressor_k": "3", "seed": "2020"},
    "randomk_frac": {"compressor_type": "randomk", "compressor_k": "0.05", "seed": "7"},
    "dither_lin_max": {"compressor_type": "dithering", "compressor_k": "4", "seed": "11"},
    "dither_lin_l2": {"compressor_type": "dithering", "compressor_k": "8", "seed": "12",
                      "dithering_normalize": "1"},
    "dither_nat_max": {"compressor_type": "dithering", "compressor_k": "2", "seed": "13",
                       "dithering_partition": "1"},
    "dither_nat_l2": {"compressor_type": "dithering", "compressor_k": "4", "seed": "14",
                      "dithering_partition": "1", "dithering_normalize": "1"},
    "fp16": {"compressor_type": "fp16"},
}
CHAINS = {
    "plain": {},
    "ef": {"ef_type": "vanilla"},
    "momentum": {"momentum_type": "nesterov", "momentum_mu": "0.9"},
    "ef_momentum": {"ef_type": "vanilla", "momentum_type": "nesterov", "momentum_mu": "0.5"},
}
# (scale, lr) per call: averaging scales, a learning rate that changes, then is unknown.
CALLS = [(1.0, 0.1), (0.5, 0.1), (1.0 / 3, 0.05), (1.0, 0.0), (0.25, 0.2)]


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = np.flatnonzero(~same)
        raise AssertionError(
            f"{what}: {len(i)} of {len(got)} differ, first at {i[:5]}: "
            f"core {got[i[:5]]} reference {want[i[:5]]}")


def data(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    return rng.standard_normal(n).astype(dtype)


def run_chain(kwargs, side, dtype, xs, calls=CALLS):
    """Compresses each x with the core and the reference; compares decoded values."""
    n = len(xs[0])
    core = T.Compressor(kwargs, side, dtype, n)
    ref = reference_compressor(kwargs, side, dtype, n)
    for step, (x, (scale, lr)) in enumerate(zip(xs, calls)):
        enc = core.compress(x, scale=scale, lr=lr)
        assert len(enc) <= core.max_encoded_bytes
        size = encoded_nbytes(kwargs, dtype, n)
        if size is not None:
            assert len(enc) == size == core.max_encoded_bytes
        got = core.decompress(enc)
        want = ref.roundtrip(x, scale=scale, lr=lr)
        assert_same(got, want, f"{kwargs} {side} {dtype} step {step}")
        y = x[::-1].copy()
        assert_same(core.decompress_add(enc, y), ref.decode_add(want, y),
                    f"decompress_add {kwargs} {dtype} step {step}")
    return core, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chain", sorted(CHAINS))
@pytest.mark.parametrize("base", sorted(BASES))
def test_matches_reference(base, chain, dtype):
    rng = np.random.default_rng(hash((base, chain, dtype)) % 2**32)
    kwargs = {**BASES[base], **CHAINS[chain]}
    n = 1003 if "dither" in base else 4099
    xs = [data(rng, n, dtype) for _ in CALLS]
    run_chain(kwargs, "worker", dtype, xs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("base", ["onebit_scaled", "topk_5", "randomk_3", "dither_nat_max"])
def test_server_side_has_no_momentum(base, dtype):
    rng = np.random.default_rng(5)
    kwargs = {**BASES[base], **CHAINS["ef_momentum"]}
    xs = [data(rng, 517, dtype) for _ in CALLS]
    server, _ = run_chain(kwargs, "server", dtype, xs)
    # The same calls through an error-feedback-only chain give the same encodings.
    ef_only = T.Compressor({**BASES[base], "ef_type": "vanilla"}, "server", dtype, 517)
    again = T.Compressor(kwargs, "server", dtype, 517)
    for x, (scale, lr) in zip(xs, CALLS):
        assert again.compress(x, scale, lr) == ef_only.compress(x, scale, lr)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 31, 33, 48, 63, 100003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sizes_and_tails(n, dtype):
    """Element counts around the 8-, 16- and 32-element blocks of the vectorised loops (and
    one that runs the AVX2 loop, then the SSE2 loop, then the scalar tail)."""
    rng = np.random.default_rng(n)
    for base in ("onebit_scaled", "onebit", "topk_1", "randomk_3", "fp16", "dither_lin_max"):
        xs = [data(rng, n, dtype) for _ in range(2)]
        run_chain({**BASES[base], "ef_type": "vanilla"}, "worker", dtype, xs, CALLS[:2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("base", ["dither_lin_max", "dither_lin_l2", "dither_nat_max",
                                  "dither_nat_l2"])
def test_dithering_long_partitions(base, dtype):
    """Several 2048-element chunks and a tail: where the CPU has AVX-512 the float32 encoder
    draws 2048 at a time (8 jumped sub-streams), which must still be the stream's draws in
    element order, continuing across calls."""
    rng = np.random.default_rng(len(base))
    xs = [data(rng, 3 * 2048 + 101, dtype) for _ in range(2)]
    run_chain(BASES[base], "worker", dtype, xs, CALLS[:2])


def special_values(dtype: str) -> np.ndarray:
    info = np.finfo(dtype)
    vals = [0.0, -0.0, 1.0, -1.0, 1.0, -1.0, 2.0, -2.0, 0.5, info.tiny, -info.tiny,
            info.smallest_subnormal, -info.smallest_subnormal, info.max, -info.max,
            3.0, -3.0, 3.0, 0.25]
    return np.array(vals * 3, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("base", sorted(BASES))
def test_special_values(base, dtype):
    """Zeros, signed zeros, ties, subnormals, the largest finite values; then inf and NaN
    (the core must not crash, and still agrees with the reference)."""
    x = special_values(dtype)
    run_chain(BASES[base], "worker", dtype, [x, x[::-1].copy()], CALLS[:2])
    zeros = np.zeros(40, dtype)
    run_chain({**BASES[base], "ef_type": "vanilla"}, "worker", dtype, [zeros, zeros], CALLS[:2])
    with np.errstate(all="ignore"):
        bad = x.copy()
        bad[[3, 10]] = np.inf
        bad[[5, 20]] = np.nan
        bad_end = x.copy()
        bad_end[-1] = np.nan
    run_chain(BASES[base], "worker", dtype, [bad, bad_end], CALLS[:2])


def test_topk_tie_order_is_upstreams_heap():
    """Many equal |x| at the threshold: the kept indices are those of upstream's heap."""
    x = np.array([1, -1, 1, 2, -1, 1, 1, -2, 1, -1, 1, 1, 3, 1, -1, 1], np.float32)
    for k in range(1, 12):
        kwargs = {"compressor_type": "topk", "compressor_k": str(k)}
        run_chain(kwargs, "worker", "float32", [x, -x], CALLS[:2])
    # An element never displaces an equal one seen before it.
    core = T.Compressor({"compressor_type": "topk", "compressor_k": "1"}, "worker", "float32", 4)
    out = core.decompress(core.compress(np.array([1, 2, -2, 2], np.float32)))
    assert out.tolist() == [0, 2, 0, 0]


def sent_indices(enc: bytes, dtype: str) -> np.ndarray:
    k = len(enc) // (4 + np.dtype(dtype).itemsize)
    return np.frombuffer(enc[: 4 * k], np.uint32)


@pytest.mark.parametrize("case", ["normal", "sample_misses_top", "sample_overestimates",
                                  "tie", "nan"])
def test_topk_selection_paths(case):
    """Large tensors take the sampled one-pass selection, fall back to the histogram when the
    sample misleads, and to upstream's heap on a tie at the threshold or a NaN; the decoded
    values are the reference's on every path, the pairs in index order off the heap."""
    n = 1 << 18
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n).astype(np.float32)
    pos = np.arange(n)
    if case == "sample_misses_top":  # the sample reads the first 256 of every 4096
        x[pos % 4096 >= 256] *= 100
    elif case == "sample_overestimates":
        x[pos % 4096 < 16] *= 100
    elif case == "tie":
        x[rng.choice(n, 5000, replace=False)] = 2.6  # the threshold of k = 0.01
    elif case == "nan":
        x[12345] = np.nan
    for k in ("0.001", "0.01", "0.2"):
        kwargs = {"compressor_type": "topk", "compressor_k": k}
        core = T.Compressor(kwargs, "worker", "float32", n)
        enc = core.compress(x)
        want = reference_compressor(kwargs, "worker", "float32", n).roundtrip(x)
        assert_same(core.decompress(enc), want, f"{case} k={k}")
        idx = sent_indices(enc, "float32")
        tied = np.sort(np.abs(x))[-len(idx)] == np.float32(2.6)
        assert tied == (case == "tie" and k == "0.01")
        if case != "nan" and not tied:
            assert (np.diff(idx.astype(np.int64)) > 0).all()


def test_topk_k_larger_than_partition_keeps_everything():
    rng = np.random.default_rng(3)
    for k in ("5", "100", "4294967295"):
        x = data(rng, 5, "float32")
        core = T.Compressor({"compressor_type": "topk", "compressor_k": k}, "worker", "float32", 5)
        assert_same(core.decompress(core.compress(x)), x)
        assert core.max_encoded_bytes == 5 * 8


@pytest.mark.parametrize("k,count,dtype,want", [
    ("0.1", 4099, "float32", 409), ("0.5", 3, "float16", 1), ("0.001", 10, "float64", 1),
    ("0.3", 1000, "float32", 300), ("7", 1000, "float64", 7), ("7.0", 3, "float32", 3)])
def test_sparse_k(k, count, dtype, want):
    kwargs = {"compressor_type": "topk", "compressor_k": k}
    assert sparse_k(kwargs, dtype, count) == want
    es = np.dtype(dtype).itemsize
    assert T.Compressor(kwargs, "worker", dtype, count).max_encoded_bytes == want * (4 + es)


def test_xorshift128plus_is_upstreams():
    """The stream of upstream's tests/utils.py (uint64 NumPy arithmetic), written again."""
    state = np.array([2020, 2020], dtype=np.uint64)

    def upstream_next():
        t, s = state[0], state[1]
        state[0] = s
        t ^= t << np.uint64(23)
        t ^= t >> np.uint64(17)
        t ^= s ^ (s >> np.uint64(26))
        state[1] = t
        return int(t + s)

    ref = XorShift128Plus(2020)
    with np.errstate(over="ignore"):
        want = [upstream_next() for _ in range(1000)]
    assert ref.draws(1000).tolist() == want
    # The core's randomk draws index = next() % n from the same stream: with k = n draws of a
    # tensor of distinct values, every sent index shows.
    n = 1 << 20
    kwargs = {"compressor_type": "randomk", "compressor_k": "64", "seed": "2020"}
    core = T.Compressor(kwargs, "worker", "float64", n)
    x = np.arange(1, n + 1, dtype=np.float64)
    got = np.flatnonzero(core.decompress(core.compress(x)))
    idx = XorShift128Plus(2020).draws(64) % np.uint64(n)
    assert got.tolist() == sorted(set(idx.tolist()))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dithering_draws_compare_as_double(dtype):
    """Bernoulli(p) is double(draw) < p * (2^64 - 1) as double (upstream's C++): with one
    level, a scale of 1 and p placed just above or at/below each draw's double value, the
    decoded 0 / 1 pattern follows from the stream alone."""
    n = 2001
    draws = XorShift128Plus(77).draws(n).astype(np.float64) / 2.0**64
    x = np.zeros(n, dtype)
    x[0] = 1.0  # the max: scale 1, normalized = |x|, p = |x| (its draw is used, q = 1)
    up = np.arange(n) % 2 == 1
    ftype = np.dtype(dtype).type
    below = draws.astype(dtype)
    below = np.where(below.astype(np.float64) > draws, np.nextafter(below, ftype(0)), below)
    above = np.nextafter(below, ftype(1))
    x[1:] = np.where(up, above, below)[1:]
    keep = x.astype(np.float64) < 1.0  # (a draw that rounds to 2^64 never compares below)
    keep[0] = True
    x[~keep] = 0.0
    want = np.where(up & keep, 1.0, 0.0)
    want[0] = 1.0
    kwargs = {"compressor_type": "dithering", "compressor_k": "1", "seed": "77"}
    core = T.Compressor(kwargs, "worker", dtype, n)
    got = core.decompress(core.compress(x))
    assert_same(got, want.astype(dtype))
    assert_same(got, reference_compressor(kwargs, "worker", dtype, n).roundtrip(x))


def test_randomk_without_seed_is_random():
    kwargs = {"compressor_type": "randomk", "compressor_k": "16"}
    x = np.arange(1, 1 << 20, dtype=np.float32)
    a = T.Compressor(kwargs, "worker", "float32", len(x)).compress(x)
    b = T.Compressor(kwargs, "worker", "float32", len(x)).compress(x)
    assert a != b
    with pytest.raises(ValueError):
        reference_compressor(kwargs, "worker", "float32", 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("partition,k", [("0", 1), ("0", 7), ("0", 255), ("1", 1), ("1", 5),
                                         ("1", 31)])
def test_dithering_worst_case_bound_is_reached(partition, k, dtype):
    """A constant tensor puts every element at the top level with gap 1: the bound exactly."""
    kwargs = {"compressor_type": "dithering", "compressor_k": str(k), "seed": "9",
              "dithering_partition": partition}
    n = 1001
    core = T.Compressor(kwargs, "worker", dtype, n)
    assert core.max_encoded_bytes == dithering_max_bytes(kwargs, dtype, n)
    x = np.full(n, -0.75, dtype)
    enc = core.compress(x)
    assert len(enc) == core.max_encoded_bytes
    assert_same(core.decompress(enc), x)
    run_chain(kwargs, "worker", dtype, [x, data(np.random.default_rng(k), n, dtype)], CALLS[:2])


def test_onebit_encoding_layout():
    x = np.array([-1, 2, -0.0, np.nan, -3, 4, 5, -6, 7], np.float32)
    core = T.Compressor({"compressor_type": "onebit"}, "worker", "float32", 9)
    enc = core.compress(x)
    assert np.frombuffer(enc[:4], np.float32)[0] == 1.0
    assert enc[4:] == bytes([0b10010001, 0])  # bit i of byte i/8 set for x < 0
    assert core.decompress(enc).tolist() == [-1, 1, 1, 1, -1, 1, 1, -1, 1]
    scaled = T.Compressor({"compressor_type": "onebit", "compressor_onebit_scaling": "1"},
                          "worker", "float64", 4)
    enc = scaled.compress(np.array([1, -2, 3, -6], np.float64))
    assert len(enc) == 8 + 1 and np.frombuffer(enc[:8], np.float64)[0] == 3.0


def test_error_feedback_learning_rate_correction():
    """error *= prev_lr / lr: the decoded sum over steps follows the reference's."""
    kwargs = {"compressor_type": "topk", "compressor_k": "2", "ef_type": "vanilla"}
    rng = np.random.default_rng(1)
    calls = [(1.0, 0.1), (1.0, 0.05), (1.0, 0.05), (1.0, -1.0), (1.0, 0.5), (1.0, 0.25)]
    xs = [data(rng, 64, "float32") for _ in calls]
    run_chain(kwargs, "worker", "float32", xs, calls)
    # Without the correction the error would be carried unscaled: a different answer.
    ref = reference_compressor(kwargs, "worker", "float32", 64)
    flat = reference_compressor(kwargs, "worker", "float32", 64)
    a = [ref.roundtrip(x, 1.0, lr) for x, (_, lr) in zip(xs, calls)]
    b = [flat.roundtrip(x, 1.0, 0.0) for x in xs]
    assert any(not np.array_equal(u, v) for u, v in zip(a, b))


def test_fp16_large_output_streamed_exactly():
    """Outputs of 4 MiB and more take the non-temporal-store path: still NumPy's rounding,
    specials included, whatever the element count's remainder."""
    n = (1 << 21) + 13
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(n) * 1e3).astype(np.float32)
    x[:6] = [np.inf, -np.inf, np.nan, 65520.0, 6e-8, -0.0]
    x[-3:] = [1e-30, 70000.0, 2.0 ** -14]
    core = T.Compressor({"compressor_type": "fp16"}, "worker", "float32", n)
    enc = core.compress(x)
    assert enc == x.astype(np.float16).tobytes()
    # the decode of 8 MiB of float32 streams too, from any alignment of the output
    dec = core.decompress(enc)
    np.testing.assert_array_equal(dec, x.astype(np.float16).astype(np.float32))


def test_learning_rate_value():
    before = T.learning_rate()
    try:
        T.set_learning_rate(0.125)
        assert T.learning_rate() == 0.125
    finally:
        T.set_learning_rate(before)


def test_array_arguments_checked():
    core = T.Compressor({"compressor_type": "fp16"}, "worker", "float32", 8)
    with pytest.raises(InvalidTypeError, match="float64"):
        core.compress(np.zeros(8, np.float64))
    with pytest.raises(InvalidArgumentError, match="7 elements"):
        core.compress(np.zeros(7, np.float32))
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        core.compress(np.zeros(16, np.float32)[::2])
    with pytest.raises(InvalidArgumentError, match="not finite"):
        core.compress(np.zeros(8, np.float32), scale=float("nan"))
    with pytest.raises(InvalidArgumentError, match="side"):
        T.Compressor({"compressor_type": "fp16"}, "both", "float32", 8)
    with pytest.raises(InvalidArgumentError, match="0 elements"):
        T.Compressor({"compressor_type": "fp16"}, "worker", "float32", 0)
    with pytest.raises(InvalidArgumentError, match="no compressor_type"):
        T.Compressor({}, "worker", "float32", 8)
    with pytest.raises(InvalidTypeError):
        T.Compressor({"compressor_type": 1}, "worker", "float32", 8)
    with pytest.raises(InvalidArgumentError, match="2\\^32"):
        T.Compressor({"compressor_type": "topk", "compressor_k": "1"}, "worker", "float32",
                     1 << 32)


@pytest.mark.parametrize("kwargs,dtype", [
    ({"compressor_type": "onebit"}, "float32"), ({"compressor_type": "topk",
                                                  "compressor_k": "3"}, "float64"),
    ({"compressor_type": "dithering", "compressor_k": "3", "seed": "1"}, "float16"),
    ({"compressor_type": "fp16"}, "float16")])
def test_decoders_refuse_malformed(kwargs, dtype):
    core = T.Compressor(kwargs, "worker", dtype, 20)
    enc = core.compress(np.linspace(-1, 1, 20).astype(dtype))
    for bad in (b"", enc[:-1], enc + b"\0", enc * 2):
        with pytest.raises(InvalidArgumentError):
            core.decompress(bad)
        with pytest.raises(InvalidArgumentError):
            core.decompress_add(bad, np.zeros(20, dtype))


def test_sparse_decoders_check_indices():
    core = T.Compressor({"compressor_type": "topk", "compressor_k": "2"}, "worker", "float32", 10)
    enc = np.array([3, 10], np.uint32).tobytes() + np.array([1, 2], np.float32).tobytes()
    with pytest.raises(InvalidArgumentError, match="index 10"):
        core.decompress(enc)
    # A repeated index takes its last value, in Decompress and DecompressAdd alike.
    enc = np.array([3, 3], np.uint32).tobytes() + np.array([1, 2], np.float32).tobytes()
    assert core.decompress(enc)[3] == 2
    assert core.decompress_add(enc, np.ones(10, np.float32))[3] == 3


def test_decoding_runs_concurrently_with_compress():
    """Decompress / DecompressAdd read no state Compress writes: threads decoding one
    instance's encodings while it compresses get the single-threaded answers."""
    from concurrent.futures import ThreadPoolExecutor

    n = 1 << 16
    rng = np.random.default_rng(4)
    for base in ("randomk_frac", "dither_lin_max", "onebit_scaled", "topk_frac"):
        kwargs = {**BASES[base], "ef_type": "vanilla"}
        core = T.Compressor(kwargs, "worker", "float32", n)
        encs = [core.compress(data(rng, n, "float32")) for _ in range(4)]
        base_sum = data(rng, n, "float32")
        want = [(core.decompress(e), core.decompress_add(e, base_sum)) for e in encs]

        def decode(i, core=core, encs=encs, base_sum=base_sum):
            e = encs[i % 4]
            return i % 4, core.decompress(e), core.decompress_add(e, base_sum)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(decode, i) for i in range(32)]
            for _ in range(8):
                core.compress(data(rng, n, "float32"))
            for f in futures:
                i, got, added = f.result()
                assert_same(got, want[i][0], base)
                assert_same(added, want[i][1], base)


# ---- kwargs --------------------------------------------------------------------------------


def test_format_and_parse_spec():
    kw = {"compressor_type": "topk", "compressor_k": "0.01", "ef_type": "vanilla"}
    spec = T.format_spec(kw)
    assert spec == "compressor_k=0.01;compressor_type=topk;ef_type=vanilla"
    assert T.parse_spec(spec) == kw
    assert T.parse_spec("") == {} and T.format_spec({}) == ""
    assert T.parse_spec("a=") == {"a": ""}


@pytest.mark.parametrize("spec,match", [
    ("a=1;a=2", "repeats"), ("=1", "empty key"), ("a=1=2", "'='"), ("a", "not key=value"),
    ("a=1;", "not key=value"), (";a=1", "not key=value"), ("a=\x01", "control"),
    (";".join(f"k{i}=v" for i in range(65)), "more than 64"), ("a=" + "x" * 4095, "longer")])
def test_parse_spec_refuses(spec, match):
    with pytest.raises(InvalidArgumentError, match=match):
        T.parse_spec(spec)


def test_parse_spec_limits_accepted():
    many = ";".join(f"k{i:02d}=v" for i in range(64))
    assert len(T.parse_spec(many)) == 64
    assert len(T.parse_spec("a=" + "x" * 4094)["a"]) == 4094


GOOD = [
    {},
    {"compressor_type": "onebit", "compressor_onebit_scaling": "FALSE", "seed": "0"},
    {"compressor_type": "onebit", "compressor_onebit_scaling": "true", "compressor_k": "3"},
    {"compressor_type": "topk", "compressor_k": "0.5"},
    {"compressor_type": "topk", "compressor_k": "1e3", "ef_type": "vanilla"},
    {"compressor_type": "randomk", "compressor_k": "4294967295", "seed": "18446744073709551615"},
    {"compressor_type": "dithering", "compressor_k": "31", "dithering_partition": "1",
     "dithering_normalize": "1"},
    {"compressor_type": "dithering", "compressor_k": "16777216"},
    {"compressor_type": "fp16", "momentum_type": "nesterov", "momentum_mu": "0"},
    {"compressor_type": "fp16", "momentum_type": "nesterov", "momentum_mu": "0.999",
     "ef_type": "vanilla"},
    {"momentum_mu": "0.9", "seed": "5", "dithering_partition": "0"},
]


@pytest.mark.parametrize("kwargs", GOOD)
@pytest.mark.parametrize("dtype", DTYPES)
def test_validate_accepts(kwargs, dtype):
    T.validate(kwargs, dtype)


BAD = [
    ({"compressor": "onebit"}, "unknown compressor kwarg 'compressor'"),
    ({"compressor_type": "twobit"}, "compressor_type"),
    ({"compressor_type": ""}, "compressor_type"),
    ({"compressor_type": "topk"}, "compressor_k is required"),
    ({"compressor_type": "randomk", "seed": "1"}, "compressor_k is required"),
    ({"compressor_type": "dithering"}, "compressor_k is required"),
    ({"compressor_type": "topk", "compressor_k": "0"}, "compressor_k"),
    ({"compressor_type": "topk", "compressor_k": "-1"}, "compressor_k"),
    ({"compressor_type": "topk", "compressor_k": "2.5"}, "compressor_k"),
    ({"compressor_type": "topk", "compressor_k": "nan"}, "compressor_k"),
    ({"compressor_type": "topk", "compressor_k": "inf"}, "compressor_k"),
    ({"compressor_type": "topk", "compressor_k": " 3"}, "compressor_k"),
    ({"compressor_type": "topk", "compressor_k": "4294967296"}, "compressor_k"),
    ({"compressor_type": "onebit", "compressor_k": "x"}, "compressor_k"),
    ({"compressor_type": "dithering", "compressor_k": "0.5"}, "compressor_k"),
    ({"compressor_type": "dithering", "compressor_k": "0"}, "compressor_k"),
    ({"compressor_type": "dithering", "compressor_k": "32", "dithering_partition": "1"},
     "compressor_k"),
    ({"compressor_type": "dithering", "compressor_k": "16777217"}, "compressor_k"),
    ({"compressor_type": "onebit", "compressor_onebit_scaling": "yes"},
     "compressor_onebit_scaling"),
    ({"compressor_type": "randomk", "compressor_k": "1", "seed": "-1"}, "seed"),
    ({"compressor_type": "randomk", "compressor_k": "1", "seed": "1.5"}, "seed"),
    ({"compressor_type": "randomk", "compressor_k": "1", "seed": "18446744073709551616"},
     "seed"),
    ({"compressor_type": "dithering", "compressor_k": "2", "dithering_partition": "2"},
     "dithering_partition"),
    ({"compressor_type": "dithering", "compressor_k": "2", "dithering_normalize": "l2"},
     "dithering_normalize"),
    ({"compressor_type": "onebit", "ef_type": "sparse"}, "ef_type"),
    ({"ef_type": "vanilla"}, "ef_type.*needs a compressor_type"),
    ({"compressor_type": "onebit", "momentum_type": "heavyball", "momentum_mu": "0.9"},
     "momentum_type"),
    ({"compressor_type": "onebit", "momentum_type": "nesterov"}, "momentum_type.*momentum_mu"),
    ({"momentum_type": "nesterov", "momentum_mu": "0.9"}, "momentum_type.*compressor_type"),
    ({"compressor_type": "onebit", "momentum_type": "nesterov", "momentum_mu": "1"},
     "momentum_mu"),
    ({"compressor_type": "onebit", "momentum_type": "nesterov", "momentum_mu": "-0.1"},
     "momentum_mu"),
    ({"compressor_type": "onebit", "seed": "1;2"}, "seed"),
]


@pytest.mark.parametrize("kwargs,match", BAD)
def test_validate_refuses_naming_the_key(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        T.validate(kwargs, "float32")
    with pytest.raises(InvalidArgumentError, match=match):
        T.Compressor(kwargs, "worker", "float32", 16)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64", "bfloat16"])
def test_compressors_take_floats_only(dtype):
    with pytest.raises(InvalidArgumentError, match=f"compressor_type.*not {dtype}"):
        T.validate({"compressor_type": "fp16"}, dtype)
    T.validate({"seed": "3"}, dtype)  # no compressor: nothing to refuse


def test_throughput_helper():
    c, d = T.compressor_throughput({"compressor_type": "onebit"}, "float32", 4096, 0.02)
    assert c > 0 and d > 0
    with pytest.raises(InvalidArgumentError):
        T.compressor_throughput({"compressor_type": "onebit"}, "float32", 4096, 0)
