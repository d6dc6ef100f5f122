"""``python -m byteps.launch.slurm_task [--] COMMAND ...``: one worker task of a Slurm job step.

``bpslaunch --slurm`` starts the workers as one ``srun`` step whose environment describes the
job (``DMLC_*``/``BYTEPS_*`` of a worker, see :mod:`byteps.launch.contract`); every task of the step
runs this module, which sets its own identity from Slurm's and execs COMMAND:

* ``DMLC_WORKER_ID`` = ``SLURM_NODEID`` (the task's node within the step: the worker machine),
* ``BYTEPS_LOCAL_RANK`` = ``SLURM_LOCALID`` (the task's index on its node),

checked against ``DMLC_NUM_WORKER`` and ``BYTEPS_LOCAL_SIZE``. The rest of the environment is
kept (the secret stays in the environment). It can serve a hand-written ``srun`` too, as long as
the step has ``DMLC_NUM_WORKER`` nodes with ``BYTEPS_LOCAL_SIZE`` tasks each (``--nodes``,
``--ntasks-per-node``, block distribution).

Exit status: COMMAND's (this process becomes it); 2 with a message naming the variable when
the environment does not describe a worker task; 127/126 when COMMAND cannot be executed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from .contract import ClusterSpec, ClusterSpecError, JobIdentity, role_env


class SlurmTaskError(ValueError):
    """The task's environment does not describe a worker of a Slurm step (message says why)."""


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        raise SlurmTaskError(f"{name} is not set (run under srun, started by bpslaunch --slurm)")
    try:
        return int(raw.strip())
    except ValueError:
        raise SlurmTaskError(f"{name}={raw!r} is not an integer") from None


def task_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the worker task described by ``env`` (a Slurm task's environment).

    Args:
        env (Mapping[str, str]): needs ``SLURM_NODEID``, ``SLURM_LOCALID`` and the job's
            ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_PS_ROOT_URI``,
            ``DMLC_PS_ROOT_PORT``, ``BYTEPS_LOCAL_SIZE``, ``BYTEPS_JOB_ID``, ``BYTEPS_SECRET``.

    Returns:
        dict[str, str]: ``env`` with the worker's contract variables
        (:func:`byteps.launch.contract.role_env`): ``DMLC_ROLE=worker``,
        ``DMLC_WORKER_ID=SLURM_NODEID``, ``BYTEPS_LOCAL_RANK=SLURM_LOCALID``.

    Raises:
        SlurmTaskError: a variable is missing or malformed, or the task's ids do not fit the
            job (a node id >= DMLC_NUM_WORKER, a local id >= BYTEPS_LOCAL_SIZE).
    """
    node_id, local_id = _int(env, "SLURM_NODEID"), _int(env, "SLURM_LOCALID")
    for name in ("DMLC_PS_ROOT_URI", "BYTEPS_JOB_ID", "BYTEPS_SECRET"):
        if not env.get(name):
            raise SlurmTaskError(f"{name} is not set (the step's environment is not a byteps "
                                 "job's; start it with bpslaunch --slurm)")
    try:
        spec = ClusterSpec(_int(env, "DMLC_NUM_WORKER"), _int(env, "DMLC_NUM_SERVER"),
                           _int(env, "BYTEPS_LOCAL_SIZE"), env["DMLC_PS_ROOT_URI"],
                           _int(env, "DMLC_PS_ROOT_PORT"),
                           JobIdentity(env["BYTEPS_JOB_ID"], env["BYTEPS_SECRET"]))
        out = role_env(spec, "worker", worker_id=node_id, local_rank=local_id, base=env)
    except ClusterSpecError as exc:
        raise SlurmTaskError(f"SLURM_NODEID={node_id}, SLURM_LOCALID={local_id}: {exc} (the "
                             "step must have DMLC_NUM_WORKER nodes with BYTEPS_LOCAL_SIZE "
                             "tasks each)") from None
    if env.get("DMLC_INTERFACE"):  # the step's choice of interface, the same on every node
        out["DMLC_INTERFACE"] = env["DMLC_INTERFACE"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Exec COMMAND with the task's environment; returns only on an error (2, 126 or 127)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("byteps.launch.slurm_task: no COMMAND given (usage: python -m byteps.launch.slurm_task [--] "
              "COMMAND ...)", file=sys.stderr)
        return 2
    try:
        env = task_env(os.environ)
    except SlurmTaskError as exc:
        print(f"byteps.launch.slurm_task: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(f"byteps.launch.slurm_task: cannot run {args[0]!r} on {os.uname().nodename}: {exc}",
              file=sys.stderr)
        return 126 if isinstance(exc, PermissionError) else 127
    return 0  # pragma: no cover (execvpe does not return)


if __name__ == "__main__":
    sys.exit(main())
