"""Worker of tests/test_elastic.py: ``python elastic_worker.py RESTART_FILE``.

A training-shaped loop with an elastic restart (upstream ``suspend``/``resume``): every step
push_pulls a "gradient" (sum of ``rank + 1 + step`` over the workers, checked exactly) and adds
it to a parameter vector; a checkpoint (step, parameters) is kept after every step. When a peer
is lost, the worker prints ``SUSPENDED <step>``, calls ``suspend()``, waits for RESTART_FILE
(JSON ``{"num_workers", "num_servers", "ranks": {old rank: new rank}}``, written by whoever
restarted the scheduler and servers), calls ``resume()`` and continues from the checkpoint for
5 more steps with the new job size. Last line: ``OK <steps> steps``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import byteps.basics as bps
from byteps import errors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: oracle.py
from oracle import expected_sum


def step(params: np.ndarray, k: int) -> None:
    rank, size = bps.rank(), bps.size()
    grad = np.full(1000, rank + 1 + k, dtype=np.float64)
    bps.wait(bps.push_pull_async("grad", grad.ctypes.data, grad.ctypes.data, grad.nbytes,
                                 "float64", grad.shape, average=False))
    expected = expected_sum(lambda r: np.full(grad.shape, r + 1 + k), size)
    if not (grad == expected).all():
        print(f"FAIL rank {rank}: step {k}: {grad[0]} != {expected[0]}", flush=True)
        sys.exit(1)
    params += grad


def main() -> None:
    restart_file = sys.argv[1]
    bps.init()
    params = np.zeros(1000)
    checkpoint = (0, params.copy())
    k = 0
    try:
        while True:  # until a peer is lost (the test kills one), at most 120 s
            step(params, k)
            k += 1
            checkpoint = (k, params.copy())
            if k == 3:
                print(f"READY pid={os.getpid()}", flush=True)
            time.sleep(0.01)
    except errors.PeerLostError as exc:
        print(f"SUSPENDED {checkpoint[0]} {exc}", flush=True)
    old_rank = int(os.environ.get("BYTEPS_GLOBAL_RANK") or os.environ["DMLC_WORKER_ID"])
    bps.suspend()
    deadline = time.monotonic() + 120
    while not os.path.exists(restart_file):
        if time.monotonic() > deadline:
            print("FAIL no restart within 120 s", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    with open(restart_file) as f:
        plan = json.load(f)
    bps.resume(plan["num_workers"], plan["num_servers"], plan["ranks"][str(old_rank)])
    k, params = checkpoint[0], checkpoint[1].copy()  # continue from the last checkpoint
    for _ in range(5):
        step(params, k)
        k += 1
    print(f"RESUMED rank={bps.rank()} size={bps.size()}", flush=True)
    bps.shutdown()
    print(f"OK {k} steps", flush=True)


if __name__ == "__main__":
    main()
