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
import glob
import os
import secrets
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .cluster_env import ClusterSpec, JobIdentity, env_int, is_true, role_env
from .knobs import report_environment
from .launcher_output import run_job

ROLES = ("worker", "server", "scheduler")

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
            signals). See :func:`byteps.launcher_output.run_job`.
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


def build_local_plan(
    workers: int,
    servers: int,
    command: Sequence[str],
    *,
    local_size: int = 1,
    port: int | None = None,
    extra_env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    server_argv: Sequence[str] | None = None,
    job_id: str | None = None,
    secret: str | None = None,
) -> list[ChildSpec]:
    """Plan a local-mode job: scheduler and servers (if distributed), then the workers.

    Args:
        workers (int): worker machines N, >= 1.
        servers (int): servers K, >= 0; must be >= 1 when the job is distributed.
        command (Sequence[str]): the worker command (argv), non-empty.
        local_size (int): worker processes per machine L, >= 1. Default 1.
        port (int | None): scheduler port, 1..65535; default: a free port.
        extra_env (Mapping[str, str] | None): ``--env`` entries, applied to every child.
        base_env (Mapping[str, str] | None): the parent environment; default ``os.environ``.
        server_argv (Sequence[str] | None): server/scheduler command; default
            :func:`default_server_argv` (tests pass a stand-in).
        job_id (str | None): default: 12 fresh random hex characters.
        secret (str | None): default: ``secrets.token_hex(32)``.

    Returns:
        list[ChildSpec]: ``[scheduler, server 0..K-1, worker 0..N*L-1]`` when distributed
        (``N > 1``, ``BYTEPS_FORCE_DISTRIBUTED=1`` or ``BYTEPS_ENABLE_ASYNC=1`` in
        ``base_env``/``extra_env``), else only
        the workers (and ``DMLC_NUM_SERVER=0``). With ``BYTEPS_TRACE_ON=1`` and N > 1, worker
        machine w gets ``BYTEPS_TRACE_DIR=<dir>/worker<w>`` (default dir ``./trace``), so the
        timelines of worker machines sharing this host do not overwrite each other.

    Raises:
        LaunchError: a count is out of range, the command is empty, or K == 0 while distributed
            (unless ``BYTEPS_SYNC`` is ``ring`` or ``tree``: docs/schemes.md).
    """
    check_job_shape(workers, servers, local_size, port)
    if not command:
        raise LaunchError("no COMMAND given (usage: bpslaunch --workers N [options] COMMAND ...)")
    parent = dict(os.environ if base_env is None else base_env)
    extra = dict(extra_env or {})
    forced = is_true(extra.get("BYTEPS_FORCE_DISTRIBUTED", parent.get("BYTEPS_FORCE_DISTRIBUTED")))
    # Asynchronous training needs the servers (they keep the parameters), even for one worker.
    forced = forced or is_true(extra.get("BYTEPS_ENABLE_ASYNC", parent.get("BYTEPS_ENABLE_ASYNC")))
    distributed = workers > 1 or forced
    # Ring and tree all-reduce (docs/schemes.md) need no server.
    all_reduce = extra.get("BYTEPS_SYNC", parent.get("BYTEPS_SYNC", "")) in ("ring", "tree")
    if distributed and servers == 0 and not all_reduce:
        raise LaunchError(
            f"--servers 0 with a distributed job ({workers} worker machine(s)"
            f"{', BYTEPS_FORCE_DISTRIBUTED=1 or BYTEPS_ENABLE_ASYNC=1' if forced else ''}): "
            "give --servers >= 1 "
            "(or BYTEPS_SYNC=ring or tree, which need none; servers colocated on worker hosts "
            "are not supported yet)"
        )
    cluster = ClusterSpec(
        workers, servers if distributed else 0, local_size, "127.0.0.1",
        port if port is not None else find_free_port(),
        JobIdentity(job_id or secrets.token_hex(6), secret or secrets.token_hex(32)))
    inherited = {**parent, **extra}

    def env_of(role: str, **worker) -> dict[str, str]:
        return role_env(cluster, role, node_host="127.0.0.1", base=inherited, **worker)

    specs: list[ChildSpec] = []
    if distributed:
        srv = list(server_argv) if server_argv is not None else default_server_argv()
        specs.append(ChildSpec("scheduler", None, srv, env_of("scheduler")))
        for s in range(servers):
            specs.append(ChildSpec("server", s, list(srv), env_of("server")))
    # Every worker machine runs on this host: with the timeline on, each gets its own
    # directory, so their <dir>/<local_rank>/comm.json do not overwrite each other.
    trace_dir = inherited.get("BYTEPS_TRACE_DIR") or "./trace"
    own_trace_dir = workers > 1 and is_true(inherited.get("BYTEPS_TRACE_ON"))
    for w in range(workers):
        for lr in range(local_size):
            env = env_of("worker", worker_id=w, local_rank=lr)
            if own_trace_dir:
                env["BYTEPS_TRACE_DIR"] = os.path.join(trace_dir, f"worker{w}")
            specs.append(ChildSpec("worker", cluster.rank(w, lr), list(command), env))
    return specs


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
    from .launch_k8s import add_arguments as add_k8s_arguments  # imports this module

    add_k8s_arguments(p)
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
    from .launch_k8s import manifest_main

    manifest_rc = manifest_main(args, command)  # --k8s-manifest: write YAML, start nothing
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
        from .launch_ssh import plan_from_args, ssh_options_given

        if args.hosts is not None or args.hostfile is not None:
            specs = plan_from_args(args, command, parent, server_argv=server_argv)
            job_id = None  # each host's runner removes its leftover shared memory
        elif ssh_options_given(args):
            raise LaunchError(f"{', '.join(ssh_options_given(args))}: only with --hosts or "
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
    """``--slurm`` (or detected): see :mod:`byteps.launch_slurm`; LaunchError for bad options."""
    from .launch_slurm import run_slurm

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
    return run_slurm(command, servers_per_node=args.servers_per_node or 1, port=args.port,
                     grace=args.grace, env=parent,
                     extra_env=parse_env_pairs(args.env, LOCAL_MODE_VARS),
                     server_argv=server_argv)


def _usage_error(message: str) -> int:
    print(f"bpslaunch: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # The package's module, not this __main__ copy: the engine launchers import
    # byteps.launcher, and the LaunchError they raise must be the one main() catches.
    from byteps.launcher import main as _main

    sys.exit(_main())
