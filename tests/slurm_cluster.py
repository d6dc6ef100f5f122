"""A real, throw-away Slurm cluster for the tests: ``munged``, ``slurmctld`` and ``slurmd``.

Everything lives in one temporary directory (munge key, socket, pid/log/seed files; the
generated ``slurm.conf``; Slurm's state, spool, pid and log files) and every daemon is a child
of this process, stopped by PID. Two layouts:

* **netns** (``nodes >= 2``, the better test): one network-namespace host per node
  (:class:`benchmarks.netns.EmulatedCluster`, hosts ``w0..``), one ``slurmd -N n<i>`` in each,
  ``NodeAddr`` = the host's address; ``slurmctld`` runs in ``w0``'s namespace. Clients
  (``sbatch``, ``squeue``...) run there too. Munge's socket is a filesystem path, so the one
  ``munged`` in the root namespace serves every host.
* **local** (``netns=False``): one node ``n0`` at 127.0.0.1 in the root namespace.

Every process of the cluster (daemons, ``slurmstepd``, job steps, the tasks) carries
``BPS_SLURM_TEST=<tempdir>`` in its environment; :meth:`SlurmCluster.leftover_pids` finds what
is still running by that marker (so a test can check that nothing of a job outlived it, and the
cluster's teardown can kill strays by PID). Needs root and Debian's ``slurmctld``, ``slurmd``,
``slurm-client`` and ``munge`` (:func:`slurm_unavailable` says why not).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobs import free_port

MARKER = "BPS_SLURM_TEST"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol",
           "scancel", "sinfo")


def slurm_unavailable(netns: bool = True) -> str | None:
    """Why a test cluster cannot start here (a reason for ``pytest.skip``), or None."""
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root (euid != 0)"
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if missing:
        return (f"Slurm/munge not installed ({', '.join(missing)} missing; Debian packages "
                "slurmctld, slurmd, slurm-client, munge)")
    if netns:
        from benchmarks.netns import netns_unavailable

        return netns_unavailable()
    return None


def _slurm_conf(d: Path, nodes: Sequence[tuple[str, str]], ctl_addr: str, cpus: int,
                ports: tuple[int, int]) -> str:
    node_lines = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN"
                           for name, addr in nodes)
    names = ",".join(name for name, _ in nodes)
    return f"""\
ClusterName=bpstest
SlurmctldHost={socket.gethostname()}({ctl_addr})
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobContainerType=job_container/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
KillWait=2
MailProg=/bin/true
MinJobAge=60
InactiveLimit=0
{node_lines}
PartitionName=main Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class BatchJob:
    """A finished batch job: its id, its exit code (None if Slurm did not say; 128 + n for
    death by signal n) and its output file's text."""

    job_id: str
    exit_code: int | None
    output: str


