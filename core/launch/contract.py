"""The ``DMLC_*``/``BYTEPS_*`` environment of each process of a byteps job, for every launcher.

Every way of starting a job -- ``bpslaunch`` on one host, over ssh, under Slurm, the Kubernetes
manifests, torchrun-style environments, :mod:`byteps.ray` -- ends in the same contract (upstream
BytePS's, ``docs/env.md``): a scheduler, ``num_servers`` servers and ``num_workers`` worker
*machines*, each machine running ``local_size`` worker processes. This module is the one place
that turns a placement into those variables, so the launchers cannot drift apart.

Contract (per process):

* every role: ``DMLC_ROLE``, ``DMLC_NUM_WORKER`` (machines), ``DMLC_NUM_SERVER``,
  ``DMLC_PS_ROOT_URI`` / ``DMLC_PS_ROOT_PORT`` (the scheduler), ``BYTEPS_JOB_ID``,
  ``BYTEPS_SECRET`` (the job's shared secret: keep it off command lines), ``PYTHONUNBUFFERED=1``;
  ``DMLC_NODE_HOST`` / ``DMLC_INTERFACE`` when the placement knows the address or interface a
  node must advertise (otherwise the core uses the local address of its route to the scheduler);
* a worker: ``DMLC_WORKER_ID`` (its machine's index, ``0..num_workers-1``),
  ``BYTEPS_LOCAL_RANK`` (``0..local_size-1``) and ``BYTEPS_LOCAL_SIZE``; its global rank is
  ``worker_id * local_size + local_rank`` (upstream's numbering).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

ROLES = ("worker", "server", "scheduler")

#: Variables :func:`role_env` owns: a launcher removes them from the environment it inherits
#: before adding the role's, so a stale value from the user's shell never leaks into a job.
CONTRACT_VARS = (
    "DMLC_ROLE",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_WORKER_ID",
    "DMLC_SERVER_ID",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NODE_HOST",
    "DMLC_INTERFACE",
    "BYTEPS_LOCAL_RANK",
    "BYTEPS_LOCAL_SIZE",
    "BYTEPS_JOB_ID",
    "BYTEPS_SECRET",
    "PYTHONUNBUFFERED",
)


class ClusterSpecError(ValueError):
    """A placement that cannot describe a byteps job (a count, port or id out of range)."""


@dataclass(frozen=True)
class JobIdentity:
    """What makes the processes of one job recognise each other.

    Attributes:
        job_id (str): names the job's shared-memory segments and appears in its errors
            (default: 12 fresh hex characters).
        secret (str): the shared secret of the connection handshake (default: 64 fresh hex
            characters); pass it through an environment or a pipe, never an argv.
    """

    job_id: str
    secret: str

    @classmethod
    def fresh(cls) -> JobIdentity:
        """A new random identity (``secrets.token_hex``)."""
        return cls(secrets.token_hex(6), secrets.token_hex(32))


@dataclass(frozen=True)
class ClusterSpec:
    """The shape of a job and where its scheduler listens.

    Attributes:
        num_workers (int): worker machines, >= 1.
        num_servers (int): servers, >= 1 for a distributed job (0 only for one machine).
        local_size (int): worker processes per worker machine, >= 1 (the same on every machine:
            global ranks are ``worker_id * local_size + local_rank``).
        scheduler_host (str): address or resolvable name of the scheduler's host.
        scheduler_port (int): its port, 1..65535.
        identity (JobIdentity): the job's id and secret.

    Raises:
        ClusterSpecError: on construction, when a field is out of range.
    """

    num_workers: int
    num_servers: int
    local_size: int
    scheduler_host: str
    scheduler_port: int
    identity: JobIdentity

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ClusterSpecError(f"a job needs >= 1 worker machine, got {self.num_workers}")
        if self.num_servers < 0:
            raise ClusterSpecError(f"the number of servers must be >= 0, got {self.num_servers}")
        if self.local_size < 1:
            raise ClusterSpecError(f"local size must be >= 1, got {self.local_size}")
        if not self.scheduler_host.strip():
            raise ClusterSpecError("the scheduler's host is empty")
        if not 1 <= self.scheduler_port <= 65535:
            raise ClusterSpecError(f"scheduler port must be in 1..65535, got "
                                   f"{self.scheduler_port}")

    @property
    def size(self) -> int:
        """Worker processes of the job (``num_workers * local_size``)."""
        return self.num_workers * self.local_size

    def rank(self, worker_id: int, local_rank: int) -> int:
        """Global rank of worker process ``local_rank`` on machine ``worker_id``."""
        return worker_id * self.local_size + local_rank


def is_true(value: str | None) -> bool:
    """Whether a boolean variable's value is on: ``"1"``, ``"true"``, ``"yes"``, ``"on"`` (any
    case, blanks around ignored), the knob registry's spellings of true; anything else, or
    None, is off."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def env_int(env: Mapping[str, str], name: str, low: int, high: int | None,
            errors: list[str]) -> int | None:
    """Read the integer variable ``name`` of ``env`` for a launcher's validation.

    Args:
        env (Mapping[str, str]): the environment.
        name (str): the variable.
        low (int): smallest accepted value.
        high (int | None): largest accepted value (None: no bound).
        errors (list[str]): a message naming the variable and its value is appended when it
            is not an integer or out of range.

    Returns:
        int | None: the value; None when it is unset or was reported in ``errors``.
    """
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        errors.append(f"{name}={raw!r} is not an integer")
        return None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        errors.append(f"{name}={raw!r} is out of range (must be {bound})")
        return None
    return value


