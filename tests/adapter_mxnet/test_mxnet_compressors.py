"""Upstream BytePS's four MXNet compressor tests (tests/test_onebit.py, test_topk.py,
test_randomk.py, test_dithering.py) reproduced on CPU (``-m mxnet``; nox session ``mxnet``).

As upstream's meta_test.py: one worker and one server, ``BYTEPS_FORCE_DISTRIBUTED=1``,
``BYTEPS_MIN_COMPRESS_BYTES=0`` and ``BYTEPS_PARTITION_BYTES`` large (one partition per
tensor). Each test is one job that trains a small Gluon conv net with ``DistributedTrainer(...,
"sgd", {"learning_rate": 0.01, "momentum": 0, "wd": 0}, compression_params=...)`` for every
parameter combination of its compressor in turn (a fresh net and trainer each), comparing every
parameter after every step with ``p -= lr * C_s(C_w(g / (batch_size * size)))`` of the NumPy
reference (tests/compression_reference.py), see workers/upstream_compressors_worker.py.
Unlike upstream's dithering test, whose partition list was the single string "linear, natural",
both partitions are run.
"""

from __future__ import annotations

import re
from pathlib import Path

import jobs
import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "workers" / "upstream_compressors_worker.py"
JOB_ENV = ["BYTEPS_MIN_COMPRESS_BYTES=0", "BYTEPS_PARTITION_BYTES=2147483647"]

pytestmark = pytest.mark.mxnet
pytest.importorskip("mxnet")
pytest.importorskip("byteps._core", reason="the byteps core is not built")


def _run(compressor: str, combos: int) -> str:
    rc, out, _ = jobs.launch_job(jobs.CONFIGS["1w1s_forced"], [jobs.PY, WORKER, compressor],
                                 env=JOB_ENV, timeout=180)
    jobs.assert_ok(rc, out, 1, min_cases=combos)
    oks = [line for line in jobs.worker_lines(out, 0) if line.startswith("CASE-OK ")]
    assert len(oks) == combos, "\n".join(oks)
    print(next(line for line in jobs.worker_lines(out, 0) if line.startswith("MAXDIFF")))
    return out


@pytest.mark.parametrize("compressor,combos", [("onebit", 2), ("topk", 3)])
def test_upstream_onebit_topk(compressor, combos):
    """onebit with scaling on and off (every applied gradient ±1, or ±mean|g|), topk with
    k = 1, 3, 5 (at most k non-zeros per tensor): applied gradients equal the reference's
    two-level round trip and parameters equal the reference's within float32 epsilon after
    every step."""
    out = _run(compressor, combos)
    if compressor == "onebit":
        assert re.search(r"CASE-OK onebit\[scaling=True\]", out)
        assert re.search(r"CASE-OK onebit\[scaling=False\]", out)


def test_upstream_randomk():
    """randomk with k = 1, 3, 5 and seeds 7, 1234, 2019: the indices come from upstream's
    xorshift128+ streams {seed, seed}, one on the worker and one on the server per tensor,
    carried from step to step; parameters as the reference's after every step."""
    _run("randomk", 9)


def test_upstream_dithering():
    """dithering with k = 2, 4, 8, partition linear and natural, normalize max and l2, seeds
    11, 404 and 2020 (36 combinations): the stochastic rounding's draws from each tensor's worker
    and server streams match the reference's; parameters as the reference's after every
    step."""
    out = _run("dithering", 36)
    for partition in ("linear", "natural"):
        for normalize in ("max", "l2"):
            assert re.search(rf"CASE-OK dithering\[k=8,partition={partition},"
                             rf"normalize={normalize},seed=2020\]", out), partition + normalize
