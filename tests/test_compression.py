"""Two-level gradient compression end to end (docs/compression.md): real jobs of workers,
servers and a scheduler on this host, every compressor and decorator, checked by each worker
against the NumPy reference of the scheme (tests/workers/compress_worker.py), on both vans.

Each worker compresses its partitions (divided by size first when averaging), the server
decodes and sums the pushes and compresses the sum, and every worker must get exactly the
decoded value the reference computes, round after round (error feedback, momentum and the
random streams carry their state).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from jobs import CONFIGS, VANS, assert_ok, run_job, van_params, world_size
from testing_hooks import core_testing

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux /proc and /dev/shm"
)

core_testing()  # the worker asks the core for its partitions
SCRIPT = str(Path(__file__).resolve().parent / "workers" / "compress_worker.py")
#: small partitions, so the multi-partition tensor has several; no size threshold
ENV = ["BYTEPS_PARTITION_BYTES=65536", "BYTEPS_MIN_COMPRESS_BYTES=0"]

#: every compressor, and the decorators on top of one (upstream's names and parameters)
COMPRESSORS = {
    "onebit": {"compressor_type": "onebit"},
    "onebit-scaling": {"compressor_type": "onebit", "compressor_onebit_scaling": True},
    "topk-count": {"compressor_type": "topk", "compressor_k": 7},
    "topk-fraction": {"compressor_type": "topk", "compressor_k": 0.01},
    "randomk": {"compressor_type": "randomk", "compressor_k": 9, "seed": 2020},
    "dithering-linear-max": {"compressor_type": "dithering", "compressor_k": 4, "seed": 7},
    "dithering-natural-l2": {"compressor_type": "dithering", "compressor_k": 3, "seed": 11,
                             "dithering_partition": 1, "dithering_normalize": 1},
    "fp16": {"compressor_type": "fp16"},
    "onebit-ef": {"compressor_type": "onebit", "compressor_onebit_scaling": True,
                  "ef_type": "vanilla"},
    "topk-ef-nesterov": {"compressor_type": "topk", "compressor_k": 0.02, "ef_type": "vanilla",
                         "momentum_type": "nesterov", "momentum_mu": 0.9},
}


def twolevel(config, kwargs, rounds=3, average=True, env=(), timeout=240):
    cfg = CONFIGS[config]
    rc, out, _ = run_job(cfg, "twolevel", json.dumps(kwargs), rounds, int(average),
                         env=[*ENV, *env], script=SCRIPT, timeout=timeout)
    assert_ok(rc, out, world_size(cfg), min_cases=rounds)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_two_level_matches_reference_2w1s(name):
    twolevel("2w1s", COMPRESSORS[name])


@pytest.mark.parametrize("name", ["onebit-scaling", "dithering-linear-max", "onebit-ef"])
def test_two_level_matches_reference_3w2s(name):
    twolevel("3w2s", COMPRESSORS[name])


def test_sum_without_averaging():
    twolevel("2w1s", COMPRESSORS["topk-count"], average=False)


def test_local_root_compresses_the_machines_sum():
    # Two processes per machine: the local root compresses the local sum; the other local
    # rank copies the decoded sum from shared memory, without dividing it again.
    twolevel("2w1s_local2", COMPRESSORS["onebit-scaling"], rounds=2)


@pytest.mark.parametrize("van", van_params())
def test_two_level_on_every_van(van):
    twolevel("2w1s", COMPRESSORS["onebit-ef"], rounds=2, env=VANS[van])


def test_mismatched_compressors_fail_every_rank():
    cfg = CONFIGS["2w1s"]
    rc, out, _ = run_job(cfg, "mismatch", env=[*ENV, "BYTEPS_TIMEOUT=30"], script=SCRIPT,
                         timeout=150)
    assert_ok(rc, out, world_size(cfg))
    assert out.count("MISMATCH_RAISED") == world_size(cfg), out[-4000:]


def test_small_tensor_below_threshold_is_exact():
    cfg = CONFIGS["2w1s"]
    rc, out, _ = run_job(cfg, "threshold", script=SCRIPT, timeout=150)
    assert_ok(rc, out, world_size(cfg))

