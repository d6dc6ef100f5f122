"""Running the children of ``bpslaunch``: line-prefixed output, process groups, supervision.

The launchers of :mod:`byteps.launch` decide *what* to run (a list of ``ChildSpec``); :func:`run_job` here
runs it: spawns every child in its own session (killed with the launcher via
``PR_SET_PDEATHSIG``), copies its output behind a ``[role rank] `` prefix, stops the job at the
first failure and computes the exit code.

Each child pipe (stdout and stderr separately) is read in binary by its own thread. The bytes
are cut into pieces that end in ``\\n``, ``\\r\\n`` or ``\\r`` (the terminator is kept), and
every piece is written to the launcher's own stream as ``prefix + piece`` and flushed, so
progress bars that redraw with ``\\r`` (tqdm) keep updating live and lines of different
children never interleave mid-line. Bytes are decoded as UTF-8 with ``errors="replace"``.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Callable

#: Seconds to look for a signal death among children failing together (see _root_cause).
_CAUSE_WINDOW = 0.2

#: Read size of one ``os.read``-like call on a child pipe.
_CHUNK = 65536

#: An unterminated line longer than this (bytes) is written out in parts, so the launcher's
#: memory stays bounded whatever a child prints; the parts join into one prefixed line.
_MAX_PENDING_LINE = 1 << 20


def split_pieces(data: bytes) -> tuple[list[bytes], bytes]:
    """Cut ``data`` into terminated pieces, in time linear in ``len(data)``.

    Args:
        data (bytes): bytes read from a pipe, possibly following an unterminated remainder.

    Returns:
        tuple[list[bytes], bytes]: the pieces, each ending in ``b"\\n"``, ``b"\\r\\n"`` or
        ``b"\\r"`` (kept), and the unterminated rest (``b""`` if ``data`` ends in a
        terminator). A ``b"\\r"`` at the very end is a piece of its own even if the next read
        might start with ``b"\\n"``; :class:`PrefixWriter` handles that case.

    Each terminator is found once with ``bytes.find`` (a regular expression searched from
    every start position made a long unterminated line quadratic: a worker printing one
    line of a few hundred KiB held up the launcher, and with it the job, for minutes).
    """
    pieces = []
    start, n = 0, len(data)
    next_lf, next_cr = data.find(b"\n"), data.find(b"\r")
    while next_lf >= 0 or next_cr >= 0:
        if next_cr < 0 or 0 <= next_lf < next_cr:
            end = next_lf + 1
        elif next_cr + 1 < n and data[next_cr + 1] == 0x0A:  # "\r\n"
            end = next_cr + 2
        else:
            end = next_cr + 1
        pieces.append(data[start:end])
        start = end
        if next_lf >= 0 and next_lf < start:
            next_lf = data.find(b"\n", start)
        if next_cr >= 0 and next_cr < start:
            next_cr = data.find(b"\r", start)
    return pieces, data[start:]


class PrefixWriter:
    """Writes pieces of one child's stream to one launcher stream, each behind a prefix.

    Args:
        prefix (str): e.g. ``"[worker 3] "``.
        stream (IO[str]): the launcher's stream (``sys.stdout`` or ``sys.stderr``). Bytes go
            to ``stream.buffer`` when it has one (encoded with the stream's encoding,
            ``errors="replace"``), otherwise text goes to ``stream`` itself.
        lock (threading.Lock): shared by every writer of ``stream`` so pieces never interleave.
    """

    def __init__(self, prefix: str, stream: IO[str], lock: threading.Lock) -> None:
        self.prefix = prefix
        self.stream = stream
        self.lock = lock
        self._after_cr = False  # the last piece written ended in a bare "\r"
        # Inside a long line written in parts (write_partial): no prefix until it ends, and a
        # UTF-8 sequence cut between two parts is decoded whole.
        self._mid_line = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write_partial(self, data: bytes) -> None:
        """Write the start (or a further part) of a line that has no terminator yet: behind the
        prefix if it starts the line, bare otherwise."""
        text = self._decoder.decode(data, final=False)
        self._emit(("" if self._mid_line else self.prefix) + text)
        self._mid_line = True
        self._after_cr = False

    def write_piece(self, piece: bytes) -> None:
        """Write one piece (see :func:`split_pieces`) behind the prefix, and flush.

        A piece that is just ``b"\\n"`` right after a piece that ended in ``b"\\r"`` is the
        second half of a ``\\r\\n`` split across two reads; it is written without a prefix.
        An empty ``b"\\r"`` piece (tqdm starts every redraw with one) is written bare too.
        """
        if self._mid_line:  # the end of a line written in parts
            self._mid_line = False
            text = self._decoder.decode(piece, final=True)
            self._after_cr = text.endswith("\r")
            self._emit(text)
            return
        text = piece.decode("utf-8", errors="replace")
        if (self._after_cr and text == "\n") or text == "\r":
            out = text
        else:
            out = self.prefix + text
        self._after_cr = text.endswith("\r")
        self._emit(out)

    def _emit(self, text: str) -> None:
        with self.lock:
            buffer = getattr(self.stream, "buffer", None)
            try:
                if buffer is not None:
                    self.stream.flush()  # keep order with text already written to stream
                    encoding = getattr(self.stream, "encoding", None) or "utf-8"
                    buffer.write(text.encode(encoding, errors="replace"))
                    buffer.flush()
                else:
                    self.stream.write(text)
                    self.stream.flush()
            except (OSError, ValueError):
                pass  # the launcher's own stream is gone (closed pipe); keep draining


def pump(pipe: IO[bytes], writer: PrefixWriter) -> None:
    """Copy ``pipe`` to ``writer`` piece by piece until end of file, then close ``pipe``.

    Args:
        pipe (IO[bytes]): the read end of a child's stdout or stderr, opened unbuffered or
            buffered in binary (``read1`` is used when present so data flows as it arrives).
        writer (PrefixWriter): where the pieces go.

    An unterminated last line is written with a ``"\\n"`` appended, so the next child's output
    starts on a fresh line. Never raises on I/O errors of the pipe (treated as end of file).
    """
    read = getattr(pipe, "read1", pipe.read)
    rest = b""
    try:
        while True:
            try:
                data = read(_CHUNK)
            except (OSError, ValueError):
                data = b""
            if not data:
                break
            pieces, rest = split_pieces(rest + data)
            for piece in pieces:
                writer.write_piece(piece)
            if len(rest) > _MAX_PENDING_LINE:
                writer.write_partial(rest)
                rest = b""
        if rest:
            writer.write_piece(rest + b"\n")
    finally:
        try:
            pipe.close()
        except OSError:  # pragma: no cover
            pass


def start_pump(pipe: IO[bytes] | None, writer: PrefixWriter, name: str) -> threading.Thread:
    """Start a daemon thread running :func:`pump` on ``pipe``.

    Args:
        pipe (IO[bytes] | None): a child pipe; ``None`` is not allowed.
        writer (PrefixWriter): destination.
        name (str): thread name, for debugging.

    Returns:
        threading.Thread: the started thread (daemon, so a pipe held open by an escaped
        grandchild can never keep the launcher alive).

    Raises:
        ValueError: ``pipe`` is ``None``.
    """
    if pipe is None:
        raise ValueError("start_pump needs a pipe")
    thread = threading.Thread(target=pump, args=(pipe, writer), name=name, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------------
# Spawning and supervision
# ---------------------------------------------------------------------------------------------

#: Seconds between SIGTERM and SIGKILL when stopping children.
TERM_TIMEOUT = 3.0

#: Seconds to wait for the output threads to drain after every child is gone.
_DRAIN_TIMEOUT = 2.0

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc ``prctl`` resolved in the parent (the child must not load libraries), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def make_preexec(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child die with ``parent_pid`` (``PR_SET_PDEATHSIG``),
    and exit at once if that parent is already gone. Shared by bpslaunch and the benchmark lab."""
    prctl = _load_prctl()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:  # runs in the child between fork and exec: no imports, no locks
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def exit_code_of(returncode: int) -> int:
    """Map a ``Popen.returncode`` to a shell-style exit code: ``-n`` (signal n) -> ``128 + n``."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_of(spec, returncode: int) -> int | None:
    """The signal that killed a child, or None. A remote child (``spec.host`` set) reports
    death by signal ``n`` as exit code ``128 + n`` (its ssh relays the runner's code)."""
    if returncode < 0:
        return -returncode
    if getattr(spec, "host", None) is not None and 128 < returncode <= 128 + 64:
        return returncode - 128
    return None


def _describe(spec, returncode: int) -> str:
    text = f"exited with code {exit_code_of(returncode)}"
    signum = _signal_of(spec, returncode)
    if signum is not None:
        try:
            text += f" (killed by {signal.Signals(signum).name})"
        except ValueError:
            text += f" (killed by signal {signum})"
    elif returncode == 255 and getattr(spec, "host", None) is not None:
        text += " (ssh failed: see its message above)"
    return text


class _Child:
    """A started child: its spec, its ``Popen``, its output threads."""

    def __init__(self, spec, proc: subprocess.Popen, pumps: list[threading.Thread]) -> None:
        self.spec = spec
        self.proc = proc
        self.pumps = pumps
        self.signaled = False  # the launcher sent it a stop signal: its exit is not a failure
        self.fed = threading.Event()  # spec.stdin is written (or cannot be any more)
        if proc.stdin is not None:
            threading.Thread(target=self._feed, name=f"{spec.label} in", daemon=True).start()

    def _feed(self) -> None:
        try:
            self.proc.stdin.write(self.spec.stdin)
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it exited (or is being stopped) before reading it all
        finally:
            self.fed.set()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def request_stop(self, sig: int) -> None:
        """Ask it to stop: close its lifeline (stdin) if it has one, else signal its group.
        A lifeline still being written (the child is not reading it) is left to SIGKILL."""
        if self.proc.stdin is None:
            self.signal_group(sig)
        elif self.fed.is_set():
            try:
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass


class _Job:
    def __init__(self, grace: float, out: IO[str], err: IO[str], keep_going: bool = False) -> None:
        self.grace = grace
        self.keep_going = keep_going  # a failed worker does not stop the others
        self.out, self.err = out, err
        locks: dict[int, threading.Lock] = {}
        self.out_lock = locks.setdefault(id(out), threading.Lock())
        self.err_lock = locks.setdefault(id(err), threading.Lock())
        self.children: list[_Child] = []
        self.exited: queue.Queue[_Child] = queue.Queue()
        self.signals: list[int] = []  # SIGINT/SIGTERM/SIGHUP received, in order
        self.failure: int | None = None  # exit code of the first failure

    def say(self, message: str) -> None:
        PrefixWriter("", self.err, self.err_lock)._emit(f"bpslaunch: {message}\n")

    def spawn(self, spec, preexec: Callable[[], None]) -> _Child:
        lifeline = getattr(spec, "stdin", None) is not None
        proc = subprocess.Popen(
            list(spec.argv), env=dict(spec.env),
            stdin=subprocess.PIPE if lifeline else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            # preexec only calls the pre-resolved prctl and getppid (async-signal-safe enough)
            preexec_fn=preexec, close_fds=True,
        )
        prefix = f"[{spec.label}] "
        out = PrefixWriter(prefix, self.out, self.out_lock)
        err = PrefixWriter(prefix, self.err, self.err_lock)
        pumps = [start_pump(proc.stdout, out, f"{spec.label} out"),
                 start_pump(proc.stderr, err, f"{spec.label} err")]
        child = _Child(spec, proc, pumps)
        waiter = threading.Thread(target=self._wait, args=(child,), name=f"{spec.label} wait",
                                  daemon=True)
        waiter.start()
        self.children.append(child)
        return child

    def _wait(self, child: _Child) -> None:
        child.proc.wait()
        self.exited.put(child)

    def fail(self, code: int, message: str) -> None:
        if self.failure is None:
            self.failure = code
            self.say(f"{message}; stopping the job")

    def supervise(self, live: set) -> None:
        """Wait until every child exits, the grace period ends, or a stop signal arrives."""
        workers = [c for c in self.children if c.spec.role == "worker"]
        deadline: float | None = None if self.failure is None else time.monotonic()
        while live and not self.signals:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            wait = 0.2 if deadline is None else min(0.2, deadline - now)
            try:
                child = self.exited.get(timeout=wait)
            except queue.Empty:
                continue
            live.discard(child)
            rc = child.proc.returncode
            if rc != 0 and not child.signaled and self.keep_going and \
                    child.spec.role == "worker":
                # Asynchronous training: the other workers go on without it; the job's exit
                # code still says that one failed.
                pid = f"{'ssh ' if getattr(child.spec, 'host', None) else ''}pid {child.proc.pid}"
                self.say(f"{child.spec.label} ({pid}) {_describe(child.spec, rc)}; asynchronous "
                         "training: the other workers go on")
                if self.failure is None:
                    self.failure = exit_code_of(rc)
                if deadline is None and all(w.proc.returncode is not None for w in workers):
                    deadline = time.monotonic() + self.grace
                continue
            if rc != 0 and not child.signaled and self.failure is None:
                child = self._root_cause(child, live)
                rc = child.proc.returncode
                pid = f"{'ssh ' if getattr(child.spec, 'host', None) else ''}pid {child.proc.pid}"
                self.fail(exit_code_of(rc), f"{child.spec.label} ({pid}) "
                                            f"{_describe(child.spec, rc)}")
                deadline = min(deadline or float("inf"), time.monotonic() + self.grace)
            elif deadline is None and all(w.proc.returncode is not None for w in workers):
                # every worker succeeded: the servers and the scheduler should follow by
                # themselves (the core tells them to); give them the grace period.
                deadline = time.monotonic() + self.grace

    def _root_cause(self, first: _Child, live: set) -> _Child:
        """Among children exiting within a moment of ``first``, the one killed by a signal.

        A killed process makes its peers fail a few milliseconds later (the core reports the
        dead peer); their exits can be reaped first, but the signal death is the cause.
        """
        if _signal_of(first.spec, first.proc.returncode) is not None:
            return first
        deadline = time.monotonic() + _CAUSE_WINDOW
        others = []
        while time.monotonic() < deadline:
            try:
                other = self.exited.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            live.discard(other)
            others.append(other)
        for other in others:
            if other.proc.returncode is not None and \
                    _signal_of(other.spec, other.proc.returncode) is not None:
                return other
        return first

    def stop(self, live: set) -> None:
        """Signal every child's process group (close the lifeline of a child with one), wait
        TERM_TIMEOUT, then SIGKILL the groups."""
        sig = self.signals[0] if self.signals else signal.SIGTERM
        if sig == signal.SIGHUP:
            sig = signal.SIGTERM
        seen = len(self.signals)
        for child in self.children:
            if child in live:
                child.signaled = True
            child.request_stop(sig)  # exited children: reaches their leftover grandchildren
        deadline = time.monotonic() + TERM_TIMEOUT
        while live and len(self.signals) == seen and time.monotonic() < deadline:
            try:
                live.discard(self.exited.get(timeout=min(0.1, deadline - time.monotonic())))
            except (queue.Empty, ValueError):
                pass
        for child in self.children:
            child.signal_group(signal.SIGKILL)
        for child in list(live):
            child.proc.wait()
            live.discard(child)

    def drain(self) -> None:
        deadline = time.monotonic() + _DRAIN_TIMEOUT
        for child in self.children:
            for thread in child.pumps:
                thread.join(max(0.0, deadline - time.monotonic()))


def run_job(
    specs: Sequence,
    *,
    grace: float = 10.0,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    on_exit: Callable[[], None] | None = None,
    keep_going: bool = False,
) -> int:
    """Run the children described by ``specs`` to completion and return the exit code.

    Children start in order (scheduler and servers first), each with
    ``start_new_session=True`` and ``PR_SET_PDEATHSIG=SIGKILL`` (they die if the launcher is
    SIGKILLed). Their stdout/stderr go, line-prefixed with ``[label] ``, to ``stdout``/``stderr``.

    Once every worker has exited 0, the servers and scheduler get ``grace`` seconds to exit by
    themselves, then are stopped; the result is 0. As soon as any child exits non-zero or by a
    signal (or cannot be started: 127/126), that is the first failure: one line
    ``bpslaunch: <label> (pid P) exited with code C; stopping the job`` goes to ``stderr``,
    the others get ``grace`` seconds, then every process group gets SIGTERM, 3 s later SIGKILL.
    SIGINT/SIGTERM/SIGHUP to the launcher (when called from the main thread) forward the
    signal (SIGTERM for SIGHUP) to every group at once, SIGKILL 3 s later or on a second signal.

    A spec with ``stdin`` bytes (the ssh launcher's) gets them on a pipe that then stays open:
    instead of a signal, closing that pipe is its stop request (its remote runner stops the
    remote process; SIGKILL to the local group 3 s later still applies). A spec with a ``host``
    is labelled ``host role rank``, and its exit code ``128 + n`` counts as death by signal n.

    Args:
        specs (Sequence[ChildSpec]): what to run (:class:`byteps.launch.common.ChildSpec`); may be empty.
        grace (float): seconds, >= 0. Default 10.0.
        stdout, stderr (IO[str] | None): default ``sys.stdout``/``sys.stderr``.
        on_exit (Callable[[], None] | None): called after every child has exited (cleanup).
        keep_going (bool): asynchronous training (``BYTEPS_ENABLE_ASYNC=1``): a worker that
            fails is reported (``bpslaunch: <label> ... the other workers go on``) and its code
            becomes the result, but the others are not stopped. Default False.

    Returns:
        int: 0; or 128 + n when stopped by signal n (130 SIGINT, 143 SIGTERM, 129 SIGHUP);
        or the first failure's code (128 + n for a child killed by signal n).
    """
    job = _Job(grace, stdout or sys.stdout, stderr or sys.stderr, keep_going)
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in handled:
            previous[sig] = signal.signal(sig, lambda signum, _frame: job.signals.append(signum))
    live: set = set()
    try:
        preexec = make_preexec(os.getpid())
        for spec in specs:
            if job.signals:
                break
            try:
                live.add(job.spawn(spec, preexec))
            except OSError as exc:
                code = 126 if isinstance(exc, PermissionError) else 127
                job.fail(code, f"cannot start {spec.label} ({' '.join(spec.argv)}): {exc}")
                break
        job.supervise(live)
    finally:
        job.stop(live)
        job.drain()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if on_exit is not None:
            on_exit()
    if job.signals:
        return 128 + int(job.signals[0])
    return job.failure or 0
