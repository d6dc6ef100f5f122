"""``bpslaunch --hosts`` against real sshd daemons on emulated hosts.

An emulated cluster (``benchmarks.netns``, unshaped) of three worker hosts w0, w1, w2 and one
server host s0; each host runs its own ``/usr/sbin/sshd -D`` (Debian's openssh-server) on port
2222 of its address, with its own host key, root login by a fresh client key listed in a
temporary ``AuthorizedKeysFile``, its pid file in the temporary directory. Host names resolve
through a per-namespace ``/etc/hosts`` (``/etc/netns/<ns>/hosts``, removed afterwards); the
client trusts exactly the generated host keys through an ssh config file
(``--ssh-config``: ``UserKnownHostsFile`` in the temporary directory,
``StrictHostKeyChecking yes``), so root's own ``~/.ssh`` is never read or written. bpslaunch
runs inside w0's namespace (the only place the hosts are reachable from).

Tested: the digits example trained across three hosts with two workers each (plus the server
host): normal accuracy, identical parameters on every worker, the contract in every remote
process's environment, output prefixed ``[host role rank]``; a remote worker SIGKILLed by its
PID -> bpslaunch exits 137 naming that host and worker; SIGINT to bpslaunch -> 130; bpslaunch
itself SIGKILLed; a scheduler port in use and a host ssh cannot resolve -> an error naming them.
After each job no process of it is left on any host (every PID in the namespaces is checked,
only the sshd daemons remain; per-connection sshd processes must be gone too), the job secret
was on no process's command line while it ran, and the user's ``~/.ssh`` is unchanged. Needs
root, iproute2 and openssh (skipped otherwise).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from benchmarks import netns

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
WORKER = str(ROOT / "tests" / "workers" / "bps_worker.py")
DIGITS = str(ROOT / "examples" / "torch" / "train_digits.py")
SSH_PORT = 2222
SSHD = "/usr/sbin/sshd"


def _unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux network namespaces"
    reason = netns.netns_unavailable()
    if reason:
        return f"emulated cluster unavailable: {reason}"
    for tool in (SSHD, "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: openssh-server, openssh-client)"
    return None


pytestmark = [pytest.mark.engines, pytest.mark.skipif(_unavailable() is not None,
                                                      reason=str(_unavailable()))]


def _run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30, **kw)


def netns_pids(ns: str) -> list[int]:
    """PIDs of the processes in network namespace ``ns``."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                         timeout=10, check=False).stdout
    return [int(p) for p in out.split()]


