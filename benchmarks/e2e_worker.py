"""One worker of the end-to-end training benchmark (:mod:`benchmarks.e2e`).

Trains a small ResNet-like CNN (:func:`make_model`) on synthetic 3 x 32 x 32 images with a
real forward and backward pass on the CPU (``torch.set_num_threads(1)``), data-parallel in one
of the modes of :data:`MODES`, and prints one line ``RESULT {json}``:

* ``local``: one process, plain ``torch.optim.SGD``, no communication (the scaling baseline);
* ``optimizer``: ``byteps.torch.DistributedOptimizer`` (gradients push_pulled from the
  backward hooks, waited for in ``step()``);
* ``ddp``: ``byteps.torch.parallel.DistributedDataParallel`` around the model, plain SGD;
* ``xbar``: ``byteps.torch.cross_barrier.CrossBarrier`` (no global barrier between
  iterations: each layer's update waits only for its own gradient);
* ``torch-ddp``: ``torch.nn.parallel.DistributedDataParallel`` with the gloo backend
  (``env://``: ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``).

The byteps modes take the cluster from ``DMLC_*`` (as :func:`benchmarks.cluster.run_byteps_job`
sets it). With ``E2E_TRACE_DIR`` set, a byteps worker traces its communication
(``BYTEPS_TRACE_ON=1``, ``BYTEPS_TRACE_DIR=$E2E_TRACE_DIR/w<DMLC_WORKER_ID>``: one directory
per worker host, since every host's worker has local rank 0).

Every rank draws its own images (seed ``seed * 1000 + rank``; class templates plus noise, so
the loss falls) and starts from the same weights (seed ``seed``). ``RESULT`` holds the seconds
of every timed step (``times``: step start to step start, after ``warmup`` untimed steps and
before one untimed cool-down step;
forward, backward, communication and update), ``images_per_s`` = batch x timed steps / their
total time (a mean, not a median: CrossBarrier's steps alternate long and short),
the first and last loss, the SHA-256 of the parameters at the end (``digest``: equal on every
rank when the gradients really were averaged) and the gradient bytes per step.

Run by the benchmark: ``python -m benchmarks.e2e_worker --mode optimizer --steps 10``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

MODES = ("local", "optimizer", "ddp", "xbar", "torch-ddp")
BYTEPS_MODES = ("optimizer", "ddp", "xbar")
#: The model's default stage widths (channels at 32, 16, 8 and 4 pixels) and hidden units.
WIDTHS = (16, 32, 64, 128)
HIDDEN = 1024
IMAGE = (3, 32, 32)
CLASSES = 10


def make_model(widths=WIDTHS, hidden: int = HIDDEN):
    """The benchmark's CNN: (N, 3, 32, 32) float32 images -> (N, 10) logits.

    A 3x3 stem convolution, then four stages (32, 16, 8, 4 pixels; channels ``widths``), each
    a residual block of two 3x3 convolutions with BatchNorm (the later ones after a stride-2
    3x3 convolution + BatchNorm that halves the resolution), then fully connected
    ``widths[-1] * 16 -> hidden -> 10``. With the defaults: 2 598 746 parameters (10.4 MB of
    float32 gradients per step, 60 % of them in the first fully connected layer, as in VGG),
    and about 80 ms of forward + backward + update per batch of 16 on one core of this kind of
    machine.
    """
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)

        def forward(self, x):
            return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))

    def down(ci: int, co: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(ci, co, 3, stride=2, padding=1, bias=False),
                             nn.BatchNorm2d(co), nn.ReLU())

    w = list(widths)
    layers = [nn.Conv2d(IMAGE[0], w[0], 3, padding=1, bias=False), nn.BatchNorm2d(w[0]),
              nn.ReLU(), Block(w[0])]
    for ci, co in zip(w, w[1:]):
        layers += [down(ci, co), Block(co)]
    side = IMAGE[1] >> (len(w) - 1)
    layers += [nn.Flatten(), nn.Linear(w[-1] * side * side, hidden), nn.ReLU(),
               nn.Linear(hidden, CLASSES)]
    return nn.Sequential(*layers)


def synthetic_data(batch: int, batches: int, seed: int, rank: int):
    """``batches`` batches of (images (batch, 3, 32, 32) float32, labels (batch,) int64):
    a per-class template (seed ``seed``, the same on every rank) plus unit noise (seed
    ``seed * 1000 + rank``)."""
    import torch

    templates = torch.randn(CLASSES, *IMAGE, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    out = []
    for _ in range(batches):
        y = torch.randint(0, CLASSES, (batch,), generator=g)
        x = 0.5 * templates[y] + torch.randn(batch, *IMAGE, generator=g)
        out.append((x, y))
    return out


def digest(model) -> str:
    """SHA-256 of the parameters (names sorted; buffers such as BatchNorm statistics left out:
    each rank keeps its own)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _trace_env() -> None:
    """Point byteps' tracing at this worker host's own directory (before ``bps.init``)."""
    base = os.environ.get("E2E_TRACE_DIR")
    if base:
        os.environ["BYTEPS_TRACE_ON"] = "1"
        os.environ["BYTEPS_TRACE_DIR"] = os.path.join(
            base, f"w{os.environ.get('DMLC_WORKER_ID', '0')}")