def role_env(
    spec: ClusterSpec,
    role: str,
    *,
    worker_id: int | None = None,
    local_rank: int | None = None,
    node_host: str | None = None,
    interface: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of one process of the job.

    Args:
        spec (ClusterSpec): the job.
        role (str): ``"worker"``, ``"server"`` or ``"scheduler"``.
        worker_id (int | None): a worker's machine index, ``0..num_workers-1``; required for a
            worker, refused for the other roles.
        local_rank (int | None): a worker's local rank, ``0..local_size-1``; required for a
            worker, refused for the other roles.
        node_host (str | None): ``DMLC_NODE_HOST``: the address this node advertises and binds
            (default: unset, the core takes the local address of its route to the scheduler).
        interface (str | None): ``DMLC_INTERFACE``: the interface whose IPv4 address it
            advertises (used by the core when ``node_host`` is unset).
        base (Mapping[str, str] | None): the inherited environment (default: empty); its
            :data:`CONTRACT_VARS` are dropped, everything else is kept.

    Returns:
        dict[str, str]: ``base`` without :data:`CONTRACT_VARS`, plus the role's contract
        variables (module docstring).

    Raises:
        ClusterSpecError: unknown role, or a worker id / local rank missing, out of range,
            or given for a role that has none.
    """
    if role not in ROLES:
        raise ClusterSpecError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
    env = {k: v for k, v in (base or {}).items() if k not in CONTRACT_VARS}
    env.update({
        "DMLC_ROLE": role,
        "DMLC_NUM_WORKER": str(spec.num_workers),
        "DMLC_NUM_SERVER": str(spec.num_servers),
        "DMLC_PS_ROOT_URI": spec.scheduler_host,
        "DMLC_PS_ROOT_PORT": str(spec.scheduler_port),
        "BYTEPS_JOB_ID": spec.identity.job_id,
        "BYTEPS_SECRET": spec.identity.secret,
        "PYTHONUNBUFFERED": "1",
    })
    if node_host:
        env["DMLC_NODE_HOST"] = node_host
    if interface:
        env["DMLC_INTERFACE"] = interface
    if role == "worker":
        if worker_id is None or local_rank is None:
            raise ClusterSpecError("a worker needs its worker_id and local_rank")
        if not 0 <= worker_id < spec.num_workers:
            raise ClusterSpecError(f"worker_id {worker_id} is not in 0..{spec.num_workers - 1}")
        if not 0 <= local_rank < spec.local_size:
            raise ClusterSpecError(f"local_rank {local_rank} is not in 0..{spec.local_size - 1}")
        env.update({
            "DMLC_WORKER_ID": str(worker_id),
            "BYTEPS_LOCAL_RANK": str(local_rank),
            "BYTEPS_LOCAL_SIZE": str(spec.local_size),
        })
    elif worker_id is not None or local_rank is not None:
        raise ClusterSpecError(f"a {role} has no worker_id or local_rank")
    return env
