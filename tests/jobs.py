"""Helpers of the multi-process tests: launch a byteps job with ``python -m byteps.launcher``
running ``tests/workers/bps_worker.py MODE``, read its output per rank, find its processes among
the launcher's descendants (``/proc/<pid>/task/*/children``, role from ``/proc/<pid>/environ``)
and check that nothing of it is left. Only PIDs seen as the launcher's children are ever
signalled.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

PY = sys.executable
WORKER = str(Path(__file__).resolve().parent / "workers" / "bps_worker.py")
LAUNCH = [PY, "-m", "byteps.launcher"]

# --------------------------------------------------------------------------------- helpers --


def clean_job_env(extra=None):
    env = dict(os.environ)
    # A job must not inherit the cluster description of an enclosing job.
    for k in list(env):
        if k.startswith(("DMLC_", "BYTEPS_")):
            del env[k]
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def launch_args(config, env=(), grace=None):
    args = list(config)
    for kv in env:
        args += ["--env", kv]
    if grace is not None:
        args += ["--grace", str(grace)]
    return args


def run_job(config, mode, *mode_args, env=(), timeout=240, grace=None, script=WORKER):
    """Run ``script MODE ARGS`` (default tests/workers/bps_worker.py) as a job to completion;
    returns (returncode, combined output, seconds)."""
    cmd = LAUNCH + launch_args(config, env, grace) + [PY, str(script), mode, *map(str, mode_args)]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=clean_job_env(), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        pytest.fail(f"job {' '.join(cmd)} did not finish within {timeout} s; output:\n{out}")
    return proc.returncode, proc.stdout, time.monotonic() - start


def world_size(config):
    """Number of worker processes of a launcher config list."""
    def opt(name, default):
        return int(config[config.index(name) + 1]) if name in config else default
    return opt("--workers", 1) * opt("--local-size", 1)


def worker_lines(out, rank):
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def assert_ok(rc, out, size, min_cases=1):
    """Every rank printed ``OK n cases`` (n >= min_cases) and the launcher exited 0."""
    fails = [line for line in out.splitlines() if re.match(r"\[worker \d+\] FAIL ", line)]
    assert not fails, "worker failures:\n" + "\n".join(fails) + "\n--- output ---\n" + out[-6000:]
    for r in range(size):
        oks = [m for line in worker_lines(out, r) if (m := re.fullmatch(r"OK (\d+) cases", line))]
        assert oks, f"worker {r} printed no 'OK <n> cases' line (rc={rc}); output:\n{out[-6000:]}"
        assert int(oks[-1].group(1)) >= min_cases, f"worker {r}: {oks[-1].group(0)}"
    assert rc == 0, f"launcher exited {rc}; output:\n{out[-6000:]}"


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


class LiveJob:
    """A launcher running in the background; its output is collected line by line."""

    def __init__(self, config, mode, *mode_args, env=(), grace=None, script=WORKER):
        self.cmd = LAUNCH + launch_args(config, env, grace) + [PY, str(script), mode,
                                                              *map(str, mode_args)]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=clean_job_env(), start_new_session=True,
                                     bufsize=1)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.seen_pids: set[int] = set()
        self.job_id: str | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    @property
    def output(self):
        with self.cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern, count=1, timeout=60.0):
        """Wait until ``count`` output lines match ``pattern``; returns the matches."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hits = [m for line in self.lines if (m := rx.search(line))]
                if len(hits) >= count:
                    return hits
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.thread.is_alive()):
                    pytest.fail(f"{count} line(s) matching {pattern!r} did not appear "
                                f"(rc={self.proc.poll()}); output:\n{self.output_unlocked()}")
                self.cond.wait(min(left, 0.2))

    def output_unlocked(self):
        return "\n".join(self.lines)[-6000:]

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
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"launcher did not exit within {timeout} s; output:\n{self.output}")
        self.thread.join(5)
        return rc

    def kill(self):
        """Emergency cleanup: only the launcher's process group and PIDs seen as its children."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False


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
