"""byteps under torchrun, for real: ``python -m torch.distributed.run --nnodes 2 --nproc-per-node
2 --node-rank i --master-addr 10.77.0.11 --master-port P SCRIPT`` on two emulated hosts
(network namespaces w0 = 10.77.0.11 and w1, ``benchmarks.netns``), the script doing only
``import byteps.torch as bps; bps.init()``: byteps maps torchrun's variables onto its job, local
rank 0 of each node starts that node's server and global rank 0 the scheduler
(``byteps.launch.torchrun``), and the job secret travels through torchrun's store.

* known tensors summed across the 4 ranks, ranks checked against torchrun's, both torchruns exit
  0, and no process is left in either namespace (``ip netns pids``), the scheduler and servers
  included (by the pids the workers report); with torchrun's default static rendezvous and with
  its elastic c10d rendezvous (``MASTER_ADDR``/``MASTER_PORT`` then name the store of the rank-0
  agent, which byteps shares the secret through as well);
* the digits example (``examples/torch/train_digits.py``, 6 epochs of batch 16): accuracy >=
  0.95 and parameters identical on every rank;
* node 1's server is killed while every rank push_pulls: all 4 ranks get a ``PeerLostError``,
  both torchruns exit non-zero, nothing left;
* the last rank exits with code 3 after its first push_pull: the other node's workers get a
  ``PeerLostError``, both torchruns exit non-zero within 60 s, nothing left.

Needs root, iproute2 and torch (skipped otherwise). The pure mapping is tested in
``tests/test_torchrun_env.py``.
"""

from __future__ import annotations

import os
import re
import signal
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


def static_rdzv(node: int, port: int) -> list[str]:
    """torchrun's default (static) rendezvous: node rank and master given."""
    return ["--node-rank", str(node), "--master-addr", MASTER, "--master-port", str(port)]


def c10d_rdzv(node: int, port: int) -> list[str]:
    """torchrun's elastic c10d rendezvous at w0:port. ``--local-addr`` (the address the agent
    advertises) and ``is_host`` (w0 hosts the store) because the namespaces share one host name,
    which torchrun would otherwise resolve and compare."""
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{MASTER}:{port}", "--rdzv-id",
            "c10djob", "--local-addr", f"10.77.0.{11 + node}", "--rdzv-conf",
            f"is_host={'true' if node == 0 else 'false'}"]


def run_torchrun(cluster, port: int, script: list[str], timeout: float = 60.0,
                 rdzv=static_rdzv, on_line=None):
    """torchrun on w0 and w1 (node ranks 0 and 1); returns ([rc0, rc1], [out0, out1], seconds).

    ``on_line(line)`` sees every output line as it comes. A torchrun still running after
    ``timeout`` seconds is killed and the test fails."""
    procs, outs = [], ["", ""]
    t0 = time.monotonic()
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", *rdzv(node, port), *script]
        procs.append(cluster.spawn(f"w{node}", argv, env=job_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, cwd=str(ROOT)))

    def read(i: int) -> None:
        for raw in procs[i].stdout:
            line = raw.decode(errors="replace")
            outs[i] += line
            if on_line is not None:
                on_line(line.rstrip("\n"))

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


@pytest.mark.parametrize("rdzv, port", [(static_rdzv, 29500), (c10d_rdzv, 29400)],
                         ids=["static", "c10d"])
def test_push_pull_sums_under_torchrun(cluster, rdzv, port):
    rcs, outs, elapsed = run_torchrun(cluster, port, [WORKER, "sums"], rdzv=rdzv)
    print(f"torchrun sums ({rdzv.__name__}): {elapsed:.1f} s")
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


def test_killed_server_fails_every_worker(cluster):
    """SIGKILL node 1's server while all 4 ranks push_pull: every rank raises PeerLostError,
    the worker that started it reports it, both torchruns exit non-zero, nothing left."""
    pids: dict[int, list[int]] = {}
    ready: set[int] = set()
    killed: list[float] = []
    lock = threading.Lock()

    def on_line(line: str) -> None:
        with lock:
            if m := re.match(r"SERVICES (\d+) ([\d,]*)$", line):
                pids[int(m.group(1))] = [int(p) for p in m.group(2).split(",") if p]
            elif m := re.match(r"READY (\d+)$", line):
                ready.add(int(m.group(1)))
            if len(ready) == 4 and not killed and pids.get(2):
                os.kill(pids[2][0], signal.SIGKILL)  # rank 2 = local rank 0 of node 1
                killed.append(time.monotonic())

    rcs, outs, elapsed = run_torchrun(cluster, 29800, [WORKER, "loop"], on_line=on_line)
    assert killed, dump(outs)
    print(f"torchrun server killed: {elapsed:.1f} s, exit codes {rcs}")
    assert rcs[0] != 0 and rcs[1] != 0, dump(outs)
    text = "".join(outs)
    caught = dict(re.findall(r"^CAUGHT (\d) (\w+) ", text, re.M))
    assert caught == {str(r): "PeerLostError" for r in range(4)}, dump(outs)
    assert re.search(r"byteps: rank 2: the byteps server of node 1 \(pid \d+\) this process "
                     r"started exited with code 137 \(signal 9\) while the job was running",
                     outs[1]), dump(outs)
    assert_nothing_left(cluster, [p for ps in pids.values() for p in ps])


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
