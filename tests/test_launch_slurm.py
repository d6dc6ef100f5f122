"""``bpslaunch --slurm`` against a real Slurm (Debian's slurmctld, slurmd, munge).

One cluster for the module (:mod:`slurm_cluster`): two nodes ``n0``/``n1``, each a
network-namespace host (10.77.0.11/12) with its own ``slurmd``, ``slurmctld`` on ``n0``; where
network namespaces are unavailable, one node ``n0`` on 127.0.0.1 (each test then runs its
workers as tasks of that node). Jobs are submitted with ``sbatch`` (the launcher on the batch
host ``n0``) and ``salloc`` (the launcher on the submitting host, as on a login node). Checked:
the digits example on 2 workers (accuracy, identical parameters), the environment mapping of
4 workers with 2 servers per node (the mode detected from ``SLURM_JOB_ID``), the secret on no
command line of any process, a failing worker (its exit code, named; every step ends), Ctrl-C
(every step ends). After every job no process of it is left (found by the cluster's
environment marker) and Slurm knows none of its steps. Skipped without root or Slurm/munge.
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
from slurm_cluster import SlurmCluster, slurm_unavailable

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux"),
    pytest.mark.skipif(slurm_unavailable(netns=False) is not None,
                       reason=f"test Slurm cluster unavailable: {slurm_unavailable(netns=False)}"),
]

REPO = Path(__file__).resolve().parents[1]
PROBE = str(REPO / "tests" / "workers" / "slurm_probe.py")
DIGITS = str(REPO / "examples" / "torch" / "train_digits.py")
PY = sys.executable
LAUNCH = f"{PY} -m byteps.launch"


@pytest.fixture(scope="module")
def slurm():
    # The jobs inherit this environment (sbatch/salloc --export=ALL): the tasks find byteps as
    # this process does (installed, or through PYTHONPATH), with the same interpreter.
    netns = slurm_unavailable(netns=True) is None
    with SlurmCluster(nodes=2 if netns else 1, netns=netns, cpus=8) as cluster:
        yield cluster


def _shape(cluster: SlurmCluster, workers: int) -> tuple[int, int]:
    """(nodes, tasks per node) of a job of ``workers`` workers on every node of ``cluster``."""
    n = len(cluster.nodes)
    return n, workers // n


def _node_of(cluster: SlurmCluster, rank: int, per_node: int) -> str:
    return cluster.nodes[rank // per_node]


def _assert_nothing_left(cluster: SlurmCluster, job_id: str) -> None:
    deadline = time.monotonic() + 10
    while (cluster.leftover_pids() or cluster.steps(job_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: _cmdline(pid) for pid in cluster.leftover_pids()}
    assert not left, f"processes of job {job_id} left running: {left}"
    assert not cluster.steps(job_id), cluster.steps(job_id)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _batch(*lines: str) -> str:
    return "#!/bin/bash\n" + "\n".join(lines) + "\n"


@pytest.mark.timeout(120)
def test_digits_example(slurm):
    n, per = _shape(slurm, 2)
    job = slurm.sbatch(_batch(f"exec {LAUNCH} --slurm {PY} {DIGITS} --epochs 6"),
                       args=[f"--nodes={n}", f"--ntasks-per-node={per}"], cwd=str(REPO))
    out = job.output
    assert job.exit_code == 0, out[-6000:]
    head = (f"Slurm job {job.job_id}: {n} node(s) ({','.join(slurm.nodes)}) x {per} worker(s), "
            f"1 server(s) per node, scheduler on n0 at {slurm.node_addrs[0][1]}:")
    assert head in out, out[-4000:]
    assert "[worker] 0: parameters identical on all 2 workers" in out, out[-4000:]
    m = re.search(r"\[worker\] 0: final test accuracy: (\d\.\d+)", out)
    assert m and float(m.group(1)) >= 0.95, out[-4000:]
    _assert_nothing_left(slurm, job.job_id)


@pytest.mark.timeout(120)
def test_detected_mapping_servers_and_no_secret_on_command_lines(slurm):
    """4 workers (2 nodes x 2 tasks), 2 servers per node, the mode detected from SLURM_JOB_ID."""
    n, per = _shape(slurm, 4)
    job = slurm.sbatch(_batch("unset DMLC_ROLE",
                              f"exec {LAUNCH} --servers-per-node 2 {PY} {PROBE} probe"),
                       args=[f"--nodes={n}", f"--ntasks-per-node={per}"], cwd=str(REPO))
    out = job.output
    assert job.exit_code == 0, out[-6000:]
    assert f"SLURM_JOB_ID={job.job_id} is set and DMLC_ROLE is not" in out, out[-4000:]
    probes = [dict(kv.split("=", 1) for kv in line.split("PROBE ", 1)[1].split())
              for line in out.splitlines() if "PROBE " in line]
    assert len(probes) == 4, out[-6000:]
    for p in probes:
        rank, wid, lr = int(p["rank"]), int(p["worker_id"]), int(p["local_rank"])
        assert rank == wid * per + lr == int(p["procid"]), p
        assert p["node"] == slurm.nodes[wid], p  # worker machine w = the w-th node
        assert p["size"] == "4" and p["num_server"] == str(2 * n) and p["sum"] == "6", p
        assert p["secret_in_cmdline"] == "none", p
    assert sorted(int(p["rank"]) for p in probes) == [0, 1, 2, 3]
    _assert_nothing_left(slurm, job.job_id)


@pytest.mark.timeout(120)
def test_failing_worker_stops_every_step(slurm):
    n, per = _shape(slurm, 2)
    job = slurm.sbatch(_batch(f"exec {LAUNCH} --slurm --grace 1 {PY} {PROBE} fail 1 3"),
                       args=[f"--nodes={n}", f"--ntasks-per-node={per}"], cwd=str(REPO))
    out = job.output
    assert job.exit_code == 3, out[-6000:]
    assert ("bpslaunch: first failed task: worker rank 1 on node "
            f"{_node_of(slurm, 1, per)}: Exited with exit code 3") in out, out[-6000:]
    _assert_nothing_left(slurm, job.job_id)


@pytest.mark.timeout(120)
def test_ctrl_c_under_salloc_stops_every_step(slurm):
    """salloc runs the launcher where it was called (a login node's situation: the launcher is
    on no allocated node); SIGINT to the launcher ends every step and the allocation."""
    n, per = _shape(slurm, 2)
    argv = slurm.command(["salloc", f"--nodes={n}", f"--ntasks-per-node={per}", *LAUNCH.split(),
                          "--slurm", PY, PROBE, "hang"])
    proc = subprocess.Popen(argv, env=slurm.env, cwd=str(REPO), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if sum("READY rank=" in x for x in lines) == 2:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(45), "".join(lines)[-6000:]
        launcher = _child_launcher(proc.pid)
        assert launcher is not None, "".join(lines)[-4000:]
        job_id = re.search(r"Slurm job (\d+)", "".join(lines)).group(1)
        os.kill(launcher, signal.SIGINT)
        assert proc.wait(30) == 130, "".join(lines)[-6000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    _assert_nothing_left(slurm, job_id)


def _child_launcher(salloc_pid: int) -> int | None:
    """The pid of the ``byteps.launch`` process salloc started (its child)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == salloc_pid and "byteps.launch" in _cmdline(int(entry)):
            return int(entry)
    return None
