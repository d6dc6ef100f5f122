"""The summation service's half of two-level compression, in process (no sockets):
``byteps._core_testing.SummationRounds`` drives the round logic of one server exactly as its
connections do (KEY_CONFIG, then encoded pushes), and records every reply.

A compressed key (docs/compression.md, docs/architecture.md §7) decodes each push into the
round's sum, encodes the complete sum once with the server's compressor, and serves that
encoding to every pull of the round. Anything a worker sends that does not fit (a push before
its KEY_CONFIG, a config that differs from the key's, an encoding that does not decode, a
spec the core refuses) is an error reply to that worker, never a crash or a completed round.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from compression_reference import reference_compressor
from testing_hooks import core_testing

from byteps import _core
from byteps.errors import InvalidArgumentError

T = core_testing()
BOUND = 1 << 20
KEY = (3 << 16) | 1


def spec(kwargs: dict) -> str:
    return _core.format_compression({k: str(v) for k, v in kwargs.items()})


def encoder(kwargs: dict, count: int, dtype: str = "float32"):
    return T.Compressor({k: str(v) for k, v in kwargs.items()}, "worker", dtype, count)


def sums(replies):
    return [r for r in replies if r[0] == "sum"]


def errors(replies):
    return [r for r in replies if r[0] == "error"]


ONEBIT = {"compressor_type": "onebit", "compressor_onebit_scaling": "true"}
TOPK_EF = {"compressor_type": "topk", "compressor_k": "5", "ef_type": "vanilla"}
DITHER = {"compressor_type": "dithering", "compressor_k": "4", "seed": "3"}


@pytest.mark.parametrize("kwargs", [ONEBIT, TOPK_EF, DITHER], ids=["onebit", "topk-ef",
                                                                   "dithering"])
def test_rounds_serve_the_encoded_two_level_sum(kwargs):
    """Two workers, four rounds (both parities twice): every pull gets the server's encoding
    of the sum of the decoded pushes, equal to the NumPy reference, state carried across
    rounds (the server's error feedback and random stream)."""
    n, count = 2, 1000
    r = T.SummationRounds(n, BOUND)
    for w in range(n):
        r.configure_key(KEY, w, count, spec(kwargs))
    assert r.replies() == []
    enc = [encoder(kwargs, count) for _ in range(n)]
    dec = encoder(kwargs, count)
    ref_w = [reference_compressor(kwargs, "worker", "float32", count) for _ in range(n)]
    ref_s = reference_compressor(kwargs, "server", "float32", count)
    for rnd in range(1, 5):
        lr = 0.1 / rnd
        xs = [np.random.default_rng([w, rnd]).standard_normal(count).astype(np.float32)
              for w in range(n)]
        for w in range(n):
            assert r.push(KEY, w, rnd, enc[w].compress(xs[w], 0.5, lr), lr=lr)
        got = sums(r.replies())
        assert [(g[1], g[3]) for g in got] == [(0, rnd), (1, rnd)]
        assert got[0][4] == got[1][4]  # one encoding, served to both
        total = sum(np.asarray(ref_w[w].roundtrip(xs[w], 0.5, lr), np.float32) for w in range(n))
        want = np.asarray(ref_s.roundtrip(total, 1.0, lr), np.float32)
        np.testing.assert_allclose(dec.decompress(got[0][4]), want, rtol=1e-6, atol=1e-6)
    state = r.key_state(KEY)
    assert state["compression"] == spec(kwargs)


def test_late_pull_gets_the_same_encoding():
    r = T.SummationRounds(2, BOUND)
    for w in range(2):
        r.configure_key(KEY, w, 64, spec(ONEBIT))
    enc = encoder(ONEBIT, 64)
    x = np.arange(64, dtype=np.float32) - 30
    assert r.push(KEY, 0, 1, enc.compress(x), pull=True)
    assert r.push(KEY, 1, 1, enc.compress(-x), pull=False)
    first = sums(r.replies())
    r.pull(KEY, 1, 1)
    late = sums(r.replies())
    assert len(first) == 1 and len(late) == 1 and first[0][4] == late[0][4]


def test_push_before_its_config_is_refused():
    r = T.SummationRounds(2, BOUND)
    r.configure_key(KEY, 0, 64, spec(ONEBIT))
    data = encoder(ONEBIT, 64).compress(np.ones(64, np.float32))
    assert not r.push(KEY, 1, 1, data)  # worker 1 sent no KEY_CONFIG
    (err,) = errors(r.replies())
    assert err[1] == 1 and "before its KEY_CONFIG" in err[2]
    assert r.key_state(KEY)["count"] == [0, 0]


@pytest.mark.parametrize("other", [
    (64, TOPK_EF, "float32"),     # another compressor
    (65, ONEBIT, "float32"),      # another element count
    (64, ONEBIT, "float64"),      # another dtype
])
def test_config_that_differs_is_refused(other):
    count, kwargs, dtype = other
    r = T.SummationRounds(2, BOUND)
    r.configure_key(KEY, 0, 64, spec(ONEBIT))
    r.configure_key(KEY, 1, count, spec(kwargs), dtype)
    (err,) = errors(r.replies())
    assert err[1] == 1 and "does not match the key's" in err[2], err


def test_config_of_a_plain_key_is_refused():
    r = T.SummationRounds(2, BOUND)
    assert r.push(KEY, 0, 1, np.ones(64, np.float32).tobytes())
    r.configure_key(KEY, 1, 64, spec(ONEBIT))
    (err,) = errors(r.replies())
    assert "uncompressed pushes" in err[2]


@pytest.mark.parametrize("bad,what", [
    ("compressor_type=zip", "zip"),
    ("compressor_type=topk", "compressor_k"),
    ("no equals sign", ""),
])
def test_config_with_a_bad_spec_is_refused(bad, what):
    r = T.SummationRounds(1, BOUND)
    r.configure_key(KEY, 0, 64, bad)
    (err,) = errors(r.replies())
    assert "KEY_CONFIG" in err[2] and what in err[2], err
    assert r.key_state(KEY) is None


def test_config_larger_than_the_partition_bound_is_refused():
    r = T.SummationRounds(1, 4096)
    r.configure_key(KEY, 0, 4096 // 4 + 1, spec(ONEBIT))
    (err,) = errors(r.replies())
    assert "do not fit the job's partitions" in err[2]
    assert r.key_state(KEY) is None


def test_push_longer_than_the_largest_encoding_drops_the_sender():
    r = T.SummationRounds(1, BOUND)
    r.configure_key(KEY, 0, 64, spec(ONEBIT))
    largest = encoder(ONEBIT, 64).max_encoded_bytes
    with pytest.raises(InvalidArgumentError, match="largest encoding"):
        r.push(KEY, 0, 1, b"\0" * (largest + 1))


def test_malformed_encodings_are_errors_and_complete_nothing():
    """2 000 random or mutated encodings of every compressor from worker 0: each is an error
    reply or a decodable push; the server never crashes, and a valid round still completes
    afterwards with the right sum."""
    rng = random.Random(11)
    for kwargs in (ONEBIT, TOPK_EF, DITHER, {"compressor_type": "fp16"},
                   {"compressor_type": "randomk", "compressor_k": "4", "seed": "2"}):
        count = 200
        r = T.SummationRounds(1, BOUND)
        r.configure_key(KEY, 0, count, spec(kwargs))
        enc = encoder(kwargs, count)
        good = enc.compress(np.random.default_rng(1).standard_normal(count).astype(np.float32))
        largest = enc.max_encoded_bytes
        rnd = 0
        for _ in range(400):
            data = bytearray(good)
            kind = rng.randrange(4)
            if kind == 0:
                data = bytearray(rng.randbytes(rng.randrange(0, largest + 1)))
            elif kind == 1 and data:
                del data[rng.randrange(len(data)):]
            elif kind == 2 and data:
                for _ in range(rng.randrange(1, 8)):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            else:
                data += rng.randbytes(rng.randrange(1, 16))
            data = bytes(data[:largest])
            rnd += 1
            assert r.push(KEY, 0, rnd, data)
            for reply in r.replies():
                assert reply[0] in ("sum", "error"), reply
                if reply[0] == "error":
                    assert "not a valid encoding" in reply[2], reply
                    rnd -= 1  # the round stayed open: the next push reuses it
        rnd += 1
        assert r.push(KEY, 0, rnd, good)
        (got,) = sums(r.replies())
        assert got[3] == rnd
