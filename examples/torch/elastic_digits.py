"""Elastic training: a worker dies, the survivors restart the job and go on from a checkpoint.

Run (one command; it is the job's supervisor):
    python examples/torch/elastic_digits.py --workers 3 --fail-rank 2 --fail-epoch 4

The supervisor starts the job the upstream way, one ``bpslaunch`` per role (``DMLC_ROLE`` =
scheduler, server, worker with ``DMLC_WORKER_ID``), all sharing one ``BYTEPS_SECRET``. Each
worker trains the digits MLP of ``train_digits.py`` and checkpoints model and optimizer state in
memory after every epoch. Worker ``--fail-rank`` dies abruptly in epoch ``--fail-epoch`` (as a
lost machine would). The others get ``PeerLostError``, call ``bps.suspend()`` and wait; the old
scheduler and server exit with the failed job; the supervisor starts new ones for the survivors
at the same address and writes the restart plan (new size, new ranks); each survivor calls
``bps.resume(num_workers, num_servers, new_rank)``, rebuilds model and optimizer from its
checkpoint, re-shards the data for the new size and trains the remaining epochs. It ends with
``final test accuracy: 0.9xx`` and identical parameters on every survivor. Needs: torch,
scikit-learn.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=3, help="worker machines at the start")
    p.add_argument("--epochs", type=int, default=12, help="passes over the training set")
    p.add_argument("--fail-rank", type=int, default=2, help="the worker that dies")
    p.add_argument("--fail-epoch", type=int, default=4, help="the epoch it dies in")
    p.add_argument("--worker", metavar="RESTART_FILE", help=argparse.SUPPRESS)
    return p.parse_args()


# ------------------------------------------------------------------------------ supervisor --


def supervise(args) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    restart = os.path.join(tempfile.mkdtemp(prefix="bps_elastic_"), "restart.json")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    base.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER="1",
                BYTEPS_SECRET=secrets.token_hex(32), BYTEPS_HEARTBEAT_TIMEOUT="5")
    bpslaunch = [sys.executable, "-m", "byteps.launch"]

    def services(n):
        env = dict(base, DMLC_NUM_WORKER=str(n))
        return [subprocess.Popen(bpslaunch, env=dict(env, DMLC_ROLE=role))
                for role in ("scheduler", "server")]

    old = services(args.workers)
    workers = [subprocess.Popen(
        bpslaunch + [sys.executable, __file__, "--worker", restart, "--epochs", str(args.epochs),
                     "--fail-rank", str(args.fail_rank), "--fail-epoch", str(args.fail_epoch)],
        env=dict(base, DMLC_ROLE="worker", DMLC_NUM_WORKER=str(args.workers),
                 DMLC_WORKER_ID=str(i))) for i in range(args.workers)]
    try:
        failed = workers[args.fail_rank]
        failed.wait()
        print(f"supervisor: worker {args.fail_rank} exited with {failed.returncode}; restarting "
              f"the job for {args.workers - 1} workers", flush=True)
        for p in old:  # the failed job's scheduler and server end by themselves
            p.wait(60)
        new = services(args.workers - 1)
        survivors = [i for i in range(args.workers) if i != args.fail_rank]
        plan = {"num_workers": len(survivors), "num_servers": 1,
                "ranks": {str(old_rank): new_rank for new_rank, old_rank in enumerate(survivors)}}
        with open(restart + ".tmp", "w") as f:
            json.dump(plan, f)
        os.replace(restart + ".tmp", restart)
        codes = [workers[i].wait(300) for i in survivors]
        for p in new:
            p.wait(60)
    finally:
        for p in old + workers + locals().get("new", []):
            if p.poll() is None:
                p.kill()  # our own children, by PID
    return 0 if all(c == 0 for c in codes) else 1


# ---------------------------------------------------------------------------------- worker --


def train(args) -> None:
    import torch
    import torch.nn.functional as F

    import byteps.torch as bps
    from byteps.errors import PeerLostError

    sys.path.insert(0, HERE)
    from train_digits import digest, load_data

    torch.set_num_threads(1)
    bps.init()
    rank0 = bps.rank()

    def build(state=None):
        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if state:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        bps.broadcast_optimizer_state(opt, root_rank=0)
        return model, opt

    def run_epochs(model, opt, first_epoch):
        rank, size = bps.rank(), bps.size()
        X_tr, y_tr, _, _ = load_data(0, rank, size)
        steps = max(1, len(X_tr) // 32)
        for epoch in range(first_epoch, args.epochs):
            gen = torch.Generator().manual_seed(epoch * 1000 + rank)
            perm = torch.randperm(len(X_tr), generator=gen)
            for i in range(steps):
                if rank0 == args.fail_rank and epoch == args.fail_epoch and i == steps // 2:
                    print(f"worker {rank0}: dying in epoch {epoch}", flush=True)
                    os._exit(1)  # a lost machine: no goodbye
                idx = perm[i * 32:(i + 1) * 32]
                opt.zero_grad()
                F.cross_entropy(model(X_tr[idx]), y_tr[idx]).backward()
                opt.step()
            checkpoint.update(epoch=epoch + 1, model={k: v.clone() for k, v in
                                                      model.state_dict().items()},
                              opt=copy.deepcopy(opt.state_dict()))

    model, opt = build()
    checkpoint = {"epoch": 0, "model": None, "opt": None}
    try:
        run_epochs(model, opt, 0)
    except PeerLostError as exc:
        print(f"worker {rank0}: {exc}; suspending at the checkpoint of epoch "
              f"{checkpoint['epoch']}", flush=True)
        bps.suspend()
        while not os.path.exists(args.worker):
            time.sleep(0.1)
        with open(args.worker) as f:
            plan = json.load(f)
        bps.resume(plan["num_workers"], plan["num_servers"], plan["ranks"][str(rank0)])
        print(f"worker {rank0}: resumed as rank {bps.rank()} of {bps.size()} at epoch "
              f"{checkpoint['epoch']}", flush=True)
        model, opt = build(checkpoint if checkpoint["model"] else None)
        run_epochs(model, opt, checkpoint["epoch"])

    rank, size = bps.rank(), bps.size()
    _, _, X_te, y_te = load_data(0, rank, size)
    with torch.no_grad():
        correct = (model(X_te).argmax(dim=1) == y_te).sum()
    counts = bps.push_pull(torch.tensor([float(correct), float(len(y_te))], dtype=torch.float64),
                           average=False, name="eval.counts")
    mine = digest(model)
    same = bps.broadcast_object(mine, root_rank=0, name="param_digest") == mine
    bad = bps.push_pull(torch.tensor([int(not same)], dtype=torch.int32), average=False,
                        name="param_check")
    if bad.item():
        raise RuntimeError("parameters differ across the survivors")
    if rank == 0:
        print(f"final test accuracy: {(counts[0] / counts[1]).item():.3f} on {size} workers "
              f"(parameters identical on every worker)", flush=True)
    bps.shutdown()


def main() -> int:
    args = parse_args()
    if args.worker:
        train(args)
        return 0
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