class SlurmCluster:
    """Start the daemons; :meth:`close` stops everything (also what jobs left behind).

    Args:
        nodes (int): number of Slurm nodes, ``n0..``.
        netns (bool): one network-namespace host per node (default True); False: a single
            node (``nodes`` must be 1) on 127.0.0.1 in the root namespace.
        cpus (int): CPUs declared per node (``SlurmdParameters=config_overrides``), so several
            tasks and overlapping steps fit on this small machine.
        start_timeout (float): seconds to wait for every node to become idle.

    Raises:
        RuntimeError: a daemon did not start or a node did not become idle (with the log tail).
    """

    def __init__(self, nodes: int = 2, netns: bool = True, cpus: int = 8,
                 start_timeout: float = 30.0) -> None:
        if not netns and nodes != 1:
            raise ValueError("without network namespaces the cluster has one node")
        # short paths: munge's and slurmstepd's unix sockets live in here (108-byte limit)
        self.dir = Path(tempfile.mkdtemp(prefix="bps-slurm-",
                                         dir="/tmp" if os.path.isdir("/tmp") else None))
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), MARKER: str(self.dir)}
        for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID"):  # not inside another job
            self.env.pop(name, None)
        self._procs: list[subprocess.Popen] = []
        self._jobs = 0
        self.emulated = None
        try:
            if netns:
                from benchmarks.netns import EmulatedCluster

                self.emulated = EmulatedCluster(nodes, 0, 0)
                hosts = self.emulated.workers
                self.node_addrs = [(f"n{i}", h.address) for i, h in enumerate(hosts)]
                self._ns = [h.netns for h in hosts]
            else:
                self.node_addrs = [("n0", "127.0.0.1")]
                self._ns = [None]
            self.nodes = [name for name, _ in self.node_addrs]
            self._start(cpus, start_timeout)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------ daemons

    def _wrap(self, argv: Sequence[str], node: int) -> list[str]:
        ns = self._ns[node]
        return list(argv) if ns is None else ["ip", "netns", "exec", ns, *argv]

    def _spawn(self, argv: Sequence[str], node: int | None, log: str) -> subprocess.Popen:
        full = list(argv) if node is None else self._wrap(argv, node)
        with open(self.dir / log, "ab") as out:
            proc = subprocess.Popen(full, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append(proc)
        return proc

    def _start(self, cpus: int, timeout: float) -> None:
        d = self.dir
        d.chmod(0o755)  # munged wants its socket's directory searchable by everyone
        for sub in ["state"] + [f"spool-{name}" for name in self.nodes]:
            (d / sub).mkdir()
        subprocess.run(["mungekey", "--create", f"--keyfile={d}/munge.key"], check=True,
                       capture_output=True, timeout=30)
        self._spawn(["munged", "--foreground", "--force", f"--socket={d}/munge.socket",
                     f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid",
                     f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                    None, "munged.out")
        self._wait_for(lambda: (d / "munge.socket").exists(), 10, "munged's socket")
        # Each namespace host has its own ports; in the root namespace take free ones.
        ports = (6817, 6818) if self.emulated is not None else (free_port(), free_port())
        self.conf.write_text(_slurm_conf(d, self.node_addrs, self.node_addrs[0][1], cpus, ports))
        # slurmd 22.05 initialises a cgroup plugin even with proctrack/linuxproc and task/none;
        # its autodetection fails where no cgroup file system is mounted (``ip netns exec``
        # gives a fresh /sys), naming the version explicitly starts it anyway.
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self._spawn(["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)], 0, "slurmctld.out")
        for i, name in enumerate(self.nodes):
            self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], i,
                        f"slurmd-{name}.out")
        self._wait_for(self._all_idle, timeout, "every node idle")

    def _all_idle(self) -> bool:
        for proc in self._procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}:\n"
                                   + self.logs())
        res = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10, check=False)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return res.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def _wait_for(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"test Slurm: timed out waiting for {what}:\n" + self.logs())
            time.sleep(0.2)

    def logs(self, tail: int = 3000) -> str:
        """The tail of every log file of the cluster, for failure messages."""
        parts = []
        for path in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------------------ clients

    def command(self, argv: Sequence[str], node: int = 0) -> list[str]:
        """``argv`` as run on ``node``'s host (``ip netns exec`` in the netns layout)."""
        return self._wrap(argv, node)

    def run(self, argv: Sequence[str], *, timeout: float = 60, check: bool = True,
            env: Mapping[str, str] | None = None, node: int = 0) -> subprocess.CompletedProcess:
        """Run a client command (``sbatch``, ``squeue``...) on ``node``'s host, capture text."""
        res = subprocess.run(self._wrap(argv, node), env={**self.env, **(env or {})},
                             capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited with {res.returncode}:\n{res.stdout}"
                               f"\n{res.stderr}")
        return res

    def sbatch(self, script: str, *, args: Sequence[str] = (), timeout: float = 60,
               cwd: str | None = None) -> BatchJob:
        """Submit ``script`` (a shell script's text) with ``sbatch ARGS``, wait until the job
        has left the queue, and return its id, exit code and output (stdout and stderr).

        Raises:
            RuntimeError: sbatch failed, or the job did not end within ``timeout`` seconds (it
                is cancelled first).
        """
        self._jobs += 1
        path = self.dir / f"batch-{self._jobs}.sh"
        path.write_text(script)
        out = self.dir / f"batch-{self._jobs}.out"
        res = self.run(["sbatch", "--parsable", f"--chdir={cwd or os.getcwd()}",
                        f"--output={out}", *args, str(path)], timeout=30)
        job_id = res.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip():
            if time.monotonic() > deadline:
                self.run(["scancel", "--signal=KILL", "--full", job_id], check=False)
                output = out.read_text(errors="replace") if out.exists() else ""
                raise RuntimeError(f"batch job {job_id} still queued or running after "
                                   f"{timeout:g} s; output:\n{output[-6000:]}")
            time.sleep(0.2)
        info = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        m = re.search(r"\bExitCode=(\d+):(\d+)", info)
        code = None
        if m is not None:  # "exit code:signal"
            code = 128 + int(m.group(2)) if int(m.group(2)) else int(m.group(1))
        return BatchJob(job_id, code, out.read_text(errors="replace") if out.exists() else "")

    def steps(self, job_id: str) -> list[str]:
        """``squeue -s`` lines (``STEPID NAME``) of ``job_id``'s steps still known to Slurm."""
        res = self.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], check=False)
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]

    def leftover_pids(self) -> list[int]:
        """PIDs of processes carrying this cluster's marker that are not its daemons (job
        steps, ``slurmstepd``, tasks and whatever they started)."""
        own = {p.pid for p in self._procs} | {os.getpid()}
        daemons = set(own)
        needle = f"{MARKER}={self.dir}\0".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in own:
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read() + b"\0"
            except OSError:
                continue
            if needle in environ and _parent(int(entry)) not in daemons:
                found.append(int(entry))
        # ``ip netns exec`` execs the daemons, so their pids are ours; what they fork and keep
        # as children (slurmctld's slurmscriptd) is theirs; ``slurmstepd`` and the tasks are
        # daemonised (their parent is init), so they are reported.
        return sorted(found)

    # ------------------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL), kill leftovers by PID,
        remove the namespaces and the directory. Idempotent."""
        if self.conf.exists() and any(p.poll() is None for p in self._procs):
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "--signal=KILL", "--user=root"], timeout=10,
                         check=False)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()
        if self.dir.exists():
            for pid in self.leftover_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.emulated is not None:
            self.emulated.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
