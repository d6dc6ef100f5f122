"""``compression_params`` of byteps.tensorflow / byteps.keras in a real job, run on every rank
(2+ workers, 1 server, ``BYTEPS_MIN_COMPRESS_BYTES=4096``).

Each case trains a weight of N_W float32 elements (compressed: 8000 bytes, one partition) and a
bias of N_B (64 bytes: below the threshold, summed exactly) for a few SGD steps with the
learning rate changing every step, and compares both with the NumPy model of the two-level
scheme (tests/compression_sgd.py over tests/compression_reference.py): DistributedGradientTape
eagerly (onebit with and without scaling), the Keras DistributedOptimizer inside tf.function
(topk; topk + error feedback + Nesterov momentum taken from the optimizer). Then different
dicts on the ranks must give MismatchError on every rank. Prints ``TF_COMPRESS_OK rank=..``
(else ``TF_COMPRESS_FAILED``, exit 1) and ``TF_COMPRESS_MISMATCH_RAISED``.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: compression_sgd.py

import numpy as np
import tensorflow as tf

import byteps.tensorflow as bps
from byteps.errors import MismatchError
from byteps.sync.compression import compression_kwargs

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402
from compression_sgd import TwoLevel, rank_gradient  # noqa: E402

N_W, N_B, STEPS, LR0 = 2000, 16, 3, 0.1
failures = []
cases = [0]


def check(cond, msg):
    cases[0] += 1
    if not cond:
        failures.append(msg)
        print(f"FAIL rank {bps.rank()}: {msg}", flush=True)


def run(label, fn, *args):
    try:
        fn(*args)
    except Exception:
        cases[0] += 1
        failures.append(f"{label} raised:\n{traceback.format_exc()}")
        print(f"FAIL rank {bps.rank()}: {label}\n{traceback.format_exc()}", flush=True)


def lr_at(step: int) -> float:
    return LR0 / (1 + step)


class Reference:
    """Weight through the two-level model, bias summed exactly (plus Nesterov momentum in the
    adapter when the case moves the optimizer's momentum)."""

    def __init__(self, case, params, momentum, init):
        self.case, self.momentum = case, momentum
        self.model = TwoLevel(compression_kwargs(params, momentum or None), "float32", N_W,
                              bps.size())
        self.w, self.b = init[:N_W].copy(), init[N_W:].copy()
        self.m_b = np.zeros(N_B, np.float32)

    def grads(self, step):
        return ([rank_gradient(r, step, self.case + ".w", N_W) for r in range(bps.size())],
                [rank_gradient(r, step, self.case + ".b", N_B) for r in range(bps.size())])

    def step(self, step, lr):
        gw, gb = self.grads(step)
        out = self.model.step(gw, 1.0 / bps.size(), lr)
        plain = np.mean(gw, axis=0, dtype=np.float32)
        check(not np.allclose(out, plain, rtol=1e-3, atol=1e-4),
              f"{self.case}: the reference equals the plain average (nothing compressed?)")
        self.w = (self.w - np.float32(lr) * out).astype(np.float32)
        avg = (np.sum(gb, axis=0, dtype=np.float32) / np.float32(bps.size())).astype(np.float32)
        if self.momentum:
            self.m_b = (np.float32(self.momentum) * self.m_b + avg).astype(np.float32)
            avg = (avg + np.float32(self.momentum) * self.m_b).astype(np.float32)
        self.b = (self.b - np.float32(lr) * avg).astype(np.float32)

    def compare(self, step, w, b):
        w, b = np.asarray(w), np.asarray(b)
        check(np.allclose(w, self.w, rtol=1e-5, atol=1e-6),
              f"{self.case} step {step}: weight differs from the two-level reference by "
              f"{float(np.abs(w - self.w).max()):.3g} (first got {w[:4].tolist()}, want "
              f"{self.w[:4].tolist()})")
        check(np.allclose(b, self.b, rtol=1e-5, atol=1e-6),
              f"{self.case} step {step}: bias (uncompressed) differs by "
              f"{float(np.abs(b - self.b).max()):.3g}")


def initial():
    return np.random.default_rng(7).standard_normal(N_W + N_B).astype(np.float32)


def tape_case(case, params):
    """DistributedGradientTape, eager; the update applied by hand."""
    init = initial()
    ref = Reference(case, params, 0.0, init)
    w, b = tf.Variable(init[:N_W], name=f"{case}_w"), tf.Variable(init[N_W:], name=f"{case}_b")
    for step in range(STEPS):
        lr = lr_at(step)
        gw, gb = ref.grads(step)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(gw[bps.rank()] * w) + tf.reduce_sum(gb[bps.rank()] * b)
        tape = bps.DistributedGradientTape(tape, compression_params=params)
        dw, db = tape.gradient(loss, [w, b])
        w.assign_sub(tf.constant(lr, tf.float32) * dw)
        b.assign_sub(tf.constant(lr, tf.float32) * db)
        ref.step(step, lr)
        ref.compare(step, w.numpy(), b.numpy())


def keras_case(case, params, momentum):
    """The Keras distributed SGD inside tf.function; the learning rate changes every step."""
    init = initial()
    ref = Reference(case, params, momentum, init)
    w, b = keras.Variable(init[:N_W], name=f"{case}_w"), keras.Variable(init[N_W:],
                                                                        name=f"{case}_b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = bps.DistributedOptimizer(keras.optimizers.SGD(LR0, momentum=momentum),
                                       name=f"{case}", compression_params=params)
    if momentum:
        check(any("set to 0" in str(c.message) for c in caught),
              f"{case}: no warning that the optimizer's momentum was set to 0")
        check(float(opt.momentum) == 0.0, f"{case}: momentum {opt.momentum} not set to 0")

    @tf.function
    def train_step(gw, gb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(gw * w) + tf.reduce_sum(gb * b)
        grads = tape.gradient(loss, [w, b])
        opt.apply_gradients(zip(grads, [w, b]))

    for step in range(STEPS):
        lr = lr_at(step)
        opt.learning_rate = lr
        gw, gb = ref.grads(step)
        train_step(tf.constant(gw[bps.rank()]), tf.constant(gb[bps.rank()]))
        ref.step(step, lr)
        ref.compare(step, w.numpy(), b.numpy())


def mismatch():
    rank = bps.rank()
    params = {"compressor": "onebit"} if rank == 0 else {"compressor": "topk", "k": 3}
    w = tf.Variable(tf.zeros([N_W]), name="mismatch_w")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w)
    tape = bps.DistributedGradientTape(tape, compression_params=params)
    try:
        tape.gradient(loss, [w])
    except MismatchError as e:
        print(f"TF_COMPRESS_MISMATCH_RAISED rank={rank}: {e}", flush=True)
        check(True, "mismatch")
        return
    except Exception as e:
        check(False, f"mismatch: {type(e).__name__} instead of MismatchError: {e}")
        return
    check(False, "mismatch: different compression_params across ranks raised nothing")


def main():
    bps.init()
    run("tape onebit", tape_case, "tape_onebit", {"compressor": "onebit"})
    run("tape onebit scaling", tape_case, "tape_onebit_scaling",
        {"compressor": "onebit", "scaling": True})
    run("keras topk", keras_case, "keras_topk", {"compressor": "topk", "k": 50}, 0.0)
    run("keras topk ef nesterov", keras_case, "keras_topk_ef_nesterov",
        {"compressor": "topk", "k": 0.05, "ef": "vanilla", "momentum": "nesterov"}, 0.9)
    run("mismatch", mismatch)
    r, n = bps.rank(), bps.size()
    if failures:
        print(f"TF_COMPRESS_FAILED rank={r} size={n} failures={len(failures)}", flush=True)
        for f in failures[:20]:
            print("  - " + f.replace("\n", "\n    "), flush=True)
        bps.shutdown()
        sys.exit(1)
    print(f"TF_COMPRESS_OK rank={r} size={n} cases={cases[0]}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
