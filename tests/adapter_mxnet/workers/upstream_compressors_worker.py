"""Upstream BytePS's MXNet compressor tests (tests/test_onebit.py, test_topk.py,
test_randomk.py, test_dithering.py) on CPU with a small Gluon net, run as the single worker of
a forced-distributed job with one server::

    python tests/adapter_mxnet/workers/upstream_compressors_worker.py COMPRESSOR

COMPRESSOR: ``onebit`` (scaling on and off), ``topk`` (k 1, 3, 5), ``randomk`` (k 1, 3, 5, three
seeds each) or ``dithering`` (k 2, 4, 8, partition linear and natural, normalize max and l2, three
seeds each). The job must set ``BYTEPS_FORCE_DISTRIBUTED=1``,
``BYTEPS_MIN_COMPRESS_BYTES=0`` (every gradient is compressed) and a large
``BYTEPS_PARTITION_BYTES`` (each tensor is one partition), as upstream's meta_test.py.

For each combination a fresh net and ``DistributedTrainer(net.collect_params(), "sgd",
{"learning_rate": 0.01, "momentum": 0, "wd": 0}, compression_params=...)`` train a few steps of
fake data. After every step, for every parameter: the gradient the trainer applied must equal
``C_s(C_w(g / (batch_size * size)))`` of the NumPy reference (tests/compression_reference.py,
one worker and one server compressor per tensor, state and random streams carried from step to
step), the parameter must equal the reference's ``p -= lr * C_s(C_w(...))`` within float32
epsilon (upstream's assertion), and the decoded gradient must show the compressor's signature
(onebit: one magnitude, 1 without scaling; topk / randomk: at most k non-zeros; dithering: at
most k distinct non-zero magnitudes, powers of two apart for natural). Prints ``CASE-OK <combo>``
per combination, ``FAIL ...`` on a failed check, ``MAXDIFF <ulp>`` (the largest parameter
difference in units of float32 epsilon) and ``OK <n> cases`` at the end.
"""

from __future__ import annotations

import itertools
import sys
import time
import traceback
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import byteps.mxnet as bps
from byteps.sync.compression import compression_kwargs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: compression_sgd.py
from compression_sgd import TwoLevel

BATCH, STEPS, LR = 32, 4, 0.01
OPTIMIZER_PARAMS = {"learning_rate": LR, "momentum": 0, "wd": 0}
EPS = float(np.finfo(np.float32).eps)
SEEDS = {"randomk": (7, 1234, 2019), "dithering": (11, 404, 2020)}
COMBOS = {
    "onebit": [{"compressor": "onebit", "scaling": s} for s in (True, False)],
    "topk": [{"compressor": "topk", "k": k} for k in (1, 3, 5)],
    "randomk": [{"compressor": "randomk", "k": k, "seed": seed}
                for k, seed in itertools.product((1, 3, 5), SEEDS["randomk"])],
    "dithering": [{"compressor": "dithering", "k": k, "partition": p, "normalize": n,
                   "seed": seed}
                  for k, p, n, seed in itertools.product((2, 4, 8), ("linear", "natural"),
                                                         ("max", "l2"), SEEDS["dithering"])],
}
STATE = {"fails": 0, "cases": 0, "maxdiff": 0.0}


def fail(msg: str) -> None:
    STATE["fails"] += 1
    print(f"FAIL {msg}", flush=True)


def make_net(seed: int) -> gluon.nn.HybridSequential:
    """A small conv net on 1x16x16 inputs: conv (4, 1, 3, 3) + bias, dense 784 -> 32, 32 -> 10;
    six parameter tensors of 4 to 25088 float32 elements, all initialised (no deferred init).
    The dense weight (98 KB) is larger than the small-tensor partitions (60 KiB) that a
    distributed job cuts an uncompressed tensor into: compressed, it must stay one partition
    (the job's bound), as upstream compresses it."""
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, in_channels=1, activation="relu"), gluon.nn.Flatten(),
            gluon.nn.Dense(32, in_units=784, activation="relu"), gluon.nn.Dense(10, in_units=32))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net


