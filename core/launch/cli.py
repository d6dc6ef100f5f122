"""``bpslaunch``: start the processes of a byteps job and supervise them.

Two modes (``bpslaunch --help`` for the options):

* **Local mode** (``--workers N`` given): the whole job on this host. For a distributed job
  (``N > 1`` or ``BYTEPS_FORCE_DISTRIBUTED=1``) one scheduler and ``--servers K`` servers
  (``python -m byteps.server``), and always ``N x --local-size L`` workers running COMMAND.
  The launcher picks the rendezvous port, a fresh job id and a fresh job secret (given to the
  children in the environment, never on a command line).
* **Upstream mode** (no ``--workers``): like upstream ``launcher/launch.py``: the role and the
  cluster come from ``DMLC_*`` variables; a worker runs COMMAND once per local rank
  (``BYTEPS_LOCAL_SIZE``), a server or scheduler runs ``python -m byteps.server``. A server or
  scheduler always runs when its role is asked for, even if its own environment describes a
  single-machine job (``DMLC_NUM_WORKER=1`` without ``BYTEPS_FORCE_DISTRIBUTED``): upstream's
  test harness starts them that way and sets ``BYTEPS_FORCE_DISTRIBUTED=1`` in the worker only.

In both modes every output line of a child is prefixed with ``[role rank] ``; the first child
that fails stops the job (after ``--grace`` seconds) and its exit code becomes the launcher's
(``128 + n`` for death by signal ``n``); children never outlive the launcher.

Exit codes: 0 success; 2 usage or environment error; 130/143 stopped by SIGINT/SIGTERM;
otherwise the first failed child's code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from ..knobs import report_environment
from . import k8s, slurm, ssh
from .common import DEFAULT_GRACE, LOCAL_MODE_VARS, LaunchError, cleanup_shm, parse_env_pairs
from .contract import is_true
from .local import build_local_plan
from .supervise import run_job
from .upstream import build_upstream_plan, upstream_is_distributed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bpslaunch",
        description="Launch a byteps job. With --workers: the whole job on this host (local "
        "mode). Without: one node of a cluster described by DMLC_* variables (upstream mode).",
        epilog="Exit status: 0 success, 2 usage/environment error, 130/143 interrupted, "
        "otherwise the first failed process's code (128+n for signal n).",
    )
    p.add_argument("--workers", type=int, metavar="N",
                   help="local mode: number of worker machines to simulate on this host")
    p.add_argument("--servers", type=int, metavar="K",
                   help="local mode: number of servers of a distributed job (default 1)")
    p.add_argument("--local-size", type=int, metavar="L",
                   help="local mode: worker processes per worker machine (default 1)")
    p.add_argument("--port", type=int, metavar="P",
                   help="scheduler port (local mode: default a free port; the other modes say theirs)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                   help="extra environment variable for every process (repeatable; not in upstream mode)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS",
                   help="after the first failure, seconds the other processes get to exit "
                   f"before SIGTERM (default {DEFAULT_GRACE:g})")
    p.add_argument("--doctor", action="store_true",
                   help="print what byteps sees on this host (vans, RDMA devices, summation "
                   "kernels, frameworks, the address a node would advertise, environment "
                   "problems) for the environment the job would get, and exit (1 if a problem "
                   "was found); see python -m byteps.doctor")
    ssh = p.add_argument_group(
        "ssh hosts", "the job on several hosts over ssh (--port and --env apply too); "
        "scheduler on the first worker host, one server per worker host")
    ssh.add_argument("--hosts", metavar="H[:SLOTS],...",
                     help="worker hosts, each running SLOTS workers (default 1; the same on "
                     "every host), e.g. h1:2,h2:2")
    ssh.add_argument("--hostfile", metavar="FILE",
                     help="worker hosts from FILE, one 'host slots=N' per line (# comments)")
    ssh.add_argument("--server-hosts", metavar="H,...",
                     help="more hosts running one server each")
    ssh.add_argument("--ssh-port", type=int, metavar="P", help="ssh port of every host")
    ssh.add_argument("--ssh-identity", metavar="FILE", help="ssh private key (ssh -i)")
    ssh.add_argument("--ssh-config", metavar="FILE",
                     help="ssh configuration file (ssh -F; replaces ~/.ssh/config)")
    ssh.add_argument("--network-interface", metavar="IF",
                     help="DMLC_INTERFACE of every process: the interface whose address the "
                     "nodes advertise")
    slurm = p.add_argument_group(
        "Slurm", "the job on the nodes of the Slurm allocation it runs in, through srun steps "
        "(--port and --env apply too); chosen by itself when SLURM_JOB_ID is set, DMLC_ROLE is "
        "not and no other mode is asked for: scheduler on the first node, workers = the "
        "allocation's tasks (the same number on every node)")
    slurm.add_argument("--slurm", action="store_true",
                       help="launch through Slurm (run once, from the sbatch script or salloc "
                       "shell)")
    slurm.add_argument("--servers-per-node", type=int, metavar="S",
                       help="servers on every node of the allocation (default 1)")
    k8s.add_arguments(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                   help="the worker command (everything after the options; '--' allowed)")
    return p


def main(
    argv: Sequence[str] | None = None,
    *,
    server_argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Entry point of ``bpslaunch``.

    Args:
        argv (Sequence[str] | None): arguments without the program name; default
            ``sys.argv[1:]``.
        server_argv (Sequence[str] | None): command for servers and the scheduler, default
            :func:`default_server_argv` (for tests).
        env (Mapping[str, str] | None): parent environment, default ``os.environ``.

    Returns:
        int: 0 on success; 2 for a usage or environment error (message on stderr); 130/143
        when stopped by SIGINT/SIGTERM; otherwise the first failed child's exit code
        (``128 + n`` for a child killed by signal ``n``).
    """
    parser = _parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    parent = dict(os.environ if env is None else env)
    if not 0 <= args.grace < float("inf"):
        return _usage_error(f"--grace must be a finite number >= 0, got {args.grace:g}")
    manifest_rc = k8s.manifest_main(args, command)  # --k8s-manifest: write YAML, start nothing
    if manifest_rc is not None:
        return manifest_rc
    if args.doctor:
        from byteps import doctor  # the report needs the core; a plain launch does not load it

        try:
            report = doctor.gather({**parent, **parse_env_pairs(args.env)})
        except LaunchError as err:
            return _usage_error(str(err))
        print(doctor.render(report))
        return 1 if report["problems"] else 0
    try:
        # Unknown and upstream-only variables: warned here and in every process; a refused
        # one stops the job before any process starts.
        refused = report_environment({**parent, **parse_env_pairs(args.env)})
        if refused:
            raise LaunchError(refused)
        if args.hosts is not None or args.hostfile is not None:
            specs = ssh.plan_from_args(args, command, parent, server_argv=server_argv)
            job_id = None  # each host's runner removes its leftover shared memory
        elif ssh.ssh_options_given(args):
            raise LaunchError(f"{', '.join(ssh.ssh_options_given(args))}: only with --hosts or "
                              "--hostfile")
        elif args.slurm or args.servers_per_node is not None or (
                args.workers is None and _slurm_detected(parent)):
            return _launch_slurm(args, command, parent, server_argv)
        elif args.workers is not None:
            extra = parse_env_pairs(args.env, LOCAL_MODE_VARS)
            local_size = 1 if args.local_size is None else args.local_size
            specs = build_local_plan(
                args.workers, 1 if args.servers is None else args.servers, command,
                local_size=local_size, port=args.port, extra_env=extra, base_env=parent,
                server_argv=server_argv,
            )
            if args.servers and len(specs) == local_size:
                print("bpslaunch: one worker machine: no scheduler or servers started "
                      "(set BYTEPS_FORCE_DISTRIBUTED=1 to start them)", file=sys.stderr)
            job_id: str | None = specs[0].env["BYTEPS_JOB_ID"]
        else:
            given = [opt for opt, val in (("--servers", args.servers is not None),
                                         ("--local-size", args.local_size is not None),
                                         ("--port", args.port is not None),
                                         ("--env", bool(args.env))) if val]
            if given:
                raise LaunchError(f"{', '.join(given)} need --workers (local mode); in upstream "
                                  "mode the job is described by DMLC_*/BYTEPS_* variables")
            specs = build_upstream_plan(parent, command, server_argv=server_argv)
            role = parent["DMLC_ROLE"].strip().lower()
            print(f"bpslaunch: launching {role}", file=sys.stderr)
            if role != "worker" and not upstream_is_distributed(parent):
                print(f"bpslaunch: note: DMLC_NUM_WORKER=1: this {role} serves a worker that "
                      "sets BYTEPS_FORCE_DISTRIBUTED=1 (without it the worker uses no servers)",
                      file=sys.stderr)
            # Only a worker node owns the job's shared memory; without BYTEPS_JOB_ID the core
            # derives the id itself and there is nothing we can match.
            job_id = parent.get("BYTEPS_JOB_ID") if role == "worker" else None
    except LaunchError as exc:
        return _usage_error(str(exc))

    def cleanup() -> None:
        removed = cleanup_shm(job_id)
        if removed:
            print(f"bpslaunch: removed {len(removed)} leftover shared-memory segment(s) of job "
                  f"{job_id}", file=sys.stderr)

    # Asynchronous training (docs/async.md): a worker that dies leaves the job, the others
    # train on, so the launcher does not stop them either.
    keep_going = any(s.role == "worker" and is_true(s.env.get("BYTEPS_ENABLE_ASYNC"))
                     for s in specs)
    return run_job(specs, grace=args.grace, on_exit=cleanup, keep_going=keep_going)


