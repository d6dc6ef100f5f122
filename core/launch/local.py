"""Local mode of ``bpslaunch`` (``--workers N``): the whole job on this host.

For a distributed job (``N > 1``, ``BYTEPS_FORCE_DISTRIBUTED=1`` or ``BYTEPS_ENABLE_ASYNC=1``)
one scheduler and ``--servers K`` servers (``python -m byteps.server``), and always ``N x
--local-size L`` workers running COMMAND. The launcher picks the rendezvous port, a fresh job
id and a fresh job secret (given to the children in the environment, never on a command line).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence

from .common import ChildSpec, LaunchError, check_job_shape, default_server_argv, find_free_port
from .contract import ClusterSpec, JobIdentity, is_true, role_env


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
