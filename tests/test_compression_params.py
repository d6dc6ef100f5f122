"""byteps.sync.compression: the translation of the users' ``compression_params`` dict (upstream's
MXNet DistributedTrainer keys) into the core's compressor kwargs, every key and every error;
the Nesterov momentum adapters apply to gradients the core does not compress; which tensors
the core compresses."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("byteps._core", reason="the byteps core is not built")

from byteps.errors import BytePSError, InvalidArgumentError, InvalidTypeError
from byteps.sync.compression import (
    NesterovMomentum,
    compression_kwargs,
    core_compresses,
    min_compress_bytes,
    nesterov_mu,
    wants_fp16,
)

GOOD = [
    (None, {}),
    ({}, {}),
    ({"fp16": True}, {}),
    ({"fp16": False}, {}),
    ({"compressor": "onebit"},
     {"compressor_type": "onebit", "compressor_onebit_scaling": "false"}),
    ({"compressor": "OneBit", "scaling": True},
     {"compressor_type": "onebit", "compressor_onebit_scaling": "true"}),
    ({"compressor": "onebit", "scaling": np.bool_(True), "fp16": True},
     {"compressor_type": "onebit", "compressor_onebit_scaling": "true"}),
    ({"compressor": "topk", "k": 4}, {"compressor_type": "topk", "compressor_k": "4"}),
    ({"compressor": "topk", "k": 4.0}, {"compressor_type": "topk", "compressor_k": "4"}),
    ({"compressor": "topk", "k": np.int64(7)}, {"compressor_type": "topk", "compressor_k": "7"}),
    ({"compressor": "topk", "k": 0.01}, {"compressor_type": "topk", "compressor_k": "0.01"}),
    ({"compressor": "randomk", "k": 0.25, "seed": 42},
     {"compressor_type": "randomk", "compressor_k": "0.25", "seed": "42"}),
    ({"compressor": "dithering", "k": 2, "seed": 1, "partition": "linear",
      "normalize": "max"},
     {"compressor_type": "dithering", "compressor_k": "2", "seed": "1",
      "dithering_partition": "0", "dithering_normalize": "0"}),
    ({"compressor": "dithering", "k": 3, "partition": "Natural", "normalize": "L2"},
     {"compressor_type": "dithering", "compressor_k": "3", "dithering_partition": "1",
      "dithering_normalize": "1"}),
    ({"compressor": "fp16"}, {"compressor_type": "fp16"}),
    ({"compressor": "fp16", "ef": "vanilla"}, {"compressor_type": "fp16", "ef_type": "vanilla"}),
    ({"compressor": "onebit", "ef": "Vanilla", "momentum": "nesterov", "momentum_mu": 0.9},
     {"compressor_type": "onebit", "compressor_onebit_scaling": "false", "ef_type": "vanilla",
      "momentum_type": "nesterov", "momentum_mu": "0.9"}),
    ({"compressor": "topk", "k": 1, "momentum": "nesterov", "momentum_mu": 0},
     {"compressor_type": "topk", "compressor_k": "1", "momentum_type": "nesterov",
      "momentum_mu": "0.0"}),
]


@pytest.mark.parametrize("params,want", GOOD, ids=[str(g[0]) for g in GOOD])
def test_translation(params, want):
    assert compression_kwargs(params) == want


def test_momentum_mu_from_the_optimizer_and_precedence():
    params = {"compressor": "onebit", "momentum": "nesterov"}
    kw = compression_kwargs(params, momentum_mu=0.5)
    assert kw["momentum_type"] == "nesterov" and kw["momentum_mu"] == "0.5"
    assert nesterov_mu(kw) == 0.5
    # the dict's own momentum_mu wins over the optimizer's
    kw = compression_kwargs({**params, "momentum_mu": 0.25}, momentum_mu=0.5)
    assert kw["momentum_mu"] == "0.25"
    assert nesterov_mu(compression_kwargs({"compressor": "onebit"}, momentum_mu=0.9)) is None


def test_the_input_is_not_modified():
    params = {"compressor": "TopK", "k": 3, "momentum": "nesterov", "momentum_mu": 0.9}
    copy = dict(params)
    compression_kwargs(params)
    assert params == copy


def test_wants_fp16():
    assert wants_fp16({"fp16": True}) and wants_fp16({"compressor": "onebit", "fp16": True})
    assert not wants_fp16(None) and not wants_fp16({}) and not wants_fp16({"fp16": False})
    with pytest.raises(InvalidTypeError):
        wants_fp16({"fp16": 1})
    with pytest.raises(InvalidTypeError):
        wants_fp16([("fp16", True)])


BAD = [
    # (params, momentum_mu, exception, words in the message)
    ({"compresor": "onebit"}, None, InvalidArgumentError, ["unknown key", "compresor"]),
    ({"compressor": "twobit"}, None, InvalidArgumentError, ["twobit", "onebit, topk"]),
    ({"compressor": 1}, None, InvalidTypeError, ["compressor", "str"]),
    ({"ef": "vanilla"}, None, InvalidArgumentError, ["without 'compressor'"]),
    ({"k": 3, "fp16": True}, None, InvalidArgumentError, ["without 'compressor'"]),
    ({"compressor": "onebit", "ef": "fancy"}, None, InvalidArgumentError, ["ef", "vanilla"]),
    ({"compressor": "onebit", "ef": 1}, None, InvalidTypeError, ["ef"]),
    ({"compressor": "onebit", "momentum": "heavyball", "momentum_mu": 0.9}, None,
     InvalidArgumentError, ["momentum", "nesterov"]),
    ({"compressor": "onebit", "momentum": "nesterov"}, None, InvalidArgumentError,
     ["needs mu", "momentum_mu"]),
    ({"compressor": "onebit", "momentum": "nesterov", "momentum_mu": 1.0}, None,
     InvalidArgumentError, ["[0, 1)"]),
    ({"compressor": "onebit", "momentum": "nesterov", "momentum_mu": -0.1}, None,
     InvalidArgumentError, ["[0, 1)"]),
    ({"compressor": "onebit", "momentum": "nesterov", "momentum_mu": "0.9"}, None,
     InvalidTypeError, ["momentum_mu", "number"]),
    ({"compressor": "onebit", "momentum": "nesterov"}, 1.5, InvalidArgumentError,
     ["optimizer's momentum", "[0, 1)"]),
    ({"compressor": "onebit", "momentum_mu": 0.9}, None, InvalidArgumentError,
     ["without 'momentum'"]),
    ({"compressor": "onebit", "scaling": "true"}, None, InvalidTypeError, ["scaling", "bool"]),
    ({"compressor": "onebit", "scaling": 1}, None, InvalidTypeError, ["scaling", "bool"]),
    ({"compressor": "topk", "scaling": True, "k": 2}, None, InvalidArgumentError,
     ["scaling", "onebit only"]),
    ({"compressor": "onebit", "k": 2}, None, InvalidArgumentError, ["'k'", "onebit"]),
    ({"compressor": "fp16", "k": 2}, None, InvalidArgumentError, ["'k'", "fp16"]),
    ({"compressor": "topk"}, None, InvalidArgumentError, ["needs 'k'"]),
    ({"compressor": "randomk"}, None, InvalidArgumentError, ["needs 'k'"]),
    ({"compressor": "dithering"}, None, InvalidArgumentError, ["needs 'k'", "levels"]),
    ({"compressor": "topk", "k": 0}, None, InvalidArgumentError, ["> 0"]),
    ({"compressor": "topk", "k": -2}, None, InvalidArgumentError, ["> 0"]),
    ({"compressor": "topk", "k": 2.5}, None, InvalidArgumentError, ["integer"]),
    ({"compressor": "topk", "k": float("nan")}, None, InvalidArgumentError, ["finite"]),
    ({"compressor": "topk", "k": "4"}, None, InvalidTypeError, ["'k'", "number"]),
    ({"compressor": "topk", "k": True}, None, InvalidTypeError, ["'k'", "number"]),
    ({"compressor": "dithering", "k": 0.5}, None, InvalidArgumentError, ["levels"]),
    ({"compressor": "dithering", "k": 2.5}, None, InvalidArgumentError, ["levels"]),
    ({"compressor": "onebit", "seed": 3}, None, InvalidArgumentError, ["seed", "onebit"]),
    ({"compressor": "randomk", "k": 2, "seed": 0}, None, InvalidArgumentError,
     ["seed", "[1, 2**64)"]),
    ({"compressor": "randomk", "k": 2, "seed": 1 << 64}, None, InvalidArgumentError, ["seed"]),
    ({"compressor": "randomk", "k": 2, "seed": 1.0}, None, InvalidTypeError, ["seed", "int"]),
    ({"compressor": "randomk", "k": 2, "partition": "linear"}, None, InvalidArgumentError,
     ["partition", "dithering only"]),
    ({"compressor": "dithering", "k": 2, "partition": "log"}, None, InvalidArgumentError,
     ["partition", "linear, natural"]),
    ({"compressor": "dithering", "k": 2, "partition": 0}, None, InvalidTypeError,
     ["partition"]),
    ({"compressor": "dithering", "k": 2, "normalize": "l1"}, None, InvalidArgumentError,
     ["normalize", "max, l2"]),
    ({"compressor": "topk", "k": 2, "normalize": "max"}, None, InvalidArgumentError,
     ["normalize", "dithering only"]),
    ({"compressor": "onebit", "fp16": "yes"}, None, InvalidTypeError, ["fp16", "bool"]),
    ([("compressor", "onebit")], None, InvalidTypeError, ["dict"]),
    ("onebit", None, InvalidTypeError, ["dict"]),
]


@pytest.mark.parametrize("params,mu,exc,words", BAD, ids=[str(b[0]) for b in BAD])
def test_errors(params, mu, exc, words):
    with pytest.raises(exc) as info:
        compression_kwargs(params, momentum_mu=mu)
    assert isinstance(info.value, BytePSError)
    assert "compression_params" in str(info.value) or "optimizer" in str(info.value)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_min_compress_bytes_and_core_compresses(monkeypatch):
    for k in ("DMLC_NUM_WORKER", "BYTEPS_FORCE_DISTRIBUTED", "BYTEPS_MIN_COMPRESS_BYTES"):
        monkeypatch.delenv(k, raising=False)
    assert min_compress_bytes() == 65536
    # not distributed: nothing is compressed
    assert not core_compresses("float32", 1 << 20)
    monkeypatch.setenv("BYTEPS_FORCE_DISTRIBUTED", "1")
    assert core_compresses("float32", 65536) and core_compresses("float16", 1 << 20)
    assert not core_compresses("float32", 65535)
    assert not core_compresses("int32", 1 << 20) and not core_compresses("bfloat16", 1 << 20)
    monkeypatch.setenv("BYTEPS_MIN_COMPRESS_BYTES", "16")
    assert min_compress_bytes() == 16 and core_compresses("float64", 16)
    monkeypatch.delenv("BYTEPS_FORCE_DISTRIBUTED")
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    assert core_compresses("float64", 16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nesterov_momentum(dtype):
    mu = 0.9
    nag = NesterovMomentum(mu)
    rng = np.random.default_rng(0)
    m = np.zeros(5)
    for _ in range(4):
        g = rng.standard_normal(5).astype(dtype)
        want_m = mu * m + g.astype(np.float64)
        want = g.astype(np.float64) + mu * want_m
        nag.apply("w", g)
        m = want_m
        np.testing.assert_allclose(g, want, rtol=1e-6 if dtype == np.float32 else 1e-12)
        assert g.dtype == dtype
    # upstream's form (mom += g; mom *= mu; g += mom) is the same update
    up, mom = NesterovMomentum(mu), np.zeros(3)
    for step in range(3):
        g = np.full(3, float(step + 1))
        ref = g.copy()
        mom += ref
        mom *= mu
        ref += mom
        up.apply("x", g)
        np.testing.assert_allclose(g, ref)
    with pytest.raises(InvalidArgumentError, match="changed"):
        up.apply("x", np.zeros(4))
