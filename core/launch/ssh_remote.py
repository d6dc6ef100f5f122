"""The remote end of ``bpslaunch --hosts``: ``python -m byteps.launch.ssh_remote``, started over ssh.

``bpslaunch`` runs one ssh connection per process of the job, always with the same fixed,
secret-free remote command (``<python> -m byteps.launch.ssh_remote``). What to run comes over ssh's
standard input, so neither the job's secret nor its environment ever appears on a command line
(readable by every user in ``ps``):

1. The first line of standard input is a JSON object (:data:`PROTOCOL` 1)::

       {"protocol": 1, "argv": [...], "env": {...}, "unset": [...], "cwd": "...",
        "label": "w1 worker 2"}

   ``argv`` is run without a shell, in ``cwd``, with this login's environment minus the names
   in ``unset`` plus ``env`` (which wins).
2. The child gets ``/dev/null`` as its standard input and this process's standard output and
   error (the ssh channel, where ``bpslaunch`` prefixes every line), and leads its own process
   group.
3. The rest of standard input is the lifeline: it stays open as long as the launcher wants the
   process to run. End of file -- ``bpslaunch`` stopping the job, the launcher or its ssh
   client killed, the connection lost -- as well as SIGTERM, SIGINT or SIGHUP to this process,
   stop the child: SIGTERM to its process group, SIGKILL :data:`STOP_TIMEOUT` seconds later.
4. When the child exits by itself, whatever it left in its process group is stopped the same
   way, and this process exits with the child's code (``128 + n`` for death by signal ``n``,
   said on stderr). A worker that did not succeed also has its machine's leftover shared
   memory (``/dev/shm/byteps_<job>_<worker id>_*``) removed.

Exit codes of its own: 2 for a malformed request, 127 (126) when the command cannot be started
(not found, no such working directory; not executable). Only the standard library is used, so
this runs before anything heavy is imported.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

#: Version of the request line understood here.
PROTOCOL = 1

#: Seconds between SIGTERM and SIGKILL when stopping the child (shorter than bpslaunch's own
#: 3 s, so a stopped job's remote processes are gone before the launcher gives up on ssh).
STOP_TIMEOUT = 2.0

#: Largest request line accepted (bytes).
MAX_REQUEST = 16 << 20


class RequestError(ValueError):
    """The request line is not a valid protocol-1 JSON object."""


def parse_request(line: bytes) -> dict:
    """Decode and check one request line (see the module docstring).

    Args:
        line (bytes): the first line of standard input, with or without its ``\\n``.

    Returns:
        dict: with ``argv`` (non-empty list of str), ``env`` (dict str -> str), ``unset``
        (list of str), ``cwd`` (str or None) and ``label`` (str).

    Raises:
        RequestError: empty input, bad JSON, wrong protocol or a field of the wrong type.
    """
    if not line.strip():
        raise RequestError("no request on standard input (run by bpslaunch --hosts only)")
    try:
        req = json.loads(line)
    except ValueError as exc:
        raise RequestError(f"the request is not JSON: {exc}") from None
    if not isinstance(req, dict) or req.get("protocol") != PROTOCOL:
        raise RequestError(f"the request is not a protocol-{PROTOCOL} object (launcher and "
                           "remote byteps differ in version?)")
    argv, env = req.get("argv"), req.get("env", {})
    unset, cwd, label = req.get("unset", []), req.get("cwd"), req.get("label", "process")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise RequestError("'argv' must be a non-empty list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        raise RequestError("'env' must map strings to strings")
    if not (isinstance(unset, list) and all(isinstance(k, str) for k in unset)):
        raise RequestError("'unset' must be a list of strings")
    if cwd is not None and not isinstance(cwd, str):
        raise RequestError("'cwd' must be a string")
    return {"argv": argv, "env": env, "unset": unset, "cwd": cwd, "label": str(label)}


def child_environment(request: dict, login_env: dict[str, str]) -> dict[str, str]:
    """``login_env`` without ``request["unset"]``, updated with ``request["env"]``."""
    env = {k: v for k, v in login_env.items() if k not in set(request["unset"])}
    env.update(request["env"])
    return env


def _say(label: str, message: str) -> None:
    try:
        sys.stderr.write(f"byteps.launch.ssh_remote ({label}): {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # the channel is gone: nobody to tell


def _killpg(pgid: int, sig: int) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a member changed its credentials
        return True


def stop_group(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``timeout`` s, reap the child."""
    pgid = proc.pid
    if _killpg(pgid, signal.SIGTERM):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _killpg(pgid, 0):
                break  # the leader is reaped and no member is left
            time.sleep(0.02)
        _killpg(pgid, signal.SIGKILL)
    proc.wait()


