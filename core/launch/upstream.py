"""Upstream mode of ``bpslaunch`` (no ``--workers``), like upstream ``launcher/launch.py``:
the role and the cluster come from ``DMLC_*`` variables; a worker runs COMMAND once per local
rank (``BYTEPS_LOCAL_SIZE``), a server or scheduler runs ``python -m byteps.server``.

A server or scheduler always runs when its role is asked for, even if its own environment
describes a single-machine job (``DMLC_NUM_WORKER=1`` without ``BYTEPS_FORCE_DISTRIBUTED``):
upstream's test harness starts them that way and sets ``BYTEPS_FORCE_DISTRIBUTED=1`` in the
worker only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .common import ChildSpec, LaunchError, default_server_argv
from .contract import ROLES, env_int, is_true


def upstream_is_distributed(env: Mapping[str, str]) -> bool:
    """True when ``DMLC_NUM_WORKER > 1``, or ``BYTEPS_FORCE_DISTRIBUTED`` or
    ``BYTEPS_ENABLE_ASYNC`` (whose servers keep the parameters) is true in ``env``.

    A missing or malformed ``DMLC_NUM_WORKER`` counts as 1 (validation reports it).
    """
    try:
        num_worker = int(env.get("DMLC_NUM_WORKER", "1").strip())
    except ValueError:
        num_worker = 1
    return (num_worker > 1 or is_true(env.get("BYTEPS_FORCE_DISTRIBUTED"))
            or is_true(env.get("BYTEPS_ENABLE_ASYNC")))


def validate_upstream_env(env: Mapping[str, str]) -> list[str]:
    """Check the ``DMLC_*`` contract of upstream mode.

    Rules: ``DMLC_ROLE`` is worker|server|scheduler; ``DMLC_NUM_WORKER`` (>= 1) is required.
    A server or scheduler, and a worker of a distributed job (``DMLC_NUM_WORKER > 1`` or
    ``BYTEPS_FORCE_DISTRIBUTED=1``), also need ``DMLC_NUM_SERVER`` (>= 1),
    ``DMLC_PS_ROOT_URI`` (non-empty) and ``DMLC_PS_ROOT_PORT`` (1..65535). Workers always
    need ``DMLC_WORKER_ID`` in
    ``0..DMLC_NUM_WORKER-1``. ``BYTEPS_LOCAL_SIZE``, if set, is >= 1. Variables that are not
    required are still checked when present.

    Args:
        env (Mapping[str, str]): the environment to check.

    Returns:
        list[str]: one message per problem, each naming the variable and its value; empty
        when the environment is usable.
    """
    errors: list[str] = []
    role = env.get("DMLC_ROLE")
    if role is None:
        errors.append("DMLC_ROLE is not set (must be one of worker, server, scheduler)")
    elif role.strip().lower() not in ROLES:
        errors.append(f"DMLC_ROLE={role!r} is not one of worker, server, scheduler")
    role = (role or "").strip().lower()
    # A server or scheduler exists only to serve a distributed job, whatever its own
    # DMLC_NUM_WORKER/BYTEPS_FORCE_DISTRIBUTED say.
    distributed = upstream_is_distributed(env) or role in ("server", "scheduler")
    required = ["DMLC_NUM_WORKER"]
    if distributed:
        required += ["DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"]
    if role == "worker":
        required.append("DMLC_WORKER_ID")
    kind = f"{'distributed ' if role == 'worker' and distributed else ''}{role or 'byteps'}"
    for name in required:
        if name not in env:
            errors.append(f"{name} is not set (required for a {kind} process)")
    num_worker = env_int(env, "DMLC_NUM_WORKER", 1, None, errors)
    env_int(env, "DMLC_NUM_SERVER", 1 if distributed else 0, None, errors)
    env_int(env, "DMLC_PS_ROOT_PORT", 1, 65535, errors)
    env_int(env, "BYTEPS_LOCAL_SIZE", 1, None, errors)
    if "DMLC_PS_ROOT_URI" in env and not env["DMLC_PS_ROOT_URI"].strip():
        errors.append("DMLC_PS_ROOT_URI='' is empty")
    high = num_worker - 1 if num_worker is not None else None
    if role == "worker" or "DMLC_WORKER_ID" in env:
        env_int(env, "DMLC_WORKER_ID", 0, high, errors)
    return errors


def build_upstream_plan(
    env: Mapping[str, str],
    command: Sequence[str],
    *,
    server_argv: Sequence[str] | None = None,
) -> list[ChildSpec]:
    """Plan upstream mode from an environment that passed :func:`validate_upstream_env`.

    Args:
        env (Mapping[str, str]): the environment (``DMLC_ROLE`` etc.).
        command (Sequence[str]): the worker command; ignored for server/scheduler.
        server_argv (Sequence[str] | None): default :func:`default_server_argv`.

    Returns:
        list[ChildSpec]: worker: one spec per local rank (``BYTEPS_LOCAL_SIZE``, default 1);
        server/scheduler: one spec (also when ``DMLC_NUM_WORKER=1`` and
        ``BYTEPS_FORCE_DISTRIBUTED`` is unset: the role was asked for explicitly).

    Raises:
        LaunchError: the environment is invalid, or a worker has no command.
    """
    errors = validate_upstream_env(env)
    if errors:
        raise LaunchError("; ".join(errors))
    role = env["DMLC_ROLE"].strip().lower()
    base = {**env, "DMLC_ROLE": role, "PYTHONUNBUFFERED": "1"}
    if role != "worker":
        srv = list(server_argv) if server_argv is not None else default_server_argv()
        return [ChildSpec(role, None, srv, base)]
    if not command:
        raise LaunchError("no COMMAND given for DMLC_ROLE=worker (usage: bpslaunch COMMAND ...)")
    local_size = int(env.get("BYTEPS_LOCAL_SIZE", "1").strip())
    worker_id = int(env["DMLC_WORKER_ID"].strip())
    specs = []
    for lr in range(local_size):
        child_env = {**base, "BYTEPS_LOCAL_RANK": str(lr), "BYTEPS_LOCAL_SIZE": str(local_size)}
        specs.append(ChildSpec("worker", worker_id * local_size + lr, list(command), child_env))
    return specs
