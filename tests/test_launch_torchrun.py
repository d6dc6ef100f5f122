"""byteps under torchrun, for real: ``python -m torch.distributed.run --nnodes 2 --nproc-per-node
2 --node-rank i --master-addr 10.77.0.11 --master-port P SCRIPT`` on two emulated hosts
(network namespaces w0 = 10.77.0.11 and w1, ``benchmarks.netns``), the script doing only
``import byteps.torch as bps; bps.init()``: byteps maps torchrun's variables onto its job, local
rank 0 of each node starts that node's server and global rank 0 the scheduler
(``byteps.torchrun_launch``), and the job secret travels through torchrun's store.

* known tensors summed across the 4 ranks, ranks checked against torchrun's, both torchruns exit
  0, and no process is left in either namespace (``ip netns pids``), the scheduler and servers
  included (by the pids the workers report);
* the digits example (``examples/torch/train_digits.py``, 6 epochs of batch 16): accuracy >=
  0.95 and parameters identical on every rank;
* the last rank exits with code 3 after its first push_pull: the other node's workers get a
  ``PeerLostError``, both torchruns exit non-zero within 60 s, nothing left.

Needs root, iproute2 and torch (skipped otherwise). The pure mapping is tested in
``tests/test_torchrun_env.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks import netns

torch = pytest.importorskip("torch", reason="torchrun needs PyTorch")
pytest.importorskip("byteps._core", reason="the byteps core is not built")

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux namespaces"),
    pytest.mark.skipif(netns.netns_unavailable() is not None,
                       reason=f"emulated cluster unavailable: {netns.netns_unavailable()}"),
]

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "workers" / "torchrun_worker.py")
DIGITS = str(ROOT / "examples" / "torch" / "train_digits.py")
MASTER = "10.77.0.11"  # w0


@pytest.fixture(scope="module")
def cluster():
    with netns.EmulatedCluster(2, 0, 0) as c:
        assert c.host("w0").address == MASTER
        yield c


def job_env() -> dict[str, str]:
    """This environment without any job description (DMLC_*, BYTEPS_*, torch's variables)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "BYTEPS_", "TORCHELASTIC_", "PET_")) and k not in drop}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", BYTEPS_TIMEOUT="30",
               BYTEPS_HEARTBEAT_TIMEOUT="5")
    return env


def run_torchrun(cluster, port: int, script: list[str], timeout: float = 60.0):
    """torchrun on w0 and w1 (node ranks 0 and 1); returns ([rc0, rc1], [out0, out1], seconds).

    A torchrun still running after ``timeout`` seconds is killed and the test fails."""
    procs, outs = [], ["", ""]
    t0 = time.monotonic()
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr", MASTER,
                "--master-port", str(port), *script]
        procs.append(cluster.spawn(f"w{node}", argv, env=job_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, cwd=str(ROOT)))

    def read(i: int) -> None:
        outs[i] = procs[i].stdout.read().decode(errors="replace")

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in (0, 1)]
    for r in readers:
        r.start()
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(max(timeout - (time.monotonic() - t0), 0.1)))
        except subprocess.TimeoutExpired:
            cluster.stop_all()
            for r in readers:
                r.join(5)
            pytest.fail(f"torchrun did not end within {timeout:g} s:\n"
                        + "\n".join(f"--- w{i}\n{o[-4000:]}" for i, o in enumerate(outs)))
    elapsed = time.monotonic() - t0
    for r in readers:
        r.join(10)
    return rcs, outs, elapsed


def netns_pids(cluster) -> dict[str, list[str]]:
    """The processes still running in each worker host's namespace."""
    out = {}
    for host in cluster.workers:
        res = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                             text=True, timeout=10, check=True)
        out[host.name] = res.stdout.split()
    return out


def assert_nothing_left(cluster, service_pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(netns_pids(cluster).values()):
        time.sleep(0.1)
    assert not any(netns_pids(cluster).values()), f"processes left: {netns_pids(cluster)}"
    for pid in service_pids:  # the scheduler and servers, by pid (gone or not byteps any more)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert b"byteps.server" not in cmdline, f"byteps service {pid} is still running"


def services(outs: list[str]) -> dict[int, list[int]]:
    found = {}
    for out in outs:
        for m in re.finditer(r"^SERVICES (\d+) ([\d,]*)$", out, re.M):
            found[int(m.group(1))] = [int(p) for p in m.group(2).split(",") if p]
    return found


def dump(outs: list[str]) -> str:
    return "\n".join(f"--- w{i}\n{o[-6000:]}" for i, o in enumerate(outs))


def test_push_pull_sums_under_torchrun(cluster):
    rcs, outs, elapsed = run_torchrun(cluster, 29500, [WORKER, "sums"])
    print(f"torchrun sums: {elapsed:.1f} s")
    assert rcs == [0, 0], dump(outs)
    text = "".join(outs)
    assert sorted(int(r) for r in re.findall(r"^TORCHRUN-OK (\d+)$", text, re.M)) == [0, 1, 2, 3]
    started = services(outs)
    # Rank 0: the scheduler and node 0's server; rank 2 (local rank 0 of node 1): a server.
    assert [len(started[r]) for r in range(4)] == [2, 0, 1, 0], dump(outs)
    assert "while the job was running" not in text, dump(outs)  # no service failed
    assert_nothing_left(cluster, [p for pids in started.values() for p in pids])


def test_digits_example_under_torchrun(cluster):
    rcs, outs, elapsed = run_torchrun(cluster, 29600,
                                      [DIGITS, "--epochs", "6", "--batch-size", "16"], 90)
    print(f"torchrun digits: {elapsed:.1f} s")
    assert rcs == [0, 0], dump(outs)
    text = "".join(outs)
    assert "parameters identical on all 4 workers" in text, dump(outs)
    accuracy = float(re.search(r"final test accuracy: ([\d.]+)", text).group(1))
    print(f"digits accuracy after 6 epochs: {accuracy:.3f}")
    assert accuracy >= 0.95, dump(outs)
    assert_nothing_left(cluster, [])


def test_failed_worker_fails_both_torchruns(cluster):
    rcs, outs, elapsed = run_torchrun(cluster, 29700, [WORKER, "fail"])
    print(f"torchrun fail: {elapsed:.1f} s, exit codes {rcs}")
    assert rcs[0] != 0 and rcs[1] != 0, dump(outs)
    text = "".join(outs)
    assert re.search(r"^EXITING 3$", text, re.M), dump(outs)
    caught = dict(re.findall(r"^CAUGHT (\d) (\w+) ", text, re.M))
    # Node 0's ranks hear of the loss (node 1's rank 2 may be stopped by its torchrun first).
    assert caught.get("0") == "PeerLostError" and caught.get("1") == "PeerLostError", dump(outs)
    assert "NO-ERROR" not in text, dump(outs)
    started = services(outs)
    assert_nothing_left(cluster, [p for pids in started.values() for p in pids])
