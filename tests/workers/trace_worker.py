"""Worker script of tests/test_timeline.py: ``python trace_worker.py MODE [ARGS...]`` under
``python -m byteps.launch``; log, fail, push_pull and the start-up are bps_worker's.

Modes: ``steps N`` (N steps of three tensors: 1 000, 300 000 and 70 000 float32 elements, each
sum checked exactly; then prints ``TELEMETRY <json>`` with get_telemetry(), the speed read
before any traffic and after, and ``TRACE_PATH <path>``). Prints ``FAIL <message>`` and exits 1
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
from bps_worker import bps, expected_sum, fail, log, push_pull

#: (name, elements) of the tensors every step push_pulls, in this order
TENSORS = (("trace.small", 1_000), ("trace.large", 300_000), ("trace.mid", 70_000))


def mode_steps(args) -> int:
    steps = int(args[0])
    before = bps.get_pushpull_speed()
    size = bps.size()
    bufs = {}
    for name, n in TENSORS:
        x = np.full(n, float(w.RANK + 1), dtype=np.float32)
        bufs[name] = (x, np.empty_like(x))
    want = float(expected_sum(lambda r: r + 1, size))
    for step in range(steps):
        handles = [push_pull(name, *bufs[name], "float32", False) for name, _ in TENSORS]
        for h in handles:
            bps.wait(h)
        for name, _ in TENSORS:
            out = bufs[name][1]
            if not np.all(out == want):
                fail(f"step {step}: {name} summed to {out[:3]}..., expected {want}")
    time.sleep(0.05)
    speeds = []
    while True:
        s = bps.get_pushpull_speed()
        if s == (0, -5.0) or len(speeds) > 2000:
            break
        speeds.append(s)
    log("TELEMETRY " + json.dumps({"before": before, "speeds": speeds,
                                   "tensors": bps.get_telemetry(), "after": speeds[:1]}))
    from byteps import _core
    log(f"TRACE_PATH {_core.trace_path()}")
    return steps


if __name__ == "__main__":
    w.main({"steps": mode_steps})
