"""The one job runner of the tests and the lab: processes started in a session of their own,
their output collected line by line, every wait bounded, every stop by PID.

``tests/jobs.py`` builds the tests' jobs on it (launcher options, per-rank output, pytest
failures); the lab's benchmarks (:mod:`benchmarks.micro`, :mod:`benchmarks.cluster`) run theirs
with it. It lives in the lab's package because both can import it from there: the repository
root is on ``sys.path`` in every test session (``conftest.py``) and under ``python -m
benchmarks``, while ``tests/`` is neither a package nor on the lab's path. It needs nothing
beyond the standard library and byteps (no pytest).

* :class:`Proc`: one process. It leads a new session, so its process group is its own and
  :meth:`Proc.stop` signals that group through the leader's PID (only while the leader is not
  reaped: a reaped PID may name someone else). stdout and stderr are merged and read by a
  thread into :attr:`Proc.lines`; ``on_line`` sees every line as it arrives.
* :func:`run`: one process to completion; past its timeout the group is killed and
  :class:`JobTimeout` carries the output so far.
* :class:`Group`: processes started together, waited on with one deadline, stopped together
  (a ``with`` block stops whatever still runs).
* :data:`free_port`: the one free-port helper (byteps's own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from byteps.launch.common import find_free_port

#: ``free_port(host="127.0.0.1") -> int``: a TCP port that was free on ``host`` a moment ago.
#: The tests and the lab take it from here (``tests/jobs.py`` re-exports it), so that byteps's
#: helper is imported in this one place.
free_port = find_free_port

#: Seconds :meth:`Proc.stop` and :func:`run` wait for a killed process and its reader thread
#: (a process outside the group may still hold the pipe: the reader is then left behind).
REAP_TIMEOUT = 10.0


class JobError(RuntimeError):
    """A process of the runner did not do what was waited for (message: what, and the tail
    of its output)."""


class JobTimeout(JobError):
    """A process did not finish within its timeout; it was killed.

    Attributes:
        output (str): what it printed until then (stdout and stderr merged).
    """

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


class JobResult(NamedTuple):
    """A finished process: exit status, stdout and stderr merged (text), wall seconds."""

    returncode: int
    output: str
    seconds: float


def _popen(argv: Sequence[str], env: Mapping[str, str] | None, **kwargs) -> subprocess.Popen:
    """The default ``spawn`` of :class:`Proc`: ``argv`` leading a new session."""
    return subprocess.Popen(list(argv), env=None if env is None else dict(env),
                            start_new_session=True, **kwargs)


class Proc:
    """A started process whose output lines are collected by a thread.

    Args:
        argv (Sequence): the command (items converted with ``str``).
        env (Mapping[str, str] | None): its whole environment (None: this process's).
        label (str | None): names it in messages (default: the command).
        cwd (str | os.PathLike | None): its working directory.
        on_line (Callable[[str], None] | None): called from the reader thread with every
            output line (without its newline) as it arrives.
        spawn (Callable | None): ``spawn(argv, env, **popen_kwargs) -> subprocess.Popen``; it
            must start the process leading a new session (default: ``subprocess.Popen`` with
            ``start_new_session=True``; the emulated cluster's ``partial(cluster.spawn,
            host)`` does the same inside a namespace).

    stdin is ``/dev/null``; stdout and stderr are one text stream (undecodable bytes
    replaced).
    """

    def __init__(self, argv: Sequence, env: Mapping[str, str] | None = None, *,
                 label: str | None = None, cwd: str | os.PathLike | None = None,
                 on_line: Callable[[str], None] | None = None,
                 spawn: Callable[..., subprocess.Popen] | None = None) -> None:
        self.argv = [str(a) for a in argv]
        self.label = label or " ".join(self.argv)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._on_line = on_line
        self._ends_in_newline = False
        self.popen = (spawn or _popen)(
            self.argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
            cwd=None if cwd is None else str(cwd))
        self._reader = threading.Thread(target=self._read, name=f"{self.label} output",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for raw in self.popen.stdout:
                line = raw.rstrip("\n")
                with self._cond:
                    self.lines.append(line)
                    self._ends_in_newline = raw.endswith("\n")
                    self._cond.notify_all()
                if self._on_line is not None:
                    self._on_line(line)
        finally:
            with self._cond:
                self._cond.notify_all()

    # ------------------------------------------------------------------------------ state --

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        """Its exit status, or None while it runs."""
        return self.popen.poll()

    @property
    def output(self) -> str:
        """Everything it printed so far, as one text (what ``communicate`` would return)."""
        with self._cond:
            text = "\n".join(self.lines)
            return text + "\n" if self._ends_in_newline else text

    def tail(self, limit: int = 6000) -> str:
        """The last ``limit`` characters of :attr:`output`."""
        return self.output[-limit:]

    # ------------------------------------------------------------------------------ waits --

    def wait(self, timeout: float) -> int:
        """Wait at most ``timeout`` seconds for it to exit, then (5 s at most) for the rest of
        its output. Returns its exit status.

        Raises:
            subprocess.TimeoutExpired: it still runs (it is left running).
        """
        rc = self.popen.wait(timeout=timeout)
        self.drain(5.0)
        return rc

    def drain(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for the reader to reach the end of its output (a
        process outside its group may still hold the pipe open: the reader is left then)."""
        self._reader.join(timeout)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60.0) -> list[re.Match]:
        """Wait until ``count`` output lines match ``pattern`` (``re.search``); returns the
        matches of all matching lines.

        Raises:
            JobError: fewer matches after ``timeout`` seconds, or once it exited and all its
                output was read (the message names the pattern, the exit status and the
                output's tail).
        """
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hits = [m for line in self.lines if (m := rx.search(line))]
                if len(hits) >= count:
                    return hits
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not self._reader.is_alive()):
                    text = "\n".join(self.lines)[-6000:]
                    raise JobError(f"{count} line(s) matching {pattern!r} did not appear "
                                   f"(rc={self.popen.poll()}); output:\n{text}")
                self._cond.wait(min(left, 0.2))

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The first output line that starts with ``prefix``, waiting at most ``timeout`` s.

        Raises:
            JobError: none within ``timeout`` seconds (or before it exited); the message names
                :attr:`label` and holds its last 40 lines.
        """
        try:
            return self.wait_for("^" + re.escape(prefix), 1, timeout)[0].string
        except JobError:
            with self._cond:
                last = "\n".join(self.lines[-40:])
            raise JobError(f"{self.label} printed no {prefix!r} within {timeout} s:\n"
                           f"{last}") from None

    # ------------------------------------------------------------------------------- stop --

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to its process group if it has not been reaped; True if sent."""
        if self.popen.poll() is not None:
            return False
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def stop(self, grace: float = 0.0) -> None:
        """Stop it if it still runs: SIGTERM to its group first when ``grace`` > 0 (then up to
        ``grace`` s to exit), SIGKILL to its group; reap it and let the reader finish (up to
        :data:`REAP_TIMEOUT` s each)."""
        if grace > 0 and self.signal_group(signal.SIGTERM):
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=REAP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        self.drain(REAP_TIMEOUT)

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