def remove_worker_shm(env: dict[str, str], shm_dir: str = "/dev/shm") -> list[str]:
    """Remove ``<shm_dir>/byteps_<BYTEPS_JOB_ID>_<DMLC_WORKER_ID>_*`` of a worker's machine.

    Returns:
        list[str]: the paths removed; nothing for a non-worker or when an id is missing or
        contains ``/``.
    """
    job, wid = env.get("BYTEPS_JOB_ID", ""), env.get("DMLC_WORKER_ID", "")
    if env.get("DMLC_ROLE") != "worker" or not job or not wid or "/" in job + wid:
        return []
    removed = []
    for path in glob.glob(os.path.join(shm_dir, f"byteps_{glob.escape(job)}_"
                                                f"{glob.escape(wid)}_*")):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def exit_code(returncode: int) -> int:
    """``Popen.returncode`` -> shell-style code (``-n`` -> ``128 + n``)."""
    return 128 - returncode if returncode < 0 else returncode


def run(request: dict, stdin_fd: int = 0) -> int:
    """Run the request's child until it exits or a stop arrives (EOF on ``stdin_fd``, a signal).

    Returns:
        int: the child's exit code (``128 + n`` for signal ``n``); 127/126 if it cannot start.
    """
    label = request["label"]
    env = child_environment(request, dict(os.environ))
    try:
        proc = subprocess.Popen(request["argv"], env=env, cwd=request["cwd"] or None,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        where = f" in {request['cwd']}" if request["cwd"] else ""
        _say(label, f"cannot start {' '.join(request['argv'])}{where} on "
                    f"{os.uname().nodename}: {exc}")
        return 126 if isinstance(exc, PermissionError) else 127
    stop = threading.Event()

    def lifeline() -> None:
        while True:
            try:
                data = os.read(stdin_fd, 65536)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            except OSError:
                data = b""
            if not data:  # the launcher closed it, or the connection is gone
                stop.set()
                return

    def on_signal(_signum, _frame) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    threading.Thread(target=lifeline, name="lifeline", daemon=True).start()
    stopped = False
    while proc.poll() is None:
        if stop.wait(0.1):
            stopped = True
            break
    stop_group(proc)  # a stop request, or leftovers in an exited child's group
    rc = proc.returncode
    if not stopped and rc < 0:  # a stop was asked for: the launcher knows, no message
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        _say(label, f"pid {proc.pid} on {os.uname().nodename} was killed by {name}")
    if rc != 0:
        remove_worker_shm(env)
    return exit_code(rc)


def _read_line(fd: int) -> bytes:
    """Read from ``fd`` up to the first ``\\n`` (the launcher sends nothing after the request
    line: the rest of the stream only matters by ending)."""
    out = bytearray()
    while len(out) <= MAX_REQUEST and b"\n" not in out:
        data = os.read(fd, 65536)
        if not data:
            break
        out += data
    return bytes(out.partition(b"\n")[0])


def main() -> int:
    """Read the request from standard input and :func:`run` it; the exit code (see module)."""
    try:
        request = parse_request(_read_line(0))
    except (RequestError, OSError) as exc:
        _say("request", str(exc))
        return 2
    return run(request)


if __name__ == "__main__":
    sys.exit(main())
