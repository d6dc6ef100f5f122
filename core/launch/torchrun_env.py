"""torchrun-style environments (``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``...) as a byteps job.

torchrun, TorchX, Kubeflow's trainer and Ray Train start one process per rank and describe the
job to it with torch.distributed's variables. When a process has no ``DMLC_*`` job description,
``byteps.init()`` maps those variables onto byteps' contract (:mod:`byteps.launch.contract`); this
module is that mapping, a pure function of an environment. :mod:`byteps.launch.torchrun` applies
it and starts the scheduler and servers.

==============================  ===================================================================
byteps                          from
==============================  ===================================================================
worker machines                 ``WORLD_SIZE / LOCAL_WORLD_SIZE`` (must divide)
``DMLC_NUM_WORKER``             the number of worker machines
``DMLC_WORKER_ID``              ``GROUP_RANK`` (torchrun), else ``NODE_RANK`` (Ray Train), else
                                ``RANK // LOCAL_WORLD_SIZE``
``BYTEPS_LOCAL_RANK``           ``LOCAL_RANK`` (0 when ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are
                                both unset: one process per node)
``BYTEPS_LOCAL_SIZE``           ``LOCAL_WORLD_SIZE`` (1 when both are unset)
global rank (checked)           ``RANK`` must equal ``worker_id * local_size + local_rank``
``DMLC_NUM_SERVER``             one server per worker machine, started by its local rank 0; none
                                for a one-machine job (unless ``BYTEPS_FORCE_DISTRIBUTED=1``)
``DMLC_PS_ROOT_URI``            ``MASTER_ADDR`` (the scheduler runs in global rank 0's process
                                tree, which torchrun places on ``MASTER_ADDR``'s host)
``DMLC_PS_ROOT_PORT``           ``MASTER_PORT + 1`` (torchrun's store holds ``MASTER_PORT``); an
                                explicit ``DMLC_PS_ROOT_PORT`` wins
``BYTEPS_JOB_ID``               ``TORCHELASTIC_RUN_ID``, ``MASTER_ADDR``/``MASTER_PORT`` and
                                ``TORCHELASTIC_RESTART_COUNT`` (readable run id + digest); an
                                explicit ``BYTEPS_JOB_ID`` wins
==============================  ===================================================================

The mapping applies only when ``RANK`` and ``WORLD_SIZE`` are both set and none of
``DMLC_ROLE``, ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_WORKER_ID``, ``DMLC_PS_ROOT_URI``
is (a ``DMLC_*`` description wins, whole). ``DMLC_NODE_HOST`` / ``DMLC_INTERFACE`` are kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from .contract import env_int, is_true

#: Any of these makes the environment a ``DMLC_*`` job description: the mapping stays off.
DMLC_DESCRIPTION_VARS = (
    "DMLC_ROLE",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_WORKER_ID",
    "DMLC_PS_ROOT_URI",
)

#: The torch.distributed variables the mapping reads (``GROUP_RANK``/``NODE_RANK`` optional).
TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE")

#: Offset of the scheduler's port from ``MASTER_PORT`` (torchrun's store listens there).
SCHEDULER_PORT_OFFSET = 1


class TorchrunEnvError(ConfigError):
    """A torchrun-style environment that cannot describe a byteps job.

    Raised by ``byteps.init()`` (before any thread, socket or process starts); the message names
    every offending variable with its value and the rank when it is known.
    """


@dataclass(frozen=True)
class TorchrunPlacement:
    """Where this process sits in the job, derived from a torchrun-style environment.

    Attributes:
        rank (int): global rank (``RANK``), ``worker_id * local_size + local_rank``.
        world_size (int): worker processes of the job (``WORLD_SIZE``).
        local_rank (int): rank on this machine (``LOCAL_RANK``).
        local_size (int): processes per machine (``LOCAL_WORLD_SIZE``).
        num_machines (int): worker machines, ``world_size // local_size``.
        worker_id (int): this machine's index, ``0..num_machines-1``.
        distributed (bool): more than one machine, or ``BYTEPS_FORCE_DISTRIBUTED`` true.
        num_servers (int): one per machine when distributed, else 0.
        master_addr (str): ``MASTER_ADDR`` ("" when unset in a one-machine job).
        master_port (int | None): ``MASTER_PORT`` (None when unset in a one-machine job).
        scheduler_port (int | None): the scheduler's port (None when not distributed).
        run_id (str): ``TORCHELASTIC_RUN_ID`` ("" when unset).
        restart_count (int): ``TORCHELASTIC_RESTART_COUNT`` (0 when unset).
    """

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    num_machines: int
    worker_id: int
    distributed: bool
    num_servers: int
    master_addr: str
    master_port: int | None
    scheduler_port: int | None
    run_id: str
    restart_count: int

    @property
    def starts_scheduler(self) -> bool:
        """True for global rank 0 of a distributed job: its process starts the scheduler."""
        return self.distributed and self.rank == 0

    @property
    def starts_server(self) -> bool:
        """True for local rank 0 of every machine of a distributed job: it starts that
        machine's server."""
        return self.distributed and self.local_rank == 0