def run(argv: Sequence, *, env: Mapping[str, str] | None = None, timeout: float,
        cwd: str | os.PathLike | None = None, label: str | None = None) -> JobResult:
    """Run ``argv`` (in a new session) to completion; returns a :class:`JobResult`.

    Raises:
        JobTimeout: it ran past ``timeout`` seconds: its process group was killed (SIGKILL);
            the message names the command and the timeout, ``output`` holds what it printed.
    """
    start = time.monotonic()
    proc = Proc(argv, env, cwd=cwd, label=label)
    try:
        rc = proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.stop()
        raise JobTimeout(f"{' '.join(proc.argv)} did not finish within {timeout} s (process "
                         "group killed)", proc.output) from None
    proc.drain(REAP_TIMEOUT)
    return JobResult(rc, proc.output, time.monotonic() - start)


class Group:
    """Processes started together and stopped together (``with Group() as g:`` stops, on the
    way out, whatever still runs)."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, argv: Sequence, env: Mapping[str, str] | None = None, **kwargs) -> Proc:
        """Start a :class:`Proc` (same arguments) that belongs to this group."""
        proc = Proc(argv, env, **kwargs)
        self.procs.append(proc)
        return proc

    def wait_all(self, timeout: float, procs: Sequence[Proc] | None = None,
                 fail_fast: bool = False) -> list[int | None]:
        """Wait until every one of ``procs`` (default: the whole group) has exited, at most
        ``timeout`` seconds in all; with ``fail_fast``, only until one exits non-zero. Returns
        their exit statuses in order, None for one still running (nothing is stopped)."""
        procs = list(self.procs if procs is None else procs)
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or (
                    fail_fast and any(c not in (None, 0) for c in codes)):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for p in procs:
            if p.poll() is not None:
                p.drain(5.0)
        return [p.poll() for p in procs]

    def output(self, limit: int | None = None) -> str:
        """Every process's output, one after the other, each behind a ``--- label ---`` line
        (the last ``limit`` characters when given)."""
        text = "\n".join(f"--- {p.label} ---\n{p.output}" for p in self.procs)
        return text if limit is None else text[-limit:]

    def stop(self, grace: float = 0.0) -> None:
        """:meth:`Proc.stop` every process still running: SIGTERM to all first when ``grace``
        > 0 (one grace period for all), then SIGKILL."""
        if grace > 0:
            running = [p for p in self.procs if p.signal_group(signal.SIGTERM)]
            deadline = time.monotonic() + grace
            for p in running:
                try:
                    p.popen.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    pass
        for p in self.procs:
            p.stop()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