def setup(mode: str, model, lr: float, total_steps: int):
    """Initialise communication for ``mode``; returns (module to call, optimizer, rank, size,
    shutdown callable)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if mode == "local":
        return model, opt, 0, 1, lambda: None
    if mode == "torch-ddp":
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=300))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        return ddp, opt, dist.get_rank(), dist.get_world_size(), dist.destroy_process_group
    _trace_env()
    import byteps.torch as bps

    bps.init()
    rank, size = bps.rank(), bps.size()
    if mode == "optimizer":
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        bps.broadcast_optimizer_state(opt, root_rank=0)
        return model, opt, rank, size, bps.shutdown
    if mode == "ddp":
        from byteps.torch.parallel import DistributedDataParallel

        return DistributedDataParallel(model), opt, rank, size, bps.shutdown
    if mode == "xbar":
        from byteps.torch.cross_barrier import CrossBarrier

        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = CrossBarrier(model, opt, named_parameters=model.named_parameters(),
                           num_steps=total_steps)
        return model, opt, rank, size, bps.shutdown
    raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")


def train(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = make_model(tuple(args.widths), args.hidden)
    # One untimed cool-down step after the timed ones: every timed step then runs start to
    # start of the next, with one reduction each, in every mode (CrossBarrier's last step
    # also waits for the updates still in flight: a once-per-training drain, not a step).
    end = args.warmup + args.steps
    total = end + 1
    net, opt, rank, size, shutdown = setup(args.mode, model, args.lr, total)
    data = synthetic_data(args.batch, args.batches, args.seed, rank)
    losses, marks, phases = [], [], []
    t_start = t_end = None
    for i in range(total):
        if i == args.warmup:
            t_start = time.monotonic()
        if i == end:
            t_end = time.monotonic()
        marks.append(time.perf_counter())
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        t_fwd = time.perf_counter()
        loss.backward()
        t_bwd = time.perf_counter()
        opt.step()
        losses.append(float(loss.detach()))
        phases.append((marks[-1], t_fwd, t_bwd, time.perf_counter()))
    times = [b - a for a, b in zip(marks[args.warmup:end], marks[args.warmup + 1:end + 1])]
    result = {
        "mode": args.mode, "rank": rank, "size": size, "batch": args.batch,
        "times": times, "images_per_s": args.batch * len(times) / sum(times),
        # per timed step: zero_grad + forward (with CrossBarrier's waits for updates),
        # backward, step (DistributedOptimizer: the wait for the reductions and the update)
        "phases": [[b - a, c - b, d - c] for a, b, c, d in phases[args.warmup:end]],
        "loss_first": losses[0], "loss_last": losses[-1], "digest": digest(model),
        "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "params": sum(p.numel() for p in model.parameters()),
        "t_start": t_start, "t_end": t_end,
    }
    if args.mode in BYTEPS_MODES:
        import byteps._core as core

        # the PUSH credit (the adaptive window's mean, docs/architecture.md section 5)
        if core.is_distributed():
            result["push_credit"] = core.push_credit()
        if os.environ.get("BYTEPS_AUTOTUNE", "0") not in ("", "0"):
            result["autotune"] = core.autotune_status()  # what the tuner tried and chose
    shutdown()
    return result


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e_worker",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps (default 3)")
    p.add_argument("--batch", type=int, default=16, help="images per step per worker")
    p.add_argument("--batches", type=int, default=16,
                   help="distinct synthetic batches cycled (default 16)")
    p.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                   help="channels of the stages at 32, 16, 8, 4... pixels")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="hidden units of the FC layer")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        print("e2e_worker: --steps and --warmup must be >= 1", file=sys.stderr)
        return 2
    res = train(args)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
