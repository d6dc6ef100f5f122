"""DistributedOptimizer with ``compression_params`` in a real job, run on every rank:
python compression_worker.py (2+ workers, 1 server, ``BYTEPS_MIN_COMPRESS_BYTES=4096``).

Each case trains a weight of N_W float32 elements (compressed: 8000 bytes, one partition) and a
bias of N_B (64 bytes: below the threshold, summed exactly) with SGD for a few steps, the
learning rate changing every step, and compares the parameters with the NumPy model of the
two-level scheme (tests/compression_sgd.py over tests/compression_reference.py); then ranks
that pass different dicts must all get MismatchError. Prints ``TORCH_COMPRESS_OK rank=..``
(``TORCH_COMPRESS_FAILED``, exit 1, otherwise) and ``TORCH_COMPRESS_MISMATCH_RAISED``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from _common import Checker
from compression_sgd import TwoLevel, rank_gradient

import byteps.torch as bps
from byteps.errors import MismatchError
from byteps.sync.compression import compression_kwargs

N_W, N_B, STEPS, LR0 = 2000, 16, 3, 0.1

CASES = {
    # name: (compression_params, the optimizer's momentum)
    "onebit": ({"compressor": "onebit"}, 0.0),
    "onebit_scaling": ({"compressor": "onebit", "scaling": True}, 0.0),
    "topk": ({"compressor": "topk", "k": 50}, 0.0),
    # mu from the optimizer's momentum, which is set to 0; the bias gets it in the adapter
    "topk_ef_nesterov": ({"compressor": "topk", "k": 0.05, "ef": "vanilla",
                          "momentum": "nesterov"}, 0.9),
}


def lr_at(step: int) -> float:
    return LR0 / (1 + step)


def run_case(ck: Checker, case: str, params: dict, momentum: float) -> None:
    rank, size = bps.rank(), bps.size()
    init = np.random.default_rng(7).standard_normal(N_W + N_B).astype(np.float32)
    w = torch.nn.Parameter(torch.from_numpy(init[:N_W].copy()))
    b = torch.nn.Parameter(torch.from_numpy(init[N_W:].copy()))
    base = torch.optim.SGD([w, b], lr=LR0, momentum=momentum)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = bps.DistributedOptimizer(base, named_parameters=[(f"{case}.w", w),
                                                               (f"{case}.b", b)],
                                       compression_params=params)
    if momentum:
        ck.check(any("set to 0" in str(c.message) for c in caught),
                 f"{case}: no warning that the optimizer's momentum was set to 0")
        ck.check(base.param_groups[0]["momentum"] == 0, f"{case}: momentum not set to 0")
    kwargs = compression_kwargs(params, momentum or None)
    model = TwoLevel(kwargs, "float32", N_W, size)
    w_ref, b_ref = init[:N_W].copy(), init[N_W:].copy()
    m_b = np.zeros(N_B, np.float32)
    for step in range(STEPS):
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        gw = [rank_gradient(r, step, case + ".w", N_W) for r in range(size)]
        gb = [rank_gradient(r, step, case + ".b", N_B) for r in range(size)]
        opt.zero_grad()
        loss = (torch.from_numpy(gw[rank]) * w).sum() + (torch.from_numpy(gb[rank]) * b).sum()
        loss.backward()
        opt.step()
        out = model.step(gw, 1.0 / size, lr)
        plain = np.mean(gw, axis=0, dtype=np.float32)
        ck.check(not np.allclose(out, plain, rtol=1e-3, atol=1e-4),
                 f"{case}: the reference equals the plain average (nothing compressed?)")
        w_ref = (w_ref - np.float32(lr) * out).astype(np.float32)
        avg_b = (np.sum(gb, axis=0, dtype=np.float32) / np.float32(size)).astype(np.float32)
        if momentum:  # Nesterov of the uncompressed bias, in the adapter
            m_b = (np.float32(momentum) * m_b + avg_b).astype(np.float32)
            avg_b = (avg_b + np.float32(momentum) * m_b).astype(np.float32)
        b_ref = (b_ref - np.float32(lr) * avg_b).astype(np.float32)
        got_w, got_b = w.detach().numpy(), b.detach().numpy()
        dw = float(np.abs(got_w - w_ref).max())
        ck.check(np.allclose(got_w, w_ref, rtol=1e-5, atol=1e-6),
                 f"{case} step {step}: weight differs from the two-level reference by {dw:.3g} "
                 f"(first got {got_w[:4].tolist()}, want {w_ref[:4].tolist()})")
        db = float(np.abs(got_b - b_ref).max())
        ck.check(np.allclose(got_b, b_ref, rtol=1e-5, atol=1e-6),
                 f"{case} step {step}: bias (uncompressed) differs by {db:.3g}")


def mismatch(ck: Checker) -> None:
    rank = bps.rank()
    params = {"compressor": "onebit"} if rank == 0 else {"compressor": "topk", "k": 3}
    w = torch.nn.Parameter(torch.zeros(N_W))
    opt = bps.DistributedOptimizer(torch.optim.SGD([w], lr=0.1),
                                   named_parameters=[("mismatch.w", w)],
                                   compression_params=params)
    w.sum().backward()
    try:
        opt.step()
    except MismatchError as e:
        print(f"TORCH_COMPRESS_MISMATCH_RAISED rank={rank}: {e}", flush=True)
        ck.check(True, "mismatch")
        return
    except Exception as e:
        ck.check(False, f"mismatch: {type(e).__name__} instead of MismatchError: {e}")
        return
    ck.check(False, "mismatch: different compression_params across ranks raised nothing")


def main() -> None:
    bps.init()
    ck = Checker("TORCH_COMPRESS")
    for case, (params, momentum) in CASES.items():
        ck.run(case, run_case, ck, case, params, momentum)
    ck.run("mismatch", mismatch, ck)
    ck.finish()
    bps.shutdown()


if __name__ == "__main__":
    main()
