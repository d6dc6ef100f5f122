"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) on one rank: python async_worker.py OUT [opts]

A small regression model (Linear 16->4 after a Linear 16->16 + tanh) trained with SGD through
``bps.DistributedOptimizer`` in asynchronous mode. Every model starts from a rank-dependent seed:
the servers' initial value is rank 0's. Writes OUT/rank<r>.json: its steps' times (``start``:
before ``opt.step()``, i.e. before its push; ``done``: after it returned), steps/s, and the
digest of its final parameters. Options:

--steps N           steps of this rank (--slow-steps for --slow-rank)
--slow-rank R, --sleep S, --slow-steps N   rank R sleeps S seconds per step and runs N steps
--die-rank R, --die-step K   rank R SIGKILLs itself after step K (its deltas so far saved)
--deltas            save each rank's cumulative deltas (OUT/delta<r>.npz, after every step),
                    rank 0's initial value (OUT/init.npz); survivors meet through files when
                    done, pull the servers' parameters and save them (OUT/final<r>.npz)
--reference         (one worker) compare with plain local SGD in this process: bit for bit with
                    the server's arithmetic (p + (p' - p)), and to 1e-6 with p'
--dtype float32|float64
--allow-sync        run in synchronous mode too (for timing comparisons)
--check-refusals    CrossBarrier and DistributedDataParallel raise UsageError (they reduce
                    gradients synchronously)
Prints ``ASYNC_WORKER_OK rank=r`` (exit 0) or raises.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import byteps.torch as bps
from byteps.sync import async_train


def make_model(seed, dtype):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).to(dtype)


def batch(rank, step, dtype):
    g = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(8, 16, generator=g, dtype=dtype)
    y = x[:, :4] * 0.5 - x[:, 4:8] * 0.25
    return x, y


def digest(model):
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().numpy().tobytes())
    return h.hexdigest()


def params_np(model):
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--slow-steps", type=int, default=None)
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-step", type=int, default=0)
    ap.add_argument("--deltas", action="store_true")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--allow-sync", action="store_true")
    ap.add_argument("--check-refusals", action="store_true")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.set_num_threads(1)
    bps.init()
    assert a.allow_sync or async_train.enabled(), "run with BYTEPS_ENABLE_ASYNC=1"
    rank, size = bps.rank(), bps.size()
    if a.check_refusals:
        from byteps.errors import UsageError
        from byteps.torch.cross_barrier import CrossBarrier
        from byteps.torch.parallel import DistributedDataParallel

        m = make_model(0, dtype)
        for what, make in (("CrossBarrier", lambda: CrossBarrier(
                               m, torch.optim.SGD(m.parameters(), lr=0.1))),
                           ("DistributedDataParallel", lambda: DistributedDataParallel(m))):
            try:
                make()
            except UsageError as e:
                assert "BYTEPS_ENABLE_ASYNC" in str(e), e
            else:
                raise AssertionError(f"{what} did not raise UsageError in asynchronous mode")
    model = make_model(1000 + rank, dtype)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr),
                                   named_parameters=model.named_parameters())
    if a.deltas and rank == 0:
        np.savez(a.out / "init.npz", **params_np(model))
    ref = None
    if a.reference:
        assert size == 1
        ref = make_model(1000, dtype)  # rank 0's start: what the servers hold first
        ref_plain = make_model(1000, dtype)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=a.lr)
        plain_opt = torch.optim.SGD(ref_plain.parameters(), lr=a.lr)
    steps = a.slow_steps if rank == a.slow_rank and a.slow_steps else a.steps
    cum = {n: np.zeros(p.shape, np.float64) for n, p in model.named_parameters()}
    start, done = [], []
    for step in range(1, steps + 1):
        x, y = batch(rank, step, dtype)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if rank == a.slow_rank and a.sleep:
            time.sleep(a.sleep)
        if a.deltas:
            # The delta this step pushes: the local step's, from the parameters it starts at
            # (the servers' value after the previous step; rank 0's initial value at step 1).
            if step == 1:
                bps.pull_parameters(opt)
            before = params_np(model)
            with torch.no_grad():
                saved = [p.detach().clone() for p in model.parameters()]
                torch.optim.SGD.step(opt)  # the local step alone, to see its delta
                after = params_np(model)
                for p, s in zip(model.parameters(), saved):
                    p.copy_(s)
            for n in cum:
                cum[n] += after[n].astype(np.float64) - before[n].astype(np.float64)
        start.append(time.monotonic())
        opt.step()
        done.append(time.monotonic())
        if a.deltas:
            np.savez(a.out / f"delta{rank}.tmp.npz", **cum)
            os.replace(a.out / f"delta{rank}.tmp.npz", a.out / f"delta{rank}.npz")
        if ref is not None:
            ref_opt.zero_grad()
            plain_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            F.mse_loss(ref_plain(x), y).backward()
            with torch.no_grad():
                old = [p.detach().clone() for p in ref.parameters()]
                ref_opt.step()
                for p, o in zip(ref.parameters(), old):
                    p.copy_(o + (p - o))  # the server's arithmetic: store + delta
            plain_opt.step()
        if rank == a.die_rank and step == a.die_step:
            os.kill(os.getpid(), signal.SIGKILL)
    record = {"rank": rank, "start": start, "done": done, "steps": steps,
              "steps_per_s": (steps - 1) / (done[-1] - done[0]) if steps > 1 else 0.0}
    if a.deltas:
        (a.out / f"done{rank}").write_text("1")
        survivors = [r for r in range(size) if r != a.die_rank]
        deadline = time.monotonic() + 60
        while not all((a.out / f"done{r}").exists() for r in survivors):
            assert time.monotonic() < deadline, "the other survivors did not finish"
            time.sleep(0.05)
        bps.pull_parameters(opt)
        np.savez(a.out / f"final{rank}.npz", **params_np(model))
    if ref is not None:
        for (n, p), r, q in zip(model.named_parameters(), ref.parameters(),
                                ref_plain.parameters()):
            assert torch.equal(p, r), f"{n}: differs from p + (p' - p)"
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    record["digest"] = digest(model)
    (a.out / f"rank{rank}.json").write_text(json.dumps(record))
    print(f"ASYNC_WORKER_OK rank={rank} steps={steps} steps_per_s={record['steps_per_s']:.1f} "
          f"digest={record['digest'][:16]}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
