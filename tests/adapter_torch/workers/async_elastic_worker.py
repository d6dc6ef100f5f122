"""Worker of test_torch_async.py's elastic case: ``python async_elastic_worker.py RESTART_FILE``.

Asynchronous training (BYTEPS_ENABLE_ASYNC=1) with an elastic restart: after 10 steps each
worker reads the servers' parameters (``pull_parameters``) into its checkpoint and prints
``CHECKPOINT <digest>`` and ``READY``, then keeps stepping until a peer is lost (the test kills
the server): ``SUSPENDED <error class>``, ``suspend()``, wait for RESTART_FILE (JSON
``{"num_workers", "num_servers", "ranks": {old rank: new rank}}``), ``resume()``, load its
checkpoint into a new model and optimizer, and read the new servers' parameters:
``RESUMED <digest>`` (rank 0's checkpoint: the new servers start from rank 0's first push).
Then, once RESTART_FILE + ``.go`` exists (the test writes it after every worker resumed: a
worker whose first push arrives after another's deltas gets the store with those deltas, as
asynchronous training defines), 5 more steps; last line ``OK``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import byteps.torch as bps
from byteps import errors


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    return model, opt


def digest(model):
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode() + p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def step(model, opt, k):
    g = torch.Generator().manual_seed(bps.rank() * 1000 + k)
    x = torch.randn(16, 8, generator=g)
    opt.zero_grad()
    F.mse_loss(model(x), x[:, :2] * 0.5).backward()
    opt.step()


def wait_for(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no {path} within 120 s"
        time.sleep(0.05)


def main():
    restart_file = sys.argv[1]
    torch.set_num_threads(1)
    bps.init()
    model, opt = make(10 + bps.rank())
    checkpoint = None
    k = 0
    try:
        while k < 5000:  # until a peer is lost (the test kills the server)
            step(model, opt, k)
            k += 1
            if k == 10:
                bps.pull_parameters(opt)
                checkpoint = copy.deepcopy(model.state_dict())
                print(f"CHECKPOINT {digest(model)}", flush=True)
                print(f"READY pid={os.getpid()}", flush=True)
            time.sleep(0.005)
    except errors.PeerLostError as exc:
        print(f"SUSPENDED {type(exc).__name__}", flush=True)
    old_rank = bps.rank()
    bps.suspend()
    wait_for(restart_file)
    with open(restart_file) as f:
        plan = json.load(f)
    bps.resume(plan["num_workers"], plan["num_servers"], plan["ranks"][str(old_rank)])
    model, opt = make(99)  # a fresh model, then the checkpoint
    model.load_state_dict(checkpoint)
    bps.pull_parameters(opt)
    print(f"RESUMED {digest(model)}", flush=True)
    wait_for(restart_file + ".go")
    for _ in range(5):
        step(model, opt, k)
        k += 1
    bps.shutdown()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
