"""Worker of tests/test_launch_slurm.py, run by ``bpslaunch --slurm``: ``slurm_probe.py MODE``.

Modes:

* ``probe``: look for this job's secret (``BYTEPS_SECRET``) in the command line of every process
  of the machine (``/proc/*/cmdline``: the launcher, srun, slurmstepd, the scheduler, servers
  and workers all run here), join the job, push_pull the global ranks, and print
  ``PROBE key=value ...`` (ranks, ids, the node, the sum, the pids whose command line holds the
  secret).
* ``fail RANK CODE``: join the job; global rank RANK exits with CODE, the others wait.
* ``hang``: join the job, print ``READY rank=R``, wait (for Ctrl-C).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import byteps.basics as bps


def secret_holders(secret: str) -> list[int]:
    """PIDs whose command line contains ``secret``."""
    found = []
    needle = secret.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def main() -> int:
    mode, args = sys.argv[1], sys.argv[2:]
    holders = secret_holders(os.environ["BYTEPS_SECRET"]) if mode == "probe" else []
    bps.init()
    rank = bps.rank()
    if mode == "probe":
        buf = np.array([float(rank)], dtype=np.float64)
        bps.wait(bps.push_pull_async("probe.ranks", buf.ctypes.data, buf.ctypes.data,
                                     buf.nbytes, "float64", buf.shape, False))
        env = os.environ
        print(f"PROBE rank={rank} size={bps.size()} local_rank={bps.local_rank()} "
              f"worker_id={env['DMLC_WORKER_ID']} procid={env['SLURM_PROCID']} "
              f"node={env['SLURMD_NODENAME']} num_server={env['DMLC_NUM_SERVER']} "
              f"sum={int(buf[0])} secret_in_cmdline={','.join(map(str, holders)) or 'none'}",
              flush=True)
    elif mode == "fail":
        if rank == int(args[0]):
            time.sleep(0.5)
            print(f"rank {rank} exits with {args[1]}", flush=True)
            os._exit(int(args[1]))
        time.sleep(120)
    elif mode == "hang":
        print(f"READY rank={rank}", flush=True)
        time.sleep(120)
    bps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
