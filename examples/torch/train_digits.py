"""Data-parallel training of a small MLP (or CNN) on scikit-learn's digits with byteps.torch.

Run:
    bpslaunch --workers 2 --servers 1 python examples/torch/train_digits.py
    # gradients compressed by the core (onebit with error feedback; the weight matrices are
    # 32 KiB and 5 KiB, so the threshold is lowered):
    BYTEPS_MIN_COMPRESS_BYTES=4096 bpslaunch --workers 2 --servers 1 python \
        examples/torch/train_digits.py \
        --compression-params '{"compressor": "onebit", "ef": "vanilla", "scaling": true}'

Asynchronous training (docs/async.md): the same script with ``BYTEPS_ENABLE_ASYNC=1`` in every
process (``BYTEPS_ENABLE_ASYNC=1 bpslaunch --workers 2 --servers 1 python
examples/torch/train_digits.py``): the servers keep the parameters, each worker steps at its
own pace; at the end the workers meet once and read the servers' parameters.

``--model cnn`` trains a small CNN instead (two 3x3 convolutions, 1->32->64 channels, then
fully connected 4096->``--hidden``->10): its first fully connected layer holds almost every
parameter (4 MiB of gradient per step with ``--hidden 256``), the regime gradient compression
is for (the compression benchmark trains both models).

Every worker trains on its shard of the training set (rank::size); gradients are averaged by
``bps.DistributedOptimizer``; the initial parameters and optimizer state come from rank 0.
At the end the test accuracy is summed over the workers' test shards with ``push_pull`` and
every worker checks that its parameters are bit-identical to rank 0's; rank 0 prints the
accuracy, the median time per step after the first epoch and the wall time. The data ships with
scikit-learn (no download). Needs: torch, scikit-learn, tqdm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import byteps.torch as bps
from byteps.sync import async_train


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32, help="batch size per worker")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 0.05 for sgd, 0.003 for adam)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                   help="SGD with momentum 0.9, or Adam")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                   help="64-hidden-10 MLP, or the small CNN (conv 32-64, FC 4096-hidden-10)")
    p.add_argument("--hidden", type=int, default=128, help="hidden units")
    p.add_argument("--seed", type=int, default=0, help="split / shuffling seed")
    p.add_argument("--fp16", action="store_true", help="send gradients as float16")
    p.add_argument("--compression-params", type=json.loads, default=None, metavar="JSON",
                   help="gradient compression by the core, upstream's dict, e.g. "
                   "'{\"compressor\": \"onebit\", \"ef\": \"vanilla\", \"scaling\": true}' "
                   "(tensors under BYTEPS_MIN_COMPRESS_BYTES, default 65536, stay exact)")
    return p.parse_args()


def load_data(seed: int, rank: int, size: int):
    """Standardised digits; a fixed split; this rank's shard of train and test sets."""
    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=seed,
                                              stratify=y)
    mean, std = X_tr.mean(axis=0), X_tr.std(axis=0)
    std[std == 0] = 1.0
    X_tr, X_te = (X_tr - mean) / std, (X_te - mean) / std
    # Equal shard sizes, so every worker runs the same number of steps.
    per_rank = len(X_tr) // size
    X_tr, y_tr = X_tr[rank::size][:per_rank], y_tr[rank::size][:per_rank]
    X_te, y_te = X_te[rank::size], y_te[rank::size]

    def t(a, dtype):
        return torch.tensor(a, dtype=dtype)

    return (t(X_tr, torch.float32), t(y_tr, torch.int64), t(X_te, torch.float32),
            t(y_te, torch.int64))


def make_model(kind: str, hidden: int) -> torch.nn.Module:
    """The MLP ((N, 64) -> (N, 10) logits) or the CNN ((N, 1, 8, 8) -> (N, 10))."""
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64 * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    args = parse_args()
    t0 = time.time()
    torch.set_num_threads(1)  # a few processes share a few cores
    bps.init()
    rank, size = bps.rank(), bps.size()
    X_tr, y_tr, X_te, y_te = load_data(args.seed, rank, size)

    torch.manual_seed(1234 + rank)  # different on purpose: the broadcast makes them equal
    model = make_model(args.model, args.hidden)
    if args.model == "cnn":  # (N, 64) -> (N, 1, 8, 8) images
        X_tr, X_te = X_tr.reshape(-1, 1, 8, 8), X_te.reshape(-1, 1, 8, 8)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr or 0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr or 0.003)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=bps.Compression.fp16 if args.fp16 else bps.Compression.none,
        compression_params=args.compression_params)
    bps.broadcast_optimizer_state(opt, root_rank=0)

    steps = max(1, len(X_tr) // args.batch_size)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    step_times = []  # seconds per step after the first epoch (first use of every tensor)
    bar = tqdm(range(args.epochs), desc=f"{size} workers", disable=rank != 0, unit="epoch")
    for epoch in bar:
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
        bar.set_postfix(loss=f"{total / steps:.4f}")

    if async_train.enabled():
        # Every worker has pushed its last delta once all meet here: the servers' parameters
        # are final, and every worker reads the same ones.
        bps.push_pull(torch.zeros(1), average=False, name="async.done")
        bps.pull_parameters(opt)

    model.eval()
    with torch.no_grad():
        correct = (model(X_te).argmax(dim=1) == y_te).sum()
    counts = torch.tensor([float(correct), float(len(y_te))], dtype=torch.float64)
    counts = bps.push_pull(counts, average=False, name="eval.counts")
    accuracy = (counts[0] / counts[1]).item()

    # Every worker must hold exactly rank 0's parameters.
    mine = digest(model)
    root = bps.broadcast_object(mine, root_rank=0, name="param_digest")
    bad = bps.push_pull(torch.tensor([int(mine != root)], dtype=torch.int32), average=False,
                        name="param_check")
    if bad.item():
        raise RuntimeError(f"parameters differ across workers on {bad.item()} of {size} ranks "
                           f"(rank {rank}: {mine[:12]} vs rank 0: {root[:12]})")
    if rank == 0:
        mode = "asynchronous" if async_train.enabled() else "synchronous"
        print(f"{mode} training on {size} workers")
        print(f"parameters identical on all {size} workers (sha256 {root[:16]})")
        print(f"final test accuracy: {accuracy:.3f}")
        if step_times:
            print(f"time per step: {1e3 * statistics.median(step_times):.2f} ms (median of "
                  f"{len(step_times)} steps after the first epoch)")
        print(f"wall time: {time.time() - t0:.1f} s")
    bps.shutdown()


if __name__ == "__main__":
    main()