def fake_batch(step: int):
    """Fake data of step ``step``: BATCH normal 1x16x16 images and labels in [0, 10)."""
    rng = np.random.default_rng([2020, step])
    x = rng.standard_normal((BATCH, 1, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.float32)
    return mx.nd.array(x), mx.nd.array(y)


def signature(params: dict, decoded: np.ndarray, scaled: np.ndarray):
    """Why ``decoded`` (a tensor's applied gradient) is not what the compressor can produce
    from ``scaled`` (its scaled gradient), or None."""
    comp, n = params["compressor"], decoded.size
    mags = np.unique(np.abs(decoded[decoded != 0]))
    if comp == "onebit":
        if np.count_nonzero(decoded) != n or len(mags) != 1:
            return f"onebit decoded to {len(mags)} magnitudes ({np.count_nonzero(decoded)} " \
                   f"non-zeros of {n})"
        want = np.abs(scaled).mean() if params["scaling"] else 1.0
        if not np.isclose(mags[0], want, rtol=1e-4, atol=0):
            return f"onebit magnitude {mags[0]!r}, want {want!r}"
    elif comp in ("topk", "randomk"):
        if np.count_nonzero(decoded) > min(params["k"], n):
            return f"{comp} decoded to {np.count_nonzero(decoded)} non-zeros, k={params['k']}"
    elif comp == "dithering":
        if len(mags) > params["k"]:
            return f"dithering decoded to {len(mags)} magnitudes, k={params['k']}"
        if params["partition"] == "natural" and len(mags):
            e = np.log2(mags / mags[0])
            if not np.allclose(e, np.round(e), atol=1e-4):
                return f"natural dithering magnitudes not powers of two apart: {mags}"
    return None


def run_combo(index: int, params: dict) -> None:
    label = ",".join(f"{k}={v}" for k, v in params.items() if k != "compressor")
    label = f"{params['compressor']}[{label}]"
    size = bps.size()
    net = make_net(100 + index)
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", dict(OPTIMIZER_PARAMS),
                                     compression_params=params)
    kwargs = compression_kwargs(params)
    tensors = [(i, p) for i, p in enumerate(trainer._params) if p.grad_req != "null"]
    models = {i: TwoLevel(kwargs, "float32", p.data().size, size) for i, p in tensors}
    want = {i: p.data().asnumpy().reshape(-1).copy() for i, p in tensors}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    scale = 1.0 / (BATCH * size)
    changed = 0  # tensors whose applied gradient differs from the uncompressed one
    for step in range(STEPS):
        x, y = fake_batch(step)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        grads = {i: p.grad().asnumpy().reshape(-1).copy() for i, p in tensors}
        trainer.step(BATCH)
        for i, p in tensors:
            where = f"{label} step {step} {p.name} ({p.data().size} elements)"
            ref = models[i].step([grads[i]], scale, LR)
            got_g = p.grad().asnumpy().reshape(-1)
            if not np.array_equal(got_g, ref):
                bad = np.flatnonzero(got_g != ref)
                fail(f"{where}: applied gradient differs from the reference at {len(bad)} "
                     f"elements, e.g. [{bad[0]}] got {got_g[bad[0]]!r} want {ref[bad[0]]!r}")
                return
            scaled = (grads[i] * np.float32(scale)).astype(np.float32)
            why = signature(params, got_g, scaled)
            if why:
                fail(f"{where}: {why}")
                return
            changed += not np.array_equal(got_g, scaled)
            want[i] = (want[i] - np.float32(LR) * ref).astype(np.float32)
            got = p.data().asnumpy().reshape(-1)
            diff = float(np.abs(got - want[i]).max())
            STATE["maxdiff"] = max(STATE["maxdiff"], diff / EPS)
            if not np.allclose(got, want[i], rtol=0, atol=EPS):
                bad = int(np.count_nonzero(np.abs(got - want[i]) > EPS))
                fail(f"{where}: {bad}/{got.size} parameters differ from the reference by more "
                     f"than float32 eps (max {diff:.3g})")
                return
    if not changed:
        fail(f"{label}: no applied gradient differs from the uncompressed one (not compressed?)")
        return
    STATE["cases"] += 1
    print(f"CASE-OK {label} ({len(tensors)} tensors x {STEPS} steps, {changed} compressed "
          "gradients changed)", flush=True)


def main() -> int:
    compressor = sys.argv[1]
    bps.init()
    start = time.monotonic()
    for index, params in enumerate(COMBOS[compressor]):
        try:
            run_combo(index, params)
        except Exception:
            fail(f"{params} raised:\n{traceback.format_exc()}")
    print(f"MAXDIFF {STATE['maxdiff']:.3g} eps; {len(COMBOS[compressor])} combinations in "
          f"{time.monotonic() - start:.1f} s", flush=True)
    bps.shutdown()
    print(f"OK {STATE['cases']} cases", flush=True)
    return 1 if STATE["fails"] else 0


if __name__ == "__main__":
    sys.exit(main())
