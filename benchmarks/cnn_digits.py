"""A small CNN trained data-parallel on scikit-learn's digits with byteps.torch (CPU only).

The compression benchmark's training workload (:mod:`benchmarks.compression`): the 8×8 digit
images of ``examples/torch/train_digits.py`` (same split, standardisation and shards: its
``load_data``) through two 3×3 convolutions (1→32→64 channels, padding 1, ReLU) and two fully
connected layers (4096→``--hidden``→10). The first fully connected layer holds almost every
parameter (4096 × 256 float32 = 4 MiB of gradient per step by default), so on a slow link the
step time is the push_pull of that gradient: the regime gradient compression is for.

Run (a byteps job: ``bpslaunch`` or :func:`benchmarks.cluster.run_byteps_job`)::

    bpslaunch --workers 2 --servers 1 python -m benchmarks.cnn_digits [--epochs 6]
        [--compression-params '{"compressor": "onebit", "ef": "vanilla", "scaling": true}']

Rank 0 prints ``final test accuracy: 0.xxx`` (the test shards of every worker summed with
``push_pull``) and ``time per step: X ms`` (median over the steps after the first epoch, each
from ``zero_grad`` to the end of ``step``), as the example does; every worker checks that its
parameters are bit-identical to rank 0's (exit 1 otherwise). Needs torch and scikit-learn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from . import ROOT


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.cnn_digits",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--hidden", type=int, default=256, help="units of the hidden FC layer")
    p.add_argument("--seed", type=int, default=0, help="split / shuffling seed")
    p.add_argument("--compression-params", type=json.loads, default=None, metavar="JSON",
                   help="gradient compression by the core (upstream's dict)")
    return p.parse_args(argv)


def make_model(hidden: int):
    """The CNN: (N, 1, 8, 8) float32 -> (N, 10) logits."""
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64 * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    import byteps.torch as bps

    sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
    from train_digits import digest, load_data

    torch.set_num_threads(1)  # every process of the job shares a few cores
    bps.init()
    rank, size = bps.rank(), bps.size()
    X_tr, y_tr, X_te, y_te = load_data(args.seed, rank, size)
    X_tr, X_te = X_tr.reshape(-1, 1, 8, 8), X_te.reshape(-1, 1, 8, 8)
    torch.manual_seed(1234 + rank)  # different on purpose: the broadcast makes them equal
    model = make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression_params=args.compression_params)
    bps.broadcast_optimizer_state(opt, root_rank=0)

    steps = max(1, len(X_tr) // args.batch_size)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    step_times = []
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(X_tr), generator=gen)
        total = 0.0
        for i in range(steps):
            t_step = time.perf_counter()
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(X_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            total += loss.item()
            if epoch:
                step_times.append(time.perf_counter() - t_step)
        if rank == 0:
            print(f"epoch {epoch}: loss {total / steps:.4f}", flush=True)
    train_s = time.perf_counter() - t0

    model.eval()
    with torch.no_grad():
        correct = (model(X_te).argmax(dim=1) == y_te).sum()
    counts = torch.tensor([float(correct), float(len(y_te))], dtype=torch.float64)
    counts = bps.push_pull(counts, average=False, name="eval.counts")
    accuracy = (counts[0] / counts[1]).item()
    mine = digest(model)
    root = bps.broadcast_object(mine, root_rank=0, name="param_digest")
    bad = bps.push_pull(torch.tensor([int(mine != root)], dtype=torch.int32), average=False,
                        name="param_check")
    if bad.item():
        print(f"FAIL: parameters differ across workers on {bad.item()} of {size} ranks",
              flush=True)
        return 1
    if rank == 0:
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"parameters identical on all {size} workers (sha256 {root[:16]}); "
              f"{grad_bytes} bytes of gradients per step")
        print(f"final test accuracy: {accuracy:.3f}")
        if step_times:
            print(f"time per step: {1e3 * statistics.median(step_times):.2f} ms (median of "
                  f"{len(step_times)} steps after the first epoch)")
        print(f"training time: {train_s:.1f} s", flush=True)
    bps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
