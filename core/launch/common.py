"""What every launcher of ``bpslaunch`` shares: the error it raises, one process of a job
(:class:`ChildSpec`), the free-port helper, ``--env`` parsing, the default server command, the
checks of a job's shape, and the removal of a job's leftover shared memory.

The engines (:mod:`byteps.launch.local`, :mod:`~byteps.launch.upstream`,
:mod:`~byteps.launch.ssh`, :mod:`~byteps.launch.slurm`, :mod:`~byteps.launch.k8s`,
:mod:`~byteps.launch.ray`) import this module, :mod:`byteps.launch.contract` (the environment
of each role) and :mod:`byteps.launch.supervise` (running the children); the command line
(:mod:`byteps.launch.cli`) imports the engines; nothing imports the command line.
"""

from __future__ import annotations

import glob
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Variables bpslaunch sets itself in local mode; ``--env`` may not override them.
LOCAL_MODE_VARS = (
    "DMLC_ROLE",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_WORKER_ID",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NODE_HOST",
    "BYTEPS_LOCAL_RANK",
    "BYTEPS_LOCAL_SIZE",
    "BYTEPS_JOB_ID",
    "BYTEPS_SECRET",
    "PYTHONUNBUFFERED",
)

#: Default grace period (seconds) between the first failure and SIGTERM.
DEFAULT_GRACE = 10.0


class LaunchError(ValueError):
    """Bad command line or environment; ``main`` prints ``bpslaunch: <message>``, exits 2."""


@dataclass
class ChildSpec:
    """One process of the job.

    Attributes:
        role (str): ``"worker"``, ``"server"`` or ``"scheduler"``.
        rank (int | None): global worker rank (``worker_id * local_size + local_rank``), server
            index, or ``None`` (scheduler; servers in upstream mode).
        argv (list[str]): the command, run without a shell.
        env (dict[str, str]): its complete environment.
        host (str | None): the host it runs on when that is not this one (ssh); shown first in
            its label. Its exit code ``128 + n`` then means death by signal ``n``.
        stdin (bytes | None): written to its standard input, which then stays open as its
            lifeline: the launcher stops it by closing it (``None``: ``/dev/null``, stopped by
            signals). See :func:`byteps.launch.supervise.run_job`.
    """

    role: str
    rank: int | None
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    host: str | None = None
    stdin: bytes | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """``"worker 3"``, ``"server 0"``, ``"scheduler"`` (``"h1 worker 3"`` with a host):
        used in prefixes and messages."""
        label = self.role if self.rank is None else f"{self.role} {self.rank}"
        return label if self.host is None else f"{self.host} {label}"


def default_server_argv() -> list[str]:
    """The summation service / scheduler command: ``[sys.executable, "-m", "byteps.server"]``."""
    return [sys.executable, "-m", "byteps.server"]


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (bind to port 0, close).

    Raises:
        OSError: no socket could be bound on ``host``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def parse_env_pairs(pairs: Sequence[str], reserved: Sequence[str] = ()) -> dict[str, str]:
    """Turn ``["KEY=VAL", ...]`` (``--env``) into a dict.

    Args:
        pairs (Sequence[str]): entries; the value may be empty and may contain ``=``.
        reserved (Sequence[str]): names that may not be given (bpslaunch sets them itself).

    Raises:
        LaunchError: an entry has no ``=``, an empty or malformed name, or a reserved name.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or "\0" in pair or not all(c.isalnum() or c == "_" for c in key):
            raise LaunchError(f"--env {pair!r} is not KEY=VALUE with KEY made of [A-Za-z0-9_]")
        if key in reserved:
            raise LaunchError(f"--env {key} is set by bpslaunch itself and cannot be overridden")
        out[key] = value
    return out


def check_job_shape(workers: int, servers: int, local_size: int, port: int | None) -> None:
    """Check ``--workers``, ``--servers``, ``--local-size`` and ``--port`` (None: unset).

    Raises:
        LaunchError: naming the first option out of range.
    """
    if workers < 1:
        raise LaunchError(f"--workers must be >= 1, got {workers}")
    if servers < 0:
        raise LaunchError(f"--servers must be >= 0, got {servers}")
    if local_size < 1:
        raise LaunchError(f"--local-size must be >= 1, got {local_size}")
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError(f"--port must be in 1..65535, got {port}")


def cleanup_shm(job_id: str | None, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove leftover shared-memory segments ``<shm_dir>/byteps_<job_id>_*`` of a job.

    Args:
        job_id (str | None): the job id; ``None``/empty or one containing ``/`` removes nothing.
        shm_dir (str): default ``/dev/shm``.

    Returns:
        list[str]: the paths removed (segments that vanish meanwhile are skipped silently).
    """
    if not job_id or "/" in job_id or "\0" in job_id:
        return []
    removed = []
    for path in glob.glob(os.path.join(glob.escape(shm_dir), f"byteps_{glob.escape(job_id)}_*")):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"bpslaunch: could not remove {path}: {exc}", file=sys.stderr)
    return removed
