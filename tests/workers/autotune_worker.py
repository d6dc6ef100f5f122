"""Worker script of tests/test_autotune.py: ``python autotune_worker.py train ITERS`` under
``python -m byteps.launch`` with ``BYTEPS_AUTOTUNE=1``; start-up, log and fail are
bps_worker's.

``train``: one broadcast-like push_pull of a tensor used once (it must not become the pilot),
then ITERS iterations of a training-shaped loop: several gradients of different sizes (one
large enough to be cut anew by the search's partition sizes up to 512 KiB: with 2 worker
machines the core cuts 32 MiB into at most 64 partitions of at least 60 KiB, so 64, 128, 256
and 512 KiB give four cuts, each under new keys; one tiny) pushed
asynchronously last layer first, then waited for. Every result of every iteration is checked
exactly (integer-valued float32 data that changes every iteration), across every switch of
the tuner. Prints ``AUTOTUNE <json>`` (byteps._core.autotune_status) at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bps_worker as w
from bps_worker import bps, fail, log, push_pull

#: element counts of the gradients (float32): 32 MiB, 600 KiB, 40 KiB, 40 bytes
GRADS = (("grad.fc", 8_388_608), ("grad.conv2", 153_600), ("grad.conv1", 10_000),
         ("grad.bias", 10))


def mode_train(args) -> int:
    from byteps import _core

    iters = int(args[0])
    size, r = bps.size(), w.RANK
    once = np.full(1000, r + 1, dtype=np.float32)
    once_out = np.empty_like(once)
    bps.wait(push_pull("broadcast.once", once, once_out, "float32", False))
    if not (once_out == size * (size + 1) // 2).all():
        fail("broadcast.once: wrong sum")
    cases = 1
    bufs = [(name, np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32))
            for name, n in GRADS]
    idx = [np.arange(n, dtype=np.float32) % 97 for _, n in GRADS]
    for it in range(iters):
        handles = []
        for j, (name, g, out) in enumerate(bufs):
            g[:] = idx[j] + (r + 1) * (it % 5 + 1)  # exact in float32
            out.fill(-1)
            handles.append(push_pull(name, g, out, "float32", False, priority=-j))
        for j, h in enumerate(handles):
            bps.wait(h)
            name, _, out = bufs[j]
            want = idx[j] * size + (it % 5 + 1) * (size * (size + 1) // 2)
            bad = np.flatnonzero(out != want)
            if bad.size:
                fail(f"{name} iteration {it}: out[{bad[0]}]={out[bad[0]]} want {want[bad[0]]}")
            cases += 1
    status = _core.autotune_status()
    log("AUTOTUNE " + json.dumps(status))
    return cases


if __name__ == "__main__":
    w.main({"train": mode_train})
