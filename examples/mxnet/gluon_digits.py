"""Data-parallel training of a small Gluon MLP on scikit-learn's digits with byteps.mxnet.

Run:
    bpslaunch --workers 2 --servers 1 python examples/mxnet/gluon_digits.py

Every worker trains on its shard of the training set (rank::size) with
``bps.DistributedTrainer``, which starts every worker from rank 0's parameters and averages the
gradients. At the end the test accuracy is summed over the workers' test shards with
``byteps_push_pull`` and every worker checks that its parameters are bit-identical to rank 0's.
The data ship with scikit-learn (no download). Needs: mxnet 1.x (numpy 1.23), scikit-learn,
tqdm.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import byteps.mxnet as bps


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--hidden", type=int, default=128, help="hidden units")
    p.add_argument("--seed", type=int, default=0, help="split / shuffling seed")
    p.add_argument("--fp16", action="store_true", help="send gradients as float16")
    return p.parse_args()


def load_data(seed: int, rank: int, size: int):
    """Standardised digits; a fixed split; this rank's shard of train and test sets."""
    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=seed,
                                              stratify=y)
    mean, std = X_tr.mean(axis=0), X_tr.std(axis=0)
    std[std == 0] = 1.0
    X_tr, X_te = (X_tr - mean) / std, (X_te - mean) / std
    per_rank = len(X_tr) // size  # equal shards: every worker runs the same number of steps
    X_tr, y_tr = X_tr[rank::size][:per_rank], y_tr[rank::size][:per_rank]
    X_te, y_te = X_te[rank::size], y_te[rank::size]
    return (mx.nd.array(X_tr, dtype=np.float32), mx.nd.array(y_tr, dtype=np.float32),
            mx.nd.array(X_te, dtype=np.float32), y_te)


def digest(net: gluon.Block) -> str:
    h = hashlib.sha256()
    for name, param in sorted(net.collect_params().items()):
        h.update(name.encode())
        h.update(param.data().asnumpy().tobytes())
    return h.hexdigest()


def main() -> None:
    args = parse_args()
    t0 = time.time()
    bps.init()
    rank, size = bps.rank(), bps.size()
    X_tr, y_tr, X_te, y_te = load_data(args.seed, rank, size)

    mx.random.seed(1234 + rank)  # different on purpose: the trainer broadcasts rank 0's
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(args.hidden, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net(X_tr[:1])  # run once: shapes known, parameters initialised
    trainer = bps.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": args.momentum},
        root_rank=0, compression_params={"fp16": True} if args.fp16 else None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    steps = max(1, X_tr.shape[0] // args.batch_size)
    rng = np.random.default_rng(args.seed * 1000 + rank)
    bar = tqdm(range(args.epochs), desc=f"{size} workers", disable=rank != 0, unit="epoch")
    for _epoch in bar:
        perm = mx.nd.array(rng.permutation(X_tr.shape[0]), dtype=np.int64)
        total = 0.0
        for i in range(steps):
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            x, y = X_tr.take(idx), y_tr.take(idx)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch_size)
            total += float(loss.mean().asscalar())
        bar.set_postfix(loss=f"{total / steps:.4f}")

    pred = net(X_te).argmax(axis=1).asnumpy().astype(np.int64)
    counts = mx.nd.array([float((pred == y_te).sum()), float(len(y_te))], dtype=np.float64)
    bps.byteps_push_pull(counts, name="eval.counts", is_average=False)
    correct, total = counts.asnumpy()
    accuracy = correct / total

    # Every worker must hold exactly rank 0's parameters.
    mine = digest(net)
    root = bps.broadcast_object(mine, root_rank=0, name="param_digest")
    bad = mx.nd.array([int(mine != root)], dtype=np.int32)
    bps.byteps_push_pull(bad, name="param_check", is_average=False)
    if int(bad.asscalar()):
        raise RuntimeError(f"parameters differ across workers on {int(bad.asscalar())} of "
                           f"{size} ranks (rank {rank}: {mine[:12]} vs rank 0: {root[:12]})")
    if rank == 0:
        print(f"parameters identical on all {size} workers (sha256 {root[:16]})")
        print(f"final test accuracy: {accuracy:.3f}")
        print(f"wall time: {time.time() - t0:.1f} s")
    bps.shutdown()


if __name__ == "__main__":
    main()
