"""Fuzz of the compressors' decoders (core/cpp/compress/): encodings come from peers, so every
byte string must decode to count() values or raise InvalidArgumentError -- never crash, hang,
or raise anything else.

* Valid encodings of every compressor and dtype, mutated: truncated, extended, bits flipped,
  bytes overwritten, header fields (onebit / dithering scale, dithering bit count) and sparse
  indices set to boundary and huge values, random byte strings of every length near the
  valid ones.
* Whatever decodes also decodes through DecompressAdd, to the same values (onto zeros).
* dithering streams built here from (gap, sign, level) triples by the wire format's rules
  (Elias-delta, most significant bit first): the decoder returns exactly the values they
  specify, and refuses those whose indices or levels are out of range.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testing_hooks import core_testing

from byteps.errors import InvalidArgumentError

T = core_testing()

CONFIGS = {
    "onebit": {"compressor_type": "onebit", "compressor_onebit_scaling": "true"},
    "topk": {"compressor_type": "topk", "compressor_k": "0.2"},
    "randomk": {"compressor_type": "randomk", "compressor_k": "5", "seed": "3"},
    "dither_lin": {"compressor_type": "dithering", "compressor_k": "5", "seed": "4"},
    "dither_nat": {"compressor_type": "dithering", "compressor_k": "7", "seed": "5",
                   "dithering_partition": "1", "dithering_normalize": "1"},
    "fp16": {"compressor_type": "fp16"},
}
DTYPES = ["float16", "float32", "float64"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode_or_refuse(core, data: bytes):
    """Decompress and DecompressAdd agree, or both raise InvalidArgumentError."""
    try:
        got = core.decompress(data)
    except InvalidArgumentError:
        with pytest.raises(InvalidArgumentError):
            core.decompress_add(data, np.zeros(core.count, core.dtype))
        return None
    assert got.shape == (core.count,) and got.dtype == np.dtype(core.dtype)
    added = core.decompress_add(data, np.zeros(core.count, core.dtype))
    same = (added == got) | (np.isnan(added) & np.isnan(got))
    assert same.all()
    return got


def mutations(rng: np.random.Generator, enc: bytes, core, name: str):
    """Mutated copies of a valid encoding."""
    n = len(enc)
    yield enc[: rng.integers(0, n + 1)]
    yield enc + rng.bytes(int(rng.integers(1, 16)))
    yield rng.bytes(n)
    yield rng.bytes(int(rng.integers(0, 2 * n + 2)))
    b = bytearray(enc)
    for _ in range(int(rng.integers(1, 8))):
        if b:
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
    yield bytes(b)
    if name.startswith("dither") and n >= 8:
        for bits in (0, 1, 7, (n - 12) * 8, (n - 12) * 8 + 1, 2**32, 2**63, 2**64 - 1,
                     int(rng.integers(0, 2**63))):
            yield struct.pack("<Q", bits) + enc[8:]
        for scale in (np.nan, np.inf, -np.inf, -1.0, 0.0, 1e38):
            width = "<d" if core.dtype == "float64" else "<f"
            yield enc[:8] + struct.pack(width, scale) + enc[8 + struct.calcsize(width):]
    if name == "onebit":
        width = "<d" if core.dtype == "float64" else "<f"
        for scale in (np.nan, np.inf, -np.inf, -2.5, 0.0):
            yield struct.pack(width, scale) + enc[struct.calcsize(width):]
    if name in ("topk", "randomk"):
        k = len(enc) // (4 + np.dtype(core.dtype).itemsize)
        for idx in (core.count - 1, core.count, core.count + 1, 2**31, 2**32 - 1):
            b = bytearray(enc)
            j = int(rng.integers(0, k))
            b[4 * j: 4 * j + 4] = struct.pack("<I", idx)
            yield bytes(b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mutated_encodings(name, dtype):
    rng = np.random.default_rng(abs(hash((name, dtype))) % 2**32)
    refused = accepted = 0
    for count in (1, 2, 7, 8, 9, 33, 200):
        core = T.Compressor(CONFIGS[name], "worker", dtype, count)
        for _ in range(40):
            x = (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 3)).astype(dtype)
            if rng.random() < 0.2:
                x[rng.integers(0, count)] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
            enc = core.compress(x)
            assert decode_or_refuse(core, enc) is not None
            for bad in mutations(rng, enc, core, name):
                if decode_or_refuse(core, bad) is None:
                    refused += 1
                else:
                    accepted += 1
    assert refused > 0


@FUZZ
@given(name=st.sampled_from(sorted(CONFIGS)), dtype=st.sampled_from(DTYPES),
       count=st.integers(1, 70), data=st.binary(max_size=700))
def test_random_bytes(name, dtype, count, data):
    decode_or_refuse(T.Compressor(CONFIGS[name], "worker", dtype, count), data)


# ---- dithering streams from the wire format ---------------------------------------------------


def elias_delta(x: int) -> str:
    n = x.bit_length()
    nn = n.bit_length() - 1
    return "0" * nn + format(n, "b") + format(x, "b")[1:]


def dithering_stream(entries, scale: float, dtype: str) -> bytes:
    """Header (bit count, scale) + Elias-delta(gap), sign, Elias-delta(level) per entry."""
    bits = "".join(elias_delta(g) + str(s) + elias_delta(q) for g, s, q in entries)
    padded = bits + "0" * (-len(bits) % 8)
    body = int(padded, 2).to_bytes(len(padded) // 8, "big") if padded else b""
    width = "<d" if dtype == "float64" else "<f"
    return struct.pack("<Q", len(bits)) + struct.pack(width, scale) + body


@FUZZ
@given(dtype=st.sampled_from(DTYPES), natural=st.booleans(), k=st.integers(1, 9),
       count=st.one_of(st.integers(1, 60), st.integers(1, 20000)),
       scale=st.floats(-1e4, 1e4, width=32),
       entries=st.lists(st.tuples(st.one_of(st.integers(1, 70), st.integers(1, 3000)),
                                  st.integers(0, 1),
                                  st.one_of(*[st.integers(1, 300)] * 4,
                                            st.integers(1, 2**31))),
                        max_size=120))
def test_dithering_streams_decode_as_specified(dtype, natural, k, count, scale, entries):
    """Long streams too: the decoder's fast path (windows, a table of short elements) runs
    while 176 bits remain, the checked reader after it."""
    kwargs = {"compressor_type": "dithering", "compressor_k": str(k), "seed": "1",
              "dithering_partition": "1" if natural else "0"}
    core = T.Compressor(kwargs, "worker", dtype, count)
    levels = 1 << (k - 1) if natural else k
    data = dithering_stream(entries, scale, dtype)
    ct = np.float64 if dtype == "float64" else np.float32
    want = np.zeros(count, ct)
    index, valid = -1, True
    for gap, sign, q in entries:
        index += gap
        if index >= count or q > levels:
            valid = False
            break
        num = ct(q) * ct(scale) / ct(levels)
        want[index] = -num if sign else num
    got = decode_or_refuse(core, data)
    if not valid:
        assert got is None
        return
    assert got is not None
    with np.errstate(over="ignore"):
        want = want.astype(dtype)
    assert ((got == want) | (np.isnan(got) & np.isnan(want))).all()
    # The stream's padding bits must be 0, and its length must match its bit count.
    if len(data) > 12 and (struct.unpack("<Q", data[:8])[0] % 8):
        flipped = data[:-1] + bytes([data[-1] | 1])
        assert decode_or_refuse(core, flipped) is None
    assert decode_or_refuse(core, data + b"\0") is None
