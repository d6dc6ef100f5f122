"""Fault matrix on the emulated cluster: a host's link is cut mid-training.

Two worker hosts and one CPU-server host (network namespaces, see ``benchmarks.netns``); the
workers push_pull in a loop (``tests/workers/bps_worker.py loop``); once both run, ``eth0`` of
worker host w1 is set down inside its namespace. TCP alone would notice only after many minutes;
the heartbeats (every 1 s, echoed by the scheduler; BYTEPS_HEARTBEAT_TIMEOUT=5 here) must turn
the cut into a ``PeerLostError`` on both workers within 30 s, naming the lost peer: w0 hears from
the scheduler that worker 1 went silent, w1 that the scheduler did. Every process of the job
ends and the namespaces are removed. Needs root and iproute2 (skipped otherwise).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks import cluster as bc

WORKER = str(Path(__file__).resolve().parent / "workers" / "bps_worker.py")

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux namespaces"),
    pytest.mark.skipif(bc.netns_unavailable() is not None,
                       reason=f"emulated cluster unavailable: {bc.netns_unavailable()}"),
]


@pytest.mark.timeout(180)
def test_link_cut_fails_every_worker_naming_the_peer():
    ready: set[str] = set()
    both_ready = threading.Event()

    def on_line(line: str) -> None:
        m = re.match(r"\[(worker \d)\] READY", line)
        if m:
            ready.add(m.group(1))
            if len(ready) == 2:
                both_ready.set()

    with bc.EmulatedCluster(2, 1, 200e6) as c:
        box: dict = {}
        env = {"BYTEPS_HEARTBEAT_TIMEOUT": "5", "BYTEPS_TIMEOUT": "100"}
        runner = threading.Thread(target=lambda: box.update(result=bc.run_byteps_job(
            c, [sys.executable, WORKER, "loop"], env=env, timeout=90, colocate=False,
            on_line=on_line)))
        runner.start()
        assert both_ready.wait(60), "the workers did not start"
        w1 = c.host("w1")
        t_cut = time.time()
        subprocess.run(["ip", "-n", w1.netns, "link", "set", "eth0", "down"], check=True,
                       timeout=20)
        runner.join(120)
        assert not runner.is_alive(), "the job did not end after the link was cut"
        namespaces = list(c.namespaces)
    result = box["result"]
    caught = {}
    for w in (0, 1):
        hits = [m for line in result.lines(f"worker {w}")
                if (m := re.match(r"CAUGHT-PEERLOST (\d+\.\d+) (.*)$", line))]
        assert hits, f"worker {w} raised no PeerLostError; output:\n{result.output[-6000:]}"
        caught[w] = (float(hits[0].group(1)) - t_cut, hits[0].group(2))
        print(f"link cut: worker {w} raised after {caught[w][0]:.2f} s: {caught[w][1]}")
        assert 0 <= caught[w][0] < 30, caught[w]
        assert "push_pull of 'loop'" in caught[w][1], caught[w]  # names the operation too
    assert re.search(r"worker 1|10\.77\.0\.12", caught[0][1]), caught[0][1]  # w0 names w1
    assert "scheduler" in caught[1][1], caught[1][1]  # w1 names the scheduler it lost
    assert all(ns not in bc.list_netns() for ns in namespaces)
