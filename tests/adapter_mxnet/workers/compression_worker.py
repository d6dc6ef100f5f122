"""``DistributedTrainer(compression_params=...)`` in a real job (2+ workers, 1 server,
``BYTEPS_MIN_COMPRESS_BYTES=4096``)::

    python tests/adapter_mxnet/workers/compression_worker.py

Each case trains a weight of N_W float32 elements (compressed: 8000 bytes, one partition) and a
bias of N_B (64 bytes: below the threshold, summed exactly) with SGD for a few steps, the
learning rate changing every step, and compares both with the NumPy model of upstream's scheme
(tests/compression_sgd.py over tests/compression_reference.py): gradients scaled by
1/(batch_size * size) and summed, the weight through C(sum_i C(g_i)); onebit with and without
scaling, topk, and onebit + error feedback + Nesterov momentum + weight decay taken from
optimizer_params (Compression.nag on the bias, Compression.wdmom on the weight). Then ranks
with different dicts must all get MismatchError. Prints ``CASE-OK`` per case, ``FAIL ...`` on
a failed check, ``MXNET_COMPRESS_MISMATCH_RAISED`` and ``OK <n> cases`` at the end.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import mxnet as mx
import numpy as np

import byteps.mxnet as bps
from byteps.errors import MismatchError
from byteps.sync.compression import compression_kwargs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: compression_sgd.py
from compression_sgd import TwoLevel, rank_gradient

N_W, N_B, STEPS, LR0, B = 2000, 16, 3, 0.1, 4
CASES = {
    # name: (compression_params, optimizer_params besides the learning rate)
    "onebit": ({"compressor": "onebit"}, {}),
    "onebit_scaling": ({"compressor": "onebit", "scaling": True}, {}),
    "topk": ({"compressor": "topk", "k": 50}, {}),
    "onebit_ef_nesterov_wd": ({"compressor": "onebit", "ef": "vanilla",
                               "momentum": "nesterov"}, {"momentum": 0.9, "wd": 1e-3}),
}
FAILS = [0]
CASES_OK = [0]


def fail(msg: str) -> None:
    FAILS[0] += 1
    print(f"FAIL {msg}", flush=True)


def ok(case: str) -> None:
    CASES_OK[0] += 1
    print(f"CASE-OK {case}", flush=True)


def lr_at(step: int) -> float:
    return LR0 / (1 + step)


def parameter(name: str, value: np.ndarray) -> mx.gluon.Parameter:
    p = mx.gluon.Parameter(name, shape=value.shape, dtype="float32")
    p.initialize(ctx=mx.cpu())
    p.set_data(mx.nd.array(value, dtype="float32"))
    return p


def run_case(case: str, params: dict, extra: dict) -> None:
    rank, size = bps.rank(), bps.size()
    init = np.random.default_rng(7).standard_normal(N_W + N_B).astype(np.float32)
    w, b = parameter(f"{case}_w", init[:N_W]), parameter(f"{case}_b", init[N_W:])
    opt_params = {"learning_rate": LR0, **extra}
    trainer = bps.DistributedTrainer({f"{case}_w": w, f"{case}_b": b}, "sgd", opt_params,
                                     compression_params=params)
    if extra and opt_params != {"learning_rate": LR0, **extra}:
        fail(f"{case}: the caller's optimizer_params were modified: {opt_params}")
    if extra and (trainer._optimizer.momentum or trainer._optimizer.wd):
        fail(f"{case}: the optimizer kept momentum {trainer._optimizer.momentum} / wd "
             f"{trainer._optimizer.wd}")
    mu, wd = extra.get("momentum", 0.0), extra.get("wd", 0.0)
    model = TwoLevel(compression_kwargs(params, mu or None), "float32", N_W, size)
    w_ref, b_ref = init[:N_W].copy(), init[N_W:].copy()
    mom_w = np.zeros(N_W, np.float32)  # weight-decay momentum (wdmom) of the compressed weight
    mom_b = np.zeros(N_B, np.float32)  # Nesterov momentum (nag) of the uncompressed bias
    scale = np.float32(1.0 / (B * size))
    for step in range(STEPS):
        lr = lr_at(step)
        trainer.set_learning_rate(lr)
        gw = [rank_gradient(r, step, case + ".w", N_W) for r in range(size)]
        gb = [rank_gradient(r, step, case + ".b", N_B) for r in range(size)]
        with mx.autograd.record():
            loss = ((mx.nd.array(gw[rank]) * w.data()).sum()
                    + (mx.nd.array(gb[rank]) * b.data()).sum())
        loss.backward()
        trainer.step(B)
        out = model.step([g * scale for g in gw], 1.0, lr)
        if np.allclose(out, np.sum([g * scale for g in gw], axis=0), rtol=1e-3, atol=1e-5):
            fail(f"{case}: the reference equals the plain sum (nothing compressed?)")
        avg_b = np.sum([g * scale for g in gb], axis=0, dtype=np.float32)
        if mu:
            cache = (np.float32(wd) * w_ref).astype(np.float32)
            mom_w = (np.float32(mu) * (mom_w + cache)).astype(np.float32)
            out = (out + mom_w + cache).astype(np.float32)
            avg_b = (avg_b + np.float32(wd) * b_ref).astype(np.float32)
            mom_b = (np.float32(mu) * (mom_b + avg_b)).astype(np.float32)
            avg_b = (avg_b + mom_b).astype(np.float32)
        w_ref = (w_ref - np.float32(lr) * out).astype(np.float32)
        b_ref = (b_ref - np.float32(lr) * avg_b).astype(np.float32)
        got_w, got_b = w.data().asnumpy(), b.data().asnumpy()
        if not np.allclose(got_w, w_ref, rtol=1e-5, atol=1e-6):
            fail(f"{case} step {step}: weight differs from the two-level reference by "
                 f"{float(np.abs(got_w - w_ref).max()):.3g} (first got {got_w[:4].tolist()}, "
                 f"want {w_ref[:4].tolist()})")
            return
        if not np.allclose(got_b, b_ref, rtol=1e-5, atol=1e-6):
            fail(f"{case} step {step}: bias (uncompressed) differs by "
                 f"{float(np.abs(got_b - b_ref).max()):.3g}")
            return
    ok(case)


def mismatch() -> None:
    rank = bps.rank()
    params = {"compressor": "onebit"} if rank == 0 else {"compressor": "topk", "k": 3}
    w = parameter("mismatch_w", np.zeros(N_W, np.float32))
    trainer = bps.DistributedTrainer({"mismatch_w": w}, "sgd", {"learning_rate": 0.1},
                                     compression_params=params)
    with mx.autograd.record():
        loss = w.data().sum()
    loss.backward()
    try:
        trainer.step(1)
        w.data().wait_to_read()
    except MismatchError as e:
        print(f"MXNET_COMPRESS_MISMATCH_RAISED rank={rank}: {e}", flush=True)
        ok("mismatch")
        return
    except Exception as e:
        fail(f"mismatch: {type(e).__name__} instead of MismatchError: {e}")
        return
    fail("mismatch: different compression_params across ranks raised nothing")


def main() -> int:
    bps.init()
    for case, (params, extra) in CASES.items():
        try:
            run_case(case, params, extra)
        except Exception:
            fail(f"{case} raised:\n{traceback.format_exc()}")
    mismatch()
    bps.shutdown()
    print(f"OK {CASES_OK[0]} cases", flush=True)
    return 1 if FAILS[0] else 0


if __name__ == "__main__":
    sys.exit(main())