def is_torchrun_env(env: Mapping[str, str]) -> bool:
    """True when ``env`` is torchrun-style (``RANK`` and ``WORLD_SIZE`` set) and carries no
    ``DMLC_*`` job description (:data:`DMLC_DESCRIPTION_VARS`)."""
    if any(name in env for name in DMLC_DESCRIPTION_VARS):
        return False
    return "RANK" in env and "WORLD_SIZE" in env


def placement_from_env(env: Mapping[str, str]) -> TorchrunPlacement:
    """Map a torchrun-style environment onto byteps' placement (module docstring's table).

    Args:
        env (Mapping[str, str]): the process environment; it should pass
            :func:`is_torchrun_env` (the ``DMLC_*`` description is not looked at here).

    Returns:
        TorchrunPlacement: this process's place in the job.

    Raises:
        TorchrunEnvError: every problem found, in one message: ``RANK``/``WORLD_SIZE`` missing
            or not integers, out of range; only one of ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``;
            ``WORLD_SIZE`` not a multiple of ``LOCAL_WORLD_SIZE``; ``GROUP_RANK``/``NODE_RANK``
            out of range; ``RANK`` other than ``worker_id * local_size + local_rank`` (byteps'
            numbering); ``MASTER_ADDR``/``MASTER_PORT`` missing or bad in a distributed job;
            ``MASTER_PORT + 1`` above 65535 without ``DMLC_PS_ROOT_PORT``; a
            ``BYTEPS_LOCAL_RANK``/``BYTEPS_LOCAL_SIZE``/``BYTEPS_GLOBAL_RANK`` that contradicts
            the torchrun variables.
    """
    errors: list[str] = []
    for name in ("RANK", "WORLD_SIZE"):
        if name not in env:
            errors.append(f"{name} is not set (a torchrun-style job needs RANK and WORLD_SIZE)")
    world = env_int(env, "WORLD_SIZE", 1, None, errors)
    rank = env_int(env, "RANK", 0, None if world is None else world - 1, errors)
    has_lr, has_lws = "LOCAL_RANK" in env, "LOCAL_WORLD_SIZE" in env
    if has_lr != has_lws:
        missing = "LOCAL_WORLD_SIZE" if has_lr else "LOCAL_RANK"
        errors.append(f"{missing} is not set but {'LOCAL_RANK' if has_lr else 'LOCAL_WORLD_SIZE'}"
                      " is: give both (processes on this node and this process's index among "
                      "them) or neither (one process per node)")
        local_size = local_rank = None
    elif has_lws:
        local_size = env_int(env, "LOCAL_WORLD_SIZE", 1, None, errors)
        local_rank = env_int(env, "LOCAL_RANK", 0,
                          None if local_size is None else local_size - 1, errors)
    else:
        local_size, local_rank = 1, 0
    machines = worker_id = None
    if world is not None and local_size is not None:
        if world % local_size:
            errors.append(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE="
                          f"{local_size}: byteps needs the same number of processes on every "
                          "node")
        else:
            machines = world // local_size
    high = None if machines is None else machines - 1
    for name in ("GROUP_RANK", "NODE_RANK"):
        if name in env:
            worker_id = env_int(env, name, 0, high, errors)
            break
    else:
        if rank is not None and local_size is not None:
            worker_id = rank // local_size
    if None not in (rank, worker_id, local_size, local_rank, machines):
        expected = worker_id * local_size + local_rank
        if rank != expected:
            errors.append(
                f"RANK={rank} is not worker_id * local_size + local_rank = {worker_id} * "
                f"{local_size} + {local_rank} = {expected} (node {worker_id}, LOCAL_RANK="
                f"{local_rank}): byteps numbers ranks node by node; give every node a "
                f"contiguous block of ranks in LOCAL_RANK order")
    for name, want in (("BYTEPS_LOCAL_RANK", local_rank), ("BYTEPS_LOCAL_SIZE", local_size)):
        raw = env.get(name)
        if raw is not None and want is not None and raw.strip() != str(want):
            errors.append(f"{name}={raw!r} contradicts the torchrun variables ({want}); unset it")
    raw = env.get("BYTEPS_GLOBAL_RANK")
    if raw is not None and rank is not None and raw.strip() not in ("-1", str(rank)):
        errors.append(f"BYTEPS_GLOBAL_RANK={raw!r} contradicts RANK={rank}; unset it")
    distributed = (machines or 1) > 1 or is_true(env.get("BYTEPS_FORCE_DISTRIBUTED"))
    master_addr = env.get("MASTER_ADDR", "").strip()
    master_port = env_int(env, "MASTER_PORT", 1, 65535, errors)
    scheduler_port = None
    if distributed:
        why = f"({machines} machines)" if (machines or 1) > 1 else "(BYTEPS_FORCE_DISTRIBUTED)"
        if not master_addr:
            errors.append(f"MASTER_ADDR is {'empty' if 'MASTER_ADDR' in env else 'not set'}: a "
                          f"distributed job {why} runs its scheduler at MASTER_ADDR")
        if "MASTER_PORT" not in env and "DMLC_PS_ROOT_PORT" not in env:
            errors.append(f"MASTER_PORT is not set: a distributed job {why} derives the "
                          "scheduler's port from it (or give DMLC_PS_ROOT_PORT)")
        if "DMLC_PS_ROOT_PORT" in env:
            scheduler_port = env_int(env, "DMLC_PS_ROOT_PORT", 1, 65535, errors)
        elif master_port is not None:
            scheduler_port = master_port + SCHEDULER_PORT_OFFSET
            if scheduler_port > 65535:
                errors.append(f"MASTER_PORT={master_port}: the scheduler's port MASTER_PORT + "
                              f"{SCHEDULER_PORT_OFFSET} is above 65535; choose a lower "
                              "MASTER_PORT or set DMLC_PS_ROOT_PORT")
                scheduler_port = None
    restart = env_int(env, "TORCHELASTIC_RESTART_COUNT", 0, None, errors)
    if errors:
        who = f"rank {rank}" if rank is not None else "this process"
        raise TorchrunEnvError(f"torchrun-style environment of {who}: " + "; ".join(errors))
    return TorchrunPlacement(
        rank=rank, world_size=world, local_rank=local_rank, local_size=local_size,
        num_machines=machines, worker_id=worker_id, distributed=distributed,
        num_servers=machines if distributed else 0, master_addr=master_addr,
        master_port=master_port, scheduler_port=scheduler_port,
        run_id=env.get("TORCHELASTIC_RUN_ID", "").strip(), restart_count=restart or 0)


def derive_job_id(placement: TorchrunPlacement, fallback: str = "") -> str:
    """``BYTEPS_JOB_ID`` of the processes of one machine (it names their shared memory).

    The readable part is ``TORCHELASTIC_RUN_ID`` (alphanumerics, at most 16; ``torchrun`` when
    it is unset or torchrun's default ``none``), then 10 hex digits of a SHA-256 over the run id,
    ``MASTER_ADDR``, ``MASTER_PORT``, the restart count and ``fallback``: two jobs on one host
    differ whenever their run id or master address differ, and a restarted job does not meet
    the segments its killed predecessor left behind.

    Args:
        placement (TorchrunPlacement): the job.
        fallback (str): mixed into the digest; callers pass what all local processes share
            when the environment names no run and no master (the parent's pid).

    Returns:
        str: at most 27 characters of ``[A-Za-z0-9-]``.
    """
    readable = re.sub(r"[^A-Za-z0-9]", "", placement.run_id)[:16]
    if not readable or placement.run_id == "none":
        readable = "torchrun"
    text = "\0".join((placement.run_id, placement.master_addr, str(placement.master_port),
                      str(placement.restart_count), fallback))
    return f"{readable}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"