def home_ssh_state() -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of everything in the passwd home's ~/.ssh (ssh's own), or []."""
    d = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"
    if not d.is_dir():
        return []
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*"))


def proc_text(pid: int, what: str) -> str:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_env(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").partition("=")[::2] for i in items if b"=" in i)


class SshHosts:
    """The emulated hosts with their sshd daemons, and how to run bpslaunch on w0."""

    def __init__(self) -> None:
        self.home_ssh = home_ssh_state()
        self.tmp = Path(tempfile.mkdtemp(prefix="bps-ssh-"))
        self.cluster = netns.EmulatedCluster(3, 1, 0)
        self.hosts = {h.name: h for h in self.cluster.hosts}
        self.etc_dirs: list[Path] = []
        self.made_run_sshd = False
        self.made_etc_netns = not os.path.isdir("/etc/netns")
        self.daemons: dict[str, subprocess.Popen] = {}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        t = self.tmp
        lines = ["127.0.0.1 localhost"] + [f"{h.address} {h.name}" for h in self.hosts.values()]
        for h in self.hosts.values():
            d = Path("/etc/netns") / h.netns
            d.mkdir(parents=True)
            self.etc_dirs.append(d)
            (d / "hosts").write_text("\n".join(lines) + "\n")
        if not os.path.isdir("/run/sshd"):  # sshd's privilege separation directory
            os.makedirs("/run/sshd", mode=0o755)
            self.made_run_sshd = True
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bps-test",
              "-f", str(t / "id_ed25519")])
        shutil.copy(t / "id_ed25519.pub", t / "authorized_keys")
        known = []
        for h in self.hosts.values():
            key = t / f"host_{h.name}"
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
            pub = (t / f"host_{h.name}.pub").read_text().split()[:2]
            known.append(f"[{h.name}]:{SSH_PORT},[{h.address}]:{SSH_PORT} {' '.join(pub)}")
            cfg = t / f"sshd_{h.name}.conf"
            cfg.write_text("\n".join([
                f"Port {SSH_PORT}", f"ListenAddress {h.address}", f"HostKey {key}",
                f"PidFile {t}/sshd_{h.name}.pid", f"AuthorizedKeysFile {t}/authorized_keys",
                "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
                "PrintMotd no", "PrintLastLog no", "X11Forwarding no", "LogLevel ERROR",
            ]) + "\n")
            log = open(t / f"sshd_{h.name}.log", "wb")
            self.daemons[h.name] = self.cluster.spawn(h, [SSHD, "-D", "-e", "-f", str(cfg)],
                                                      stdout=log, stderr=subprocess.STDOUT)
            log.close()
        (t / "known_hosts").write_text("\n".join(known) + "\n")
        self.config = t / "ssh_config"
        self.config.write_text("\n".join([
            "Host *", "  User root", f"  UserKnownHostsFile {t}/known_hosts",
            "  GlobalKnownHostsFile /dev/null", "  StrictHostKeyChecking yes",
            "  IdentitiesOnly yes", "  IdentityAgent none", "  PasswordAuthentication no",
            "  LogLevel ERROR",
        ]) + "\n")
        self.ssh_args = ["--ssh-port", str(SSH_PORT), "--ssh-identity", str(t / "id_ed25519"),
                         "--ssh-config", str(self.config)]
        deadline = time.monotonic() + 15
        for name in self.hosts:
            while True:  # the daemons are up when a login works
                probe = subprocess.run(
                    ["ip", "netns", "exec", self.hosts["w0"].netns, "ssh", "-F",
                     str(self.config), "-p", str(SSH_PORT), "-i", str(t / "id_ed25519"),
                     "-o", "BatchMode=yes", name, "true"],
                    capture_output=True, text=True, timeout=20, check=False)
                if probe.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    logs = {n: (t / f"sshd_{n}.log").read_text() for n in self.hosts}
                    raise RuntimeError(f"sshd on {name} unreachable: {probe.stderr} {logs}")
                time.sleep(0.2)

    def launch(self, args, extra_env=None) -> subprocess.Popen:
        """Start bpslaunch in w0's namespace (output: one text stream)."""
        env = {**os.environ, **(extra_env or {})}
        argv = [PY, "-m", "byteps.launch", *self.ssh_args, *args]
        return self.cluster.spawn("w0", argv, env, cwd=str(ROOT), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)

    def job_processes(self) -> dict[int, tuple[str, str]]:
        """Every process in the hosts' namespaces except the sshd daemons: pid -> (host,
        cmdline)."""
        keep = {p.pid for p in self.daemons.values()}
        return {pid: (name, proc_text(pid, "cmdline"))
                for name, h in self.hosts.items() for pid in netns_pids(h.netns)
                if pid not in keep}

    def wait_clean(self, timeout: float = 8.0) -> dict[int, tuple[str, str]]:
        """Wait until only the sshd daemons are left; returns what is left after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.job_processes()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def kill_leftovers(self) -> None:
        for pid in self.job_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        try:
            self.kill_leftovers()
            self.cluster.close()
        finally:
            for d in self.etc_dirs:
                shutil.rmtree(d, ignore_errors=True)
            if self.made_etc_netns:  # only if empty: other tests may use it meanwhile
                with contextlib.suppress(OSError):
                    os.rmdir("/etc/netns")
            if self.made_run_sshd:
                with contextlib.suppress(OSError):
                    os.rmdir("/run/sshd")
            shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts():
    h = SshHosts()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def clean(hosts):
    """Fails the test if a job left a process on a host (kills such leftovers either way) or
    ssh touched the user's own ~/.ssh."""
    yield hosts
    left = hosts.wait_clean()
    hosts.kill_leftovers()
    assert not left, f"processes left on the hosts: {left}"
    assert home_ssh_state() == hosts.home_ssh


class Job:
    """A running bpslaunch: its output lines collected by a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, count: int, timeout: float) -> list[re.Match]:
        """Wait until ``count`` lines match ``pattern`` (fails the test after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = self.proc.poll() is not None
            if ended:
                self.reader.join(5)
            hits = [m for line in list(self.lines) if (m := re.search(pattern, line))]
            if len(hits) >= count:
                return hits
            assert not ended, f"bpslaunch exited {self.proc.returncode}:\n{self.output[-6000:]}"
            assert time.monotonic() < deadline, f"no {count} x {pattern!r}:\n{self.output[-6000:]}"
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"bpslaunch did not end within {timeout} s:\n{self.output[-6000:]}")
        self.reader.join(5)
        return rc


