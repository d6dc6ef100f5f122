"""Worker script of tests/test_launch_torchrun.py, run by torchrun: ``torchrun ... torchrun_worker.py
MODE``. It only does ``import byteps.torch as bps; bps.init()``: the job comes from torchrun's
variables.

Modes:

* ``sums``: checks ``bps.rank()``/``size()``/``local_rank()``/``local_size()`` against torchrun's
  ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, then push_pulls known tensors
  (float32 sum and average, int64 sum, 5 rounds each) and checks every result exactly; prints
  ``SERVICES <rank> <pids>`` (the scheduler/server it started) and ``TORCHRUN-OK <rank>``.
* ``fail``: after one checked push_pull, the last rank exits with code 3; the others push_pull
  until an error reaches them, print ``CAUGHT <rank> <exception class> <message>`` and exit 1
  (``NO-ERROR <rank>`` and exit 0 if none came within 60 s).
* ``loop``: after one checked push_pull every rank prints ``READY <rank>`` and push_pulls until
  an error reaches it (the test kills a server), then as ``fail``.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import byteps.torch as bps
from byteps.errors import BytePSError
from byteps.launch import torchrun


def say(line: str) -> None:
    """One line in one write(2): the ranks of a node share torchrun's stdout, and print()'s
    separate write of the newline lets their lines interleave."""
    os.write(1, (line + "\n").encode())


def check(cond: bool, what: str) -> None:
    if not cond:
        say(f"FAIL rank {os.environ.get('RANK')}: {what}")
        sys.exit(2)


def rounds(n: int, prefix: str) -> None:
    size, rank = bps.size(), bps.rank()
    total = size * (size + 1) // 2  # sum over ranks of rank + 1
    for i in range(n):
        x = torch.full((1000,), float(rank + 1 + i))
        out = bps.push_pull(x, average=False, name=f"{prefix}.sum")
        check(torch.equal(out, torch.full((1000,), float(total + size * i))), f"sum {out[:3]}")
        avg = bps.push_pull(x, average=True, name=f"{prefix}.avg")
        check(torch.allclose(avg, torch.full((1000,), (total + size * i) / size)), f"avg {avg[:3]}")
        k = torch.arange(7, dtype=torch.int64) * (rank + 1)
        ks = bps.push_pull(k, average=False, name=f"{prefix}.int")
        check(torch.equal(ks, torch.arange(7, dtype=torch.int64) * total), f"int {ks}")


def main() -> int:
    mode = sys.argv[1]
    bps.init()
    rank = bps.rank()
    check(rank == int(os.environ["RANK"]), f"rank {rank} != RANK")
    check(bps.size() == int(os.environ["WORLD_SIZE"]), f"size {bps.size()}")
    check(bps.local_rank() == int(os.environ["LOCAL_RANK"]), f"local rank {bps.local_rank()}")
    check(bps.local_size() == int(os.environ["LOCAL_WORLD_SIZE"]), "local size")
    say(f"SERVICES {rank} {','.join(map(str, torchrun.service_pids()))}")
    if mode == "sums":
        rounds(5, "t")
        bps.shutdown()
        say(f"TORCHRUN-OK {rank}")
        return 0
    rounds(1, "f")
    if mode == "loop":
        say(f"READY {rank}")
    elif rank == bps.size() - 1:
        say(f"EXITING {rank}")
        return 3
    deadline = time.monotonic() + 60
    i = 0
    try:
        while time.monotonic() < deadline:
            bps.push_pull(torch.ones(1000), average=False, name=f"loop.{i % 4}")
            i += 1
    except BytePSError as exc:
        say(f"CAUGHT {rank} {type(exc).__name__} {exc}")
        return 1
    say(f"NO-ERROR {rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
