"""Worker script of tests/test_strangers.py: ``python loop_worker.py MODE [ARGS...]`` under
``python -m byteps.launch``; log, fail, push_pull and the start-up are bps_worker's.

Modes: ``steady STOP_FILE`` (a long loop with agreed end, timings printed) and ``uneven N
loop|declare`` (ranks make different numbers of calls). Prints ``FAIL <message>`` and exits 1
on a failure, ``OK <n> cases`` as its last line on success.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bps_worker (which adds tests/)
import bps_worker as w
from bps_worker import bps, errors, expected_sum, fail, log, push_pull


def mode_steady(args) -> int:
    """push_pull (sum) of one 300 000-element float32 tensor in a loop, every result checked
    exactly, until the file args[0] exists (the stop decision is itself push_pulled, so every
    rank runs the same number of iterations). Prints ``READY`` after 20 warm-up iterations and,
    at the end, ``TIMES <json>``: [start, seconds] (time.time()) of every later iteration."""
    stop_file = Path(args[0])
    x = np.empty(300_000, dtype=np.float32)
    out = np.empty_like(x)
    flag, flag_out = np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
    size, times, it = bps.size(), [], 0
    while True:
        flag[0] = 1.0 if stop_file.exists() else 0.0
        bps.wait(push_pull("steady.stop", flag, flag_out, "float32", False))
        if flag_out[0] > 0:
            break
        bump = it % 3
        x.fill(w.RANK + 1 + bump)
        t0 = time.time()
        bps.wait(push_pull("steady.g", x, out, "float32", False))
        took = time.time() - t0
        want = float(expected_sum(lambda r, b=bump: r + 1 + b, size))
        if not (out[0] == want and out[-1] == want and out[len(out) // 2] == want):
            fail(f"iteration {it}: {out[0]}, {out[-1]} != {want}")
        it += 1
        if it == 20:
            log("READY")
        elif it > 20:
            times.append([round(t0, 6), round(took, 6)])
    log("TIMES " + json.dumps(times))
    return it


def mode_uneven(args) -> int:
    """Rank r makes args[0] + r push_pulls of one tensor (args[1] == "loop"), or, with
    args[1] == "declare", the last rank also push_pulls a tensor nobody else declares: the
    other ranks shut down meanwhile, so that call can never finish. The rank left waiting
    prints ``RAISED <class> <seconds> <message>`` (seconds from its call to the error)."""
    n, what = int(args[0]), args[1]
    x = np.ones(1000, dtype=np.float32)
    out = np.empty_like(x)
    for i in range(n + (w.RANK if what == "loop" else 0)):
        t0 = time.monotonic()
        try:
            bps.wait(push_pull("uneven.g", x, out, "float32", False))
        except errors.BytePSError as exc:
            if i < n:
                raise
            log(f"RAISED {type(exc).__name__} {time.monotonic() - t0:.1f} {exc}")
            return 1
    if what == "declare" and w.RANK == bps.size() - 1:
        t0 = time.monotonic()
        try:
            bps.wait(push_pull("uneven.only_here", x, out, "float32", False))
        except errors.BytePSError as exc:
            log(f"RAISED {type(exc).__name__} {time.monotonic() - t0:.1f} {exc}")
            return 1
        fail("push_pull of a tensor no other rank declared completed")
    if what == "loop" and w.RANK == bps.size() - 1:
        fail("the last rank's extra push_pulls completed")
    return 1


MODES = {"steady": mode_steady, "uneven": mode_uneven}

if __name__ == "__main__":
    w.main(MODES)