def job_env(hosts: SshHosts, host: str, role: str) -> list[tuple[int, dict[str, str]]]:
    """(pid, environment) of the job processes of ``role`` on ``host`` (found on the host)."""
    found = []
    for pid in netns_pids(hosts.hosts[host].netns):
        env = proc_env(pid)
        if env.get("DMLC_ROLE") == role:
            found.append((pid, env))
    return found


def assert_secret_off_command_lines(hosts: SshHosts) -> None:
    """The job secret (read from a job process's environment) is on no command line, local
    (bpslaunch, ssh clients in w0) or remote."""
    secret = next((env["BYTEPS_SECRET"] for name in hosts.hosts
                   for _, env in job_env(hosts, name, "worker")), None)
    assert secret and len(secret) >= 32
    pids = [pid for h in hosts.hosts.values() for pid in netns_pids(h.netns)]
    lines = [proc_text(pid, "cmdline") for pid in pids]
    assert any("byteps.launch.ssh_remote" in line for line in lines)  # the runners are there
    assert any(line.startswith("ssh ") for line in lines)  # the clients too
    leaked = [line for line in lines if secret in line]
    assert not leaked, leaked


def test_digits_across_three_hosts(clean):
    """Six workers on three hosts (two each), four servers (one colocated per worker host and
    one on s0), scheduler on w0: the example's normal accuracy and identical parameters."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    job = Job(clean.launch(["--hosts", "w0:2,w1:2,w2:2", "--server-hosts", "s0",
                            "--network-interface", "eth0", "--env", "BPS_SSH_TEST=yes",
                            PY, DIGITS, "--epochs", "12", "--batch-size", "16"]))
    # While it runs: every remote process has its contract, no secret on a command line.
    # The launcher starts every process over its own ssh connection at once, so the scheduler
    # and the server may come up after the workers: wait for all of them.
    deadline = time.monotonic() + 30
    while (len([1 for h in ("w0", "w1", "w2") for _ in job_env(clean, h, "worker")]) < 6
           or not job_env(clean, "s0", "server") or not job_env(clean, "w0", "scheduler")):
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output[-6000:]
        time.sleep(0.05)
    for name in ("w0", "w1", "w2"):
        workers = sorted(job_env(clean, name, "worker"),
                         key=lambda pe: pe[1]["BYTEPS_LOCAL_RANK"])
        w = int(name[1])
        assert [(e["DMLC_WORKER_ID"], e["BYTEPS_LOCAL_RANK"]) for _, e in workers] == \
            [(str(w), "0"), (str(w), "1")]
        for _, e in workers:
            assert (e["DMLC_NUM_WORKER"], e["DMLC_NUM_SERVER"], e["BYTEPS_LOCAL_SIZE"]) == \
                ("3", "4", "2")
            assert (e["DMLC_PS_ROOT_URI"], e["DMLC_INTERFACE"]) == ("w0", "eth0")
            assert e["BPS_SSH_TEST"] == "yes" and e["HOME"] == "/root"  # --env; remote login
            assert os.readlink(f"/proc/{_}/cwd") == str(ROOT)
    assert len(job_env(clean, "s0", "server")) == 1 and len(job_env(clean, "w0", "scheduler")) == 1
    assert_secret_off_command_lines(clean)
    rc = job.finish(120)
    out = job.output
    assert rc == 0, out[-6000:]
    assert "parameters identical on all 6 workers" in out, out[-6000:]
    acc = re.search(r"^\[w0 worker 0\] final test accuracy: (\d\.\d+)", out, re.M)
    assert acc and float(acc.group(1)) >= 0.95, out[-6000:]
    unprefixed = [line for line in job.lines  # ("\\r" of tqdm: empty lines here)
                  if line.strip() and not re.match(r"\[|bpslaunch: ", line)]
    assert not unprefixed, unprefixed[:10]
    print(f"ssh digits: accuracy {acc.group(1)}; "
          + " ".join(re.findall(r"(?:time per step|wall time): [^\n]*", out)))


def test_killed_remote_worker_stops_every_host(clean):
    """SIGKILL to worker 1 (found on w1 by its environment): bpslaunch exits 137 naming
    ``w1 worker 1``; every process on every host is gone, its shared memory too."""
    job = Job(clean.launch(["--hosts", "w0,w1,w2", "--grace", "1", PY, WORKER, "loop"],
                           {"BYTEPS_HEARTBEAT_TIMEOUT": "5"}))
    ready = job.wait_for(r"^\[(w\d) worker (\d)\] READY pid=(\d+)", 3, 45)
    assert_secret_off_command_lines(clean)
    (pid, env), = job_env(clean, "w1", "worker")
    assert str(pid) in [m.group(3) for m in ready if m.group(1) == "w1"]
    job_id = env["BYTEPS_JOB_ID"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    rc = job.finish(30)
    took = time.monotonic() - t0
    assert rc == 137, job.output[-6000:]
    first = [line for line in job.lines if "stopping the job" in line]
    assert first and first[0].startswith("bpslaunch: w1 worker 1 (ssh pid "), job.output[-6000:]
    assert "killed by SIGKILL" in first[0], first
    assert any(re.match(rf"\[w1 worker 1\] .*pid {pid} .*SIGKILL", line)
               for line in job.lines), job.output[-6000:]
    assert not clean.wait_clean(), clean.job_processes()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"byteps_{job_id}_")]
    print(f"killed remote worker: bpslaunch exited {rc} after {took:.1f} s")


def test_ctrl_c_stops_every_host(clean):
    """SIGINT to bpslaunch: exit 130, every remote process stopped. Hosts given as
    ``user@host`` (the scheduler's address is the host part)."""
    job = Job(clean.launch(["--hosts", "root@w0:2,root@w2:2", "--server-hosts", "root@s0",
                            PY, WORKER, "loop"]))
    job.wait_for(r"^\[root@w\d worker \d\] READY", 4, 45)
    (_, env), = job_env(clean, "w0", "scheduler")
    assert env["DMLC_PS_ROOT_URI"] == "w0"
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    rc = job.finish(15)
    took = time.monotonic() - t0
    assert rc == 130, job.output[-6000:]
    assert not clean.wait_clean(), clean.job_processes()
    print(f"ctrl-c: bpslaunch exited 130 after {took:.1f} s")


def test_launcher_sigkilled_leaves_nothing(clean):
    """bpslaunch itself SIGKILLed: its ssh clients die with it (PR_SET_PDEATHSIG), the remote
    runners see their lifeline end and stop their processes."""
    job = Job(clean.launch(["--hosts", "w1,w2", PY, WORKER, "loop"]))
    job.wait_for(r"^\[w\d worker \d\] READY", 2, 45)
    os.kill(job.proc.pid, signal.SIGKILL)
    assert job.finish(10) == -signal.SIGKILL
    assert not clean.wait_clean(), clean.job_processes()


def test_scheduler_port_in_use_and_unknown_host(clean):
    """Errors, not hangs: a taken --port fails the scheduler with the core's message; a host
    ssh cannot reach fails with ssh's message and exit code 255, naming the host."""
    blocker = clean.cluster.spawn("w0", [PY, "-c", "import socket, time; s = socket.socket(); "
                                         "s.bind(('0.0.0.0', 23456)); s.listen(); time.sleep(60)"])
    try:
        time.sleep(0.3)
        job = Job(clean.launch(["--hosts", "w0,w1", "--port", "23456", "--grace", "1",
                                PY, WORKER, "loop"]))
        assert job.finish(30) == 1, job.output[-6000:]
        assert "[w0 scheduler] byteps server/scheduler: cannot bind w0:23456" in job.output
        assert "bpslaunch: w0 scheduler (ssh pid " in job.output
    finally:
        blocker.kill()
        blocker.wait()
    job = Job(clean.launch(["--hosts", "w0,nosuchhost", "--grace", "1", PY, WORKER, "loop"]))
    assert job.finish(30) == 255, job.output[-6000:]
    assert re.search(r"^\[nosuchhost (server 1|worker 1)\] ssh: Could not resolve hostname",
                     job.output, re.M), job.output[-6000:]
    assert re.search(r"^bpslaunch: nosuchhost (server|worker) 1 \(ssh pid \d+\) exited with "
                     r"code 255 \(ssh failed", job.output, re.M), job.output[-6000:]