def _slurm_detected(env: Mapping[str, str]) -> bool:
    """Inside a Slurm allocation (``SLURM_JOB_ID``) with no ``DMLC_ROLE``: ``--slurm`` mode."""
    return bool(env.get("SLURM_JOB_ID", "").strip()) and "DMLC_ROLE" not in env


def _launch_slurm(args, command, parent, server_argv) -> int:
    """``--slurm`` (or detected): see :mod:`byteps.launch.slurm`; LaunchError for bad options."""
    clash = [opt for opt, val in (("--workers", args.workers is not None),
                                  ("--servers", args.servers is not None),
                                  ("--local-size", args.local_size is not None)) if val]
    if clash:
        raise LaunchError(f"{', '.join(clash)}: not with --slurm (the allocation gives the "
                          "workers; servers: --servers-per-node)")
    if not args.slurm:
        if not _slurm_detected(parent):
            raise LaunchError("--servers-per-node: only with --slurm")
        print(f"bpslaunch: SLURM_JOB_ID={parent['SLURM_JOB_ID'].strip()} is set and DMLC_ROLE is "
              "not: launching the job on the Slurm allocation's nodes (as with --slurm)",
              file=sys.stderr, flush=True)
    return slurm.run_slurm(command, servers_per_node=args.servers_per_node or 1, port=args.port,
                     grace=args.grace, env=parent,
                     extra_env=parse_env_pairs(args.env, LOCAL_MODE_VARS),
                     server_argv=server_argv)


def _usage_error(message: str) -> int:
    print(f"bpslaunch: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
