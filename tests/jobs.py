"""The tests' side of the one job runner (every test directory imports it as ``jobs``:
pyproject's ``[tool.pytest.ini_options] pythonpath`` puts tests/ on ``sys.path``).

Processes are started, read and stopped by :mod:`benchmarks.runner` (shared with the benchmark
lab; re-exported here: :class:`Proc`, :class:`Group`, :data:`free_port`, the one free-port
helper). On top of it: launch a byteps job with ``python -m byteps.launch OPTIONS --
COMMAND`` (default command: ``tests/workers/bps_worker.py MODE``) in a clean environment (no
inherited ``DMLC_*`` / ``BYTEPS_*``), wait for it with a timeout that kills the launcher's whole
process group and fails the test, read its output per rank (the launcher prefixes
``[worker N] ``), find its processes among the launcher's descendants
(``/proc/<pid>/task/*/children``, role from ``/proc/<pid>/environ``) and check that nothing of
it is left. Only the launcher's process group and PIDs seen as its children are ever signalled
(the launcher's children die with it: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import runner
from benchmarks.runner import Group, JobError, JobResult, Proc, free_port

__all__ = ["Group", "JobError", "JobResult", "Proc", "free_port"]  # the runner's, re-exported

PY = sys.executable
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKER = str(TESTS / "workers" / "bps_worker.py")
LAUNCH = [PY, "-m", "byteps.launch"]
#: extra environment of a job that imports a framework (one thread each: 2-core test hosts)
FRAMEWORK_ENV = {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
#: characters of job output shown in a failure message (the tail)
TAIL = 8000

# --------------------------------------------------------------------------------- helpers --


def clean_job_env(extra=None):
    """``os.environ`` without ``DMLC_*`` / ``BYTEPS_*``, with ``PYTHONUNBUFFERED=1``, then
    ``extra`` (a dict) on top."""
    env = dict(os.environ)
    # A job must not inherit the cluster description of an enclosing job.
    for k in list(env):
        if k.startswith(("DMLC_", "BYTEPS_")):
            del env[k]
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def framework_env(extra=None):
    """:func:`clean_job_env` with :data:`FRAMEWORK_ENV`, then ``extra``."""
    return clean_job_env({**FRAMEWORK_ENV, **(extra or {})})


def launch_config(workers=1, servers=None, local_size=None):
    """Launcher options for ``workers`` worker machines, ``servers`` servers and
    ``local_size`` processes per machine (None: the launcher's default)."""
    args = ["--workers", str(workers)]
    if servers is not None:
        args += ["--servers", str(servers)]
    if local_size is not None:
        args += ["--local-size", str(local_size)]
    return args


def launch_args(config, env=(), grace=None):
    """Launcher options: ``config`` (a list), ``--env K=V`` per item of ``env``, ``--grace``."""
    args = list(config)
    for kv in env:
        args += ["--env", kv]
    if grace is not None:
        args += ["--grace", str(grace)]
    return args


def job_command(config, command, env=(), grace=None):
    """argv of ``python -m byteps.launch OPTIONS -- COMMAND``."""
    return LAUNCH + launch_args(config, env, grace) + ["--", *map(str, command)]


def run_command(cmd, *, env=None, timeout=240, cwd=REPO):
    """Run ``cmd`` (argv) in its own session to completion; returns a :class:`JobResult`.

    ``env``: the whole environment (default :func:`clean_job_env`). Past ``timeout`` seconds the
    process group is killed (SIGKILL) and the test fails with the output so far."""
    try:
        return runner.run(cmd, env=clean_job_env() if env is None else env, timeout=timeout,
                          cwd=cwd)
    except runner.JobTimeout as exc:
        pytest.fail(f"{exc}; output tail:\n{exc.output[-TAIL:]}")


def launch_job(config, command, *, env=(), grace=None, timeout=240, job_env=None, cwd=REPO):
    """Run ``COMMAND`` (argv) on every worker of a job: ``python -m byteps.launch``
    ``config`` (launcher options, e.g. :func:`launch_config`), ``--env`` per item of ``env``,
    ``--grace``; ``job_env``: the launcher's whole environment (default
    :func:`clean_job_env`). Returns a :class:`JobResult`; fails the test after ``timeout`` s."""
    return run_command(job_command(config, command, env, grace), env=job_env, timeout=timeout,
                       cwd=cwd)


def run_job(config, mode, *mode_args, env=(), timeout=240, grace=None, script=WORKER):
    """Run ``script MODE ARGS`` (default tests/workers/bps_worker.py) as a job to completion;
    returns (returncode, combined output, seconds)."""
    return launch_job(config, [PY, script, mode, *mode_args], env=env, grace=grace,
                      timeout=timeout)


def world_size(config):
    """Number of worker processes of a launcher config list."""
    def opt(name, default):
        return int(config[config.index(name) + 1]) if name in config else default
    return opt("--workers", 1) * opt("--local-size", 1)


def worker_lines(out, rank):
    """Output lines of worker ``rank`` (global rank), the launcher's prefix removed."""
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def rank_lines(out, size):
    """{rank: :func:`worker_lines`} for ranks 0 .. size-1."""
    return {r: worker_lines(out, r) for r in range(size)}


def tail(out, limit=TAIL):
    """The last ``limit`` characters of ``out`` (for failure messages)."""
    return out[-limit:]


def assert_ok(rc, out, size, min_cases=1):
    """Every rank printed ``OK n cases`` (n >= min_cases) and the launcher exited 0."""
    fails = [line for line in out.splitlines() if re.match(r"\[worker \d+\] FAIL ", line)]
    assert not fails, "worker failures:\n" + "\n".join(fails) + "\n--- output ---\n" + out[-6000:]
    for r in range(size):
        oks = [m for line in worker_lines(out, r) if (m := re.fullmatch(r"OK (\d+) cases", line))]
        assert oks, f"worker {r} printed no 'OK <n> cases' line (rc={rc}); output:\n{out[-6000:]}"
        assert int(oks[-1].group(1)) >= min_cases, f"worker {r}: {oks[-1].group(0)}"
    assert rc == 0, f"launcher exited {rc}; output:\n{out[-6000:]}"


def assert_no_steady_device_allocations(out, ranks):
    """Every rank's last ``ALLOCS {"first": ..., "last": ...}`` line (the device counters after
    the first round and after the last, ``tests/workers/device_worker.py steady``) shows one
    pinned buffer per tensor and two copy streams made in the first round, and no pinned
    buffer, stream or event made or freed after it. Returns ``{rank: (first, last)}``."""
    seen = {}
    for rank in ranks:
        line = [x for x in worker_lines(out, rank) if x.startswith("ALLOCS ")][-1]
        counts = json.loads(line[len("ALLOCS "):])
        first, last = counts["first"], counts["last"]
        assert first["host_allocs"] == 3 and first["streams"] == 2, first
        for key in ("host_allocs", "host_frees", "host_bytes", "streams", "events"):
            assert last[key] == first[key], (key, first, last)
        seen[rank] = first, last
    return seen


def assert_copy_stages_timed(out, ranks, min_copy_s=0.0, directions=("d2h", "h2d")):
    """Every rank's ``TIMED {"stats": ..., "wall_s": ..., "bytes": ..., "rounds": ...}`` line
    (``tests/workers/device_worker.py timed``) shows every copy of the rounds timed on the
    device, per direction of ``directions`` (a one-process job: ``("d2d",)``, its copies within
    the device) and none in the others: each partition once a round (at least 5 partitions),
    the tensor's bytes each round, at least ``min_copy_s`` of device time per copy and no more
    device time than the rounds' wall time. Returns ``{rank: {direction: GB/s}}``, the copy
    stages' bandwidth (timed bytes / device time)."""
    seen = {}
    for rank in ranks:
        line = [x for x in worker_lines(out, rank) if x.startswith("TIMED ")][-1]
        r = json.loads(line[len("TIMED "):])
        s, rounds = r["stats"], r["rounds"]
        seen[rank] = {}
        for d in ("d2h", "h2d", "d2d"):
            if d not in directions:
                assert s[f"{d}_timed"] == 0, (d, s)
                continue
            timed, busy_ns = s[f"{d}_timed"], s[f"{d}_busy_ns"]
            assert timed == s["copies"] // len(directions) >= rounds * 5, (d, s)
            assert timed % rounds == 0, (d, s)
            assert s[f"{d}_timed_bytes"] == rounds * r["bytes"], (d, s)
            assert timed * min_copy_s * 1e9 <= busy_ns <= r["wall_s"] * 1e9, (d, s, r)
            seen[rank][d] = s[f"{d}_timed_bytes"] / busy_ns if busy_ns else None
    return seen


def assert_marker(result, marker, count):
    """Exit status 0 and ``marker`` printed ``count`` times (once per worker rank)."""
    out = result.output
    assert result.returncode == 0, f"exit code {result.returncode}; output tail:\n{tail(out)}"
    found = out.count(marker)
    assert found == count, f"expected {count} x {marker!r}, found {found}; output tail:\n{tail(out)}"


def children(pid):
    """Direct children of ``pid`` (all threads)."""
    out = set()
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out.update(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def descendants(pid):
    seen, todo = set(), [pid]
    while todo:
        for c in children(todo.pop()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def proc_env(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def alive(pid):
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def job_pids_alive(pids, job_id, timeout=10.0):
    """PIDs among ``pids`` that still run a process of job ``job_id`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p) and proc_env(p).get("BYTEPS_JOB_ID") == job_id]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def shm_segments(job_id):
    assert job_id and "/" not in job_id
    return sorted(glob.glob(f"/dev/shm/byteps_{glob.escape(job_id)}_*"))


def sysv_segments(pids):
    """System V shared-memory segments (``/proc/sysvipc/shm``) created by one of ``pids``: what
    UCX's shared-memory transports map. A segment is destroyed once its last user detaches, so
    one left after a job's processes exited was never marked for removal."""
    pids = {str(p) for p in pids}
    try:
        with open("/proc/sysvipc/shm") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return []
    return [f"shmid {r[1]} ({r[3]} B, created by pid {r[4]}, {r[6]} attached)"
            for r in rows if len(r) > 6 and r[4] in pids]


def job_processes(job_id):
    """PIDs of every live process on this host whose environment names job ``job_id`` (also
    those no longer below the launcher)."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if alive(p) and proc_env(p).get("BYTEPS_JOB_ID") == job_id]


#: the launcher's line when it had to remove a job's shared memory itself
LAUNCHER_SHM_CLEANUP = "bpslaunch: removed"


class LiveJob:
    """A launcher running in the background (a :class:`Proc`); its output is collected line by
    line."""

    def __init__(self, config, mode, *mode_args, env=(), grace=None, script=WORKER,
                 job_env=None):
        self.cmd = job_command(config, [PY, script, mode, *mode_args], env, grace)
        self.launcher = Proc(self.cmd, clean_job_env() if job_env is None else job_env,
                             label="bpslaunch", cwd=REPO)
        self.proc = self.launcher.popen
        self.seen_pids: set[int] = set()
        self.job_id: str | None = None

    @property
    def lines(self):
        return self.launcher.lines

    @property
    def output(self):
        return "\n".join(self.launcher.lines)

    def wait_for(self, pattern, count=1, timeout=60.0):
        """Wait until ``count`` output lines match ``pattern``; returns the matches."""
        try:
            return self.launcher.wait_for(pattern, count, timeout)
        except JobError as exc:
            pytest.fail(str(exc))

    def snapshot(self):
        """The job's processes now: {pid: environ} for every descendant of the launcher."""
        procs = {p: proc_env(p) for p in descendants(self.proc.pid)}
        procs = {p: e for p, e in procs.items() if e}
        self.seen_pids.update(procs)
        for e in procs.values():
            if e.get("BYTEPS_JOB_ID"):
                self.job_id = e["BYTEPS_JOB_ID"]
        return procs

    def find(self, role, worker_rank=None):
        for pid, env in sorted(self.snapshot().items()):
            if env.get("DMLC_ROLE") != role:
                continue
            if worker_rank is not None:
                rank = int(env["DMLC_WORKER_ID"]) * int(env.get("BYTEPS_LOCAL_SIZE", "1")) + int(
                    env.get("BYTEPS_LOCAL_RANK", "0"))
                if rank != worker_rank:
                    continue
            return pid
        pytest.fail(f"no {role} {worker_rank if worker_rank is not None else ''} among the "
                    f"launcher's children: {self.snapshot()}")

    def wait(self, timeout):
        try:
            return self.launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"launcher did not exit within {timeout} s; output:\n{self.output}")

    def kill(self):
        """Emergency cleanup: only the launcher's process group and PIDs seen as its children."""
        self.launcher.signal_group(signal.SIGKILL)
        for pid in self.seen_pids:
            if alive(pid) and self.job_id and proc_env(pid).get("BYTEPS_JOB_ID") == self.job_id:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def watch(self, timeout):
        """Wait for the launcher to exit (at most ``timeout`` s, then fail), snapshotting its
        children every 0.1 s so that :attr:`seen_pids` has every process of the job. Returns
        the launcher's exit status."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.snapshot()
            time.sleep(0.1)
        return self.wait(max(1.0, deadline - time.monotonic()))

    def assert_nothing_left(self, launcher_cleanup_ok=False):
        """After the launcher exited: no process of the job alive (among the PIDs seen and
        anywhere on the host), no ``/dev/shm/byteps_<job>_*`` segment, no System V segment
        created by one of its processes. Unless ``launcher_cleanup_ok`` (a process was
        killed), the job removed its shared memory itself (the launcher had nothing to)."""
        assert self.job_id, f"no process of the job was seen; output:\n{self.output[-6000:]}"
        left = job_pids_alive(self.seen_pids, self.job_id) + job_processes(self.job_id)
        assert not left, f"processes of job {self.job_id} still alive: {sorted(set(left))}"
        assert not shm_segments(self.job_id), f"segments left: {shm_segments(self.job_id)}"
        mapped = sysv_segments(self.seen_pids)
        assert not mapped, f"System V shared memory of job {self.job_id} left: {mapped}"
        if not launcher_cleanup_ok:
            lines = [ln for ln in self.output.splitlines() if LAUNCHER_SHM_CLEANUP in ln]
            assert not lines, f"the job left shared memory to the launcher: {lines}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False


def kill_and_check(job: LiveJob, victim_pid: int, survivors, grace_exit=60, bound=30.0):
    """Kill ``victim_pid`` (a process of ``job``, running ``bps_worker.py loop``) with SIGKILL;
    every survivor rank must print ``CAUGHT-PEERLOST`` (a PeerLostError naming the push_pull)
    within ``bound`` seconds of the kill; the launcher must exit non-zero within ``grace_exit``
    s and leave no process of the job behind. Returns ({rank: (time, message)}, exit status,
    job id)."""
    job.snapshot()
    job_id = job.job_id
    assert job_id, "no BYTEPS_JOB_ID in the children's environment"
    t_kill = time.time()
    os.kill(victim_pid, signal.SIGKILL)
    caught = {}
    for r in survivors:
        m = job.wait_for(rf"^\[worker {r}\] CAUGHT-PEERLOST (\d+\.\d+) (.*)$",
                         timeout=bound + 15)[0]
        caught[r] = (float(m.group(1)), m.group(2))
    for r, (t_err, msg) in caught.items():
        print(f"time to error after kill -9: worker {r}: {t_err - t_kill:.2f} s: {msg}")
        assert t_err - t_kill < bound, f"worker {r} reported the loss {t_err - t_kill:.1f} s late"
        assert t_err >= t_kill - 0.5, f"worker {r} reported PeerLostError before the kill: {msg}"
        assert re.search(r"push_pull of '[^']+'", msg), f"the error names no operation: {msg}"
    rc = job.wait(grace_exit)
    assert rc != 0, f"launcher exited 0 after a kill -9; output:\n{job.output[-6000:]}"
    left = job_pids_alive(job.seen_pids, job_id, timeout=10)
    assert not left, f"processes of job {job_id} still alive after the launcher exited: {left}"
    return caught, rc, job_id


# ------------------------------------------------------------------------ configurations --

CONFIGS = {
    "2w1s": ["--workers", "2", "--servers", "1"],
    "3w2s": ["--workers", "3", "--servers", "2"],
    "2w1s_local2": ["--workers", "2", "--servers", "1", "--local-size", "2"],
    "1w_local2": ["--workers", "1", "--local-size", "2"],
    "1w1s_forced": ["--workers", "1", "--servers", "1", "--env", "BYTEPS_FORCE_DISTRIBUTED=1"],
}


def rss_and_fds(pid):
    """(resident memory in KiB, open file descriptors) of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


# ----------------------------------------------------------------------------------- vans --

#: van -> the ``--env`` entries (``K=V``) that select it for every process of a job: the TCP van
#: (default), the UCX van over UCX's TCP transport, the UCX van over shared memory
VANS = {
    "tcp": [],
    "ucx-tcp": ["DMLC_ENABLE_RDMA=ucx", "UCX_TLS=tcp,self"],
    "ucx-shm": ["DMLC_ENABLE_RDMA=ucx", "UCX_TLS=sm,self"],
}
UCX_VANS = [v for v in VANS if v.startswith("ucx")]


def ucx_missing() -> str | None:
    """Why the UCX van cannot be tested here (the core is not built, or was built without UCX:
    ``byteps._core.doctor.ucx_linked``), or None."""
    try:
        from byteps import _core
    except ImportError as exc:
        return f"the byteps core is not built ({exc})"
    if not _core.doctor.ucx_linked():
        return "this build has no UCX van (pkg-config found no ucx when the core was built)"
    return None


def ucx_available() -> bool:
    """Whether the built core has the UCX van."""
    return ucx_missing() is None


def skip_without_ucx():
    """A skipif mark: skip, with :func:`ucx_missing`'s reason, where the UCX van is missing."""
    reason = ucx_missing()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def van_params(vans=tuple(VANS)):
    """One ``pytest.param(van, id=van)`` per van name; the UCX vans skip
    where the build has none (:func:`skip_without_ucx`)."""
    return [pytest.param(v, id=v, marks=() if v == "tcp" else skip_without_ucx()) for v in vans]


def env_dict(entries):
    """``["K=V", ...]`` -> ``{"K": "V", ...}`` (for environments of processes started by hand)."""
    return dict(kv.split("=", 1) for kv in entries)


#: ``python -c`` body: ``bps.init()``; prints JSON {"raised": None | "ConfigError", "message"}
INIT_PROBE = """
import json, byteps.basics as bps
from byteps.errors import ConfigError
try:
    bps.init()
    print(json.dumps({"raised": None}))
except ConfigError as e:
    print(json.dumps({"raised": "ConfigError", "message": str(e)}))
"""


def wrong_secret_worker(extra=None):
    """Start a scheduler (1 worker, 1 server, ``BYTEPS_SECRET`` "a"*64) by hand and a worker
    whose secret is "b"*64 (:data:`INIT_PROBE`), both with ``extra`` (a dict: e.g. a van's
    variables). Returns (the probe's JSON result plus its "stderr", seconds the worker took, the
    scheduler's output, once it logged the dropped connection or after 10 s); the scheduler's
    process group is killed (by its PID) before returning."""
    env = clean_job_env({"DMLC_ROLE": "scheduler", "DMLC_NUM_WORKER": "1",
                         "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
                         "DMLC_PS_ROOT_PORT": str(free_port()),
                         "BYTEPS_SECRET": "a" * 64, "BYTEPS_TIMEOUT": "20", **(extra or {})})
    with Proc([PY, "-m", "byteps.server"], env, label="scheduler") as sched:
        worker_env = dict(env, DMLC_ROLE="worker", DMLC_WORKER_ID="0",
                          BYTEPS_SECRET="b" * 64, BYTEPS_FORCE_DISTRIBUTED="1")
        t0 = time.monotonic()
        r = subprocess.run([PY, "-c", INIT_PROBE], env=worker_env, capture_output=True,
                           text=True, timeout=60)
        elapsed = time.monotonic() - t0
        try:  # the scheduler logs the drop on its own thread
            sched.wait_for("dropped the connection", timeout=10)
        except JobError:
            pass
    out = sched.output
    lines = r.stdout.strip().splitlines()
    assert lines, f"the worker printed nothing (exit {r.returncode}):\n{r.stderr[-4000:]}"
    result = json.loads(lines[-1])
    result["stderr"] = r.stderr
    return result, elapsed, out
