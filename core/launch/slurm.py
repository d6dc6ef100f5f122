"""``bpslaunch --slurm``: a byteps job on the nodes of a Slurm allocation, through ``srun``.

Run once per job from inside the allocation (the ``sbatch`` script, or the ``salloc`` shell);
``bpslaunch`` also chooses this mode by itself when ``SLURM_JOB_ID`` is set, no other mode was
asked for and ``DMLC_ROLE`` is unset.

Placement (from the allocation's environment):

* nodes: ``SLURM_JOB_NODELIST`` expanded by ``scontrol show hostnames``, in Slurm's order;
* local size ``L``: ``SLURM_NTASKS_PER_NODE``, else ``SLURM_TASKS_PER_NODE`` (``2(x3)``); every
  node must have the same count (the core numbers ranks ``worker_id * L + local_rank``);
* the scheduler: one task on the first node, listening on that node's ``NodeAddr``
  (``scontrol show node``; its name when Slurm has no address) and ``--port``;
* servers: ``--servers-per-node`` (default 1) on every node;
* workers: every task of the allocation: worker machine ``w`` = the ``w``-th node
  (``SLURM_NODEID``), local rank = ``SLURM_LOCALID``, global rank = ``SLURM_PROCID``.

The job runs as three job steps (``srun --overlap``, so they share the allocated CPUs): the
scheduler, the servers and the workers, each supervised by :func:`byteps.launch.supervise.run_job`
like a local child (``[role] `` prefixes in front of srun's ``--label`` task numbers, the first
failure stops the job, Ctrl-C stops every step). The job's environment, secret included, travels
in srun's environment (Slurm's default ``--export=ALL``), never on a command line; each worker
task passes through :mod:`byteps.launch.slurm_task`, which turns its Slurm ids into ``DMLC_WORKER_ID``
and ``BYTEPS_LOCAL_RANK`` and execs the command.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from .common import ChildSpec, LaunchError, default_server_argv, find_free_port
from .contract import ClusterSpec, ClusterSpecError, JobIdentity, role_env
from .supervise import run_job

#: Environment variable whose presence makes a plain ``bpslaunch COMMAND`` use this mode.
DETECT_VAR = "SLURM_JOB_ID"

#: First port of the range a launcher that does not run on the scheduler's node picks from
#: (``PORT_BASE + job_id % PORT_SPAN``), so that it needs no probe on that node.
PORT_BASE = 20000
PORT_SPAN = 20000

#: Seconds a Slurm client command (scontrol, squeue, scancel) may take.
CLIENT_TIMEOUT = 30.0

Runner = Callable[[Sequence[str]], str]


def parse_tasks_per_node(value: str) -> list[int]:
    """Expand Slurm's tasks-per-node notation: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Args:
        value (str): ``SLURM_TASKS_PER_NODE`` / ``SLURM_JOB_CPUS_PER_NODE`` style: comma
            separated counts, each optionally followed by ``(xR)`` (repeated R times).

    Returns:
        list[int]: one count per node, in node order.

    Raises:
        LaunchError: the text is not in that notation, or a count or repeat is < 1.
    """
    counts: list[int] = []
    for part in value.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LaunchError(f"cannot parse tasks per node {value!r} (expected e.g. '2(x3),1')")
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if count < 1 or repeat < 1:
            raise LaunchError(f"tasks per node {value!r}: counts and repeats must be >= 1")
        counts += [count] * repeat
    return counts


def scontrol_runner(env: Mapping[str, str]) -> Runner:
    """A :data:`Runner` that runs a Slurm client command and returns its stdout.

    Raises (when called):
        LaunchError: the command is missing, times out or exits non-zero (with its stderr).
    """

    def run(argv: Sequence[str]) -> str:
        try:
            res = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True,
                                 timeout=CLIENT_TIMEOUT, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise LaunchError(f"{argv[0]} not found: --slurm needs Slurm's client commands "
                              "(scontrol, srun) on PATH") from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{shlex.join(argv)} did not answer within "
                              f"{CLIENT_TIMEOUT:g} s") from None
        if res.returncode != 0:
            raise LaunchError(f"{shlex.join(argv)} exited with {res.returncode}: "
                              f"{res.stderr.strip() or res.stdout.strip()}")
        return res.stdout

    return run


def expand_nodelist(nodelist: str, run: Runner) -> list[str]:
    """``SLURM_JOB_NODELIST`` (``"n[0-3],gpu7"``) -> node names, via ``scontrol show hostnames``.

    Raises:
        LaunchError: scontrol fails or returns no name.
    """
    names = [line.strip() for line in run(["scontrol", "show", "hostnames", nodelist]).splitlines()
             if line.strip()]
    if not names:
        raise LaunchError(f"scontrol show hostnames {nodelist!r} returned no node")
    return names


def node_address(node: str, run: Runner) -> str:
    """The address Slurm reaches ``node`` at (its ``NodeAddr``), or ``node`` itself.

    ``scontrol -o show node NODE`` is asked; when it fails or shows no ``NodeAddr`` the node's
    name is returned (it must then resolve on every node).
    """
    try:
        out = run(["scontrol", "-o", "show", "node", node])
    except LaunchError:
        return node
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", out)
    return m.group(1) if m and m.group(1) not in ("(null)", "") else node


@dataclass(frozen=True)
class SlurmAllocation:
    """What ``bpslaunch --slurm`` places the job on.

    Attributes:
        job_id (str): ``SLURM_JOB_ID``.
        nodes (tuple[str, ...]): node names in Slurm's order (worker machine ids follow it).
        local_size (int): tasks per node (worker processes per node).
        this_node (str | None): ``SLURMD_NODENAME``: the node the launcher runs on (None in
            an ``salloc`` shell on a login node).
    """

    job_id: str
    nodes: tuple[str, ...]
    local_size: int
    this_node: str | None


def read_allocation(env: Mapping[str, str], run: Runner) -> SlurmAllocation:
    """Read the allocation from ``SLURM_*`` variables (module docstring).

    Args:
        env (Mapping[str, str]): the launcher's environment.
        run (Runner): runs ``scontrol`` (see :func:`scontrol_runner`).

    Raises:
        LaunchError: not inside an allocation, inside a task of a multi-task step (bpslaunch
            must run once per job), an unparsable or unequal tasks-per-node count, or a node
            count that does not match the node list.
    """
    job_id = (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip()
    if not job_id:
        raise LaunchError("--slurm runs inside a Slurm allocation (an sbatch script or an salloc "
                          "shell): SLURM_JOB_ID is not set")
    step_tasks = (env.get("SLURM_STEP_NUM_TASKS") or "1").strip()
    if step_tasks.isdigit() and int(step_tasks) > 1:
        raise LaunchError(f"bpslaunch --slurm runs once per job, but this is task "
                          f"{env.get('SLURM_PROCID', '?')} of a job step with {step_tasks} tasks "
                          "(run it from the batch script or the salloc shell, not under srun)")
    nodelist = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip()
    if not nodelist:
        raise LaunchError("SLURM_JOB_NODELIST is not set: cannot tell the allocation's nodes")
    nodes = expand_nodelist(nodelist, run)
    if len(set(nodes)) != len(nodes):
        raise LaunchError(f"node list {nodelist!r} names a node twice")
    per_node = (env.get("SLURM_NTASKS_PER_NODE") or "").strip()
    source = "SLURM_NTASKS_PER_NODE"
    if per_node:
        counts = parse_tasks_per_node(per_node)
        counts = counts * len(nodes) if len(counts) == 1 else counts
    else:
        source = "SLURM_TASKS_PER_NODE"
        per_node = (env.get(source) or "").strip()
        if not per_node:
            raise LaunchError("neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set: "
                              "cannot tell how many workers run on each node")
        counts = parse_tasks_per_node(per_node)
    if len(counts) != len(nodes):
        raise LaunchError(f"{source}={per_node!r} describes {len(counts)} node(s) but the "
                          f"allocation has {len(nodes)} ({nodelist})")
    if len(set(counts)) != 1:
        detail = ", ".join(f"{n}: {c}" for n, c in zip(nodes, counts))
        raise LaunchError(f"the allocation has unequal tasks per node ({source}={per_node!r}; "
                          f"{detail}); byteps needs the same number of workers on every node: "
                          "allocate with --ntasks-per-node")
    return SlurmAllocation(job_id, tuple(nodes), counts[0],
                           (env.get("SLURMD_NODENAME") or "").strip() or None)


def choose_port(alloc: SlurmAllocation) -> int:
    """The scheduler's port when ``--port`` is not given.

    On the scheduler's node (the batch script's case) a port free there a moment ago; elsewhere
    (an ``salloc`` shell on a login node) ``PORT_BASE + job_id % PORT_SPAN``, the same for every
    launcher of the job and different for neighbouring jobs.
    """
    if alloc.this_node == alloc.nodes[0]:
        return find_free_port("")
    digits = re.sub(r"\D", "", alloc.job_id) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def step_name(role: str, job_id: str) -> str:
    """The Slurm step name of a role's step (``squeue -s`` shows it; cleanup looks for it)."""
    return f"byteps-{role}-{job_id}"


def build_slurm_plan(
    alloc: SlurmAllocation,
    command: Sequence[str],
    *,
    scheduler_host: str,
    port: int,
    servers_per_node: int = 1,
    base_env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    identity: JobIdentity | None = None,
    python: str | None = None,
    server_argv: Sequence[str] | None = None,
) -> list[ChildSpec]:
    """The three ``srun`` steps of a job on ``alloc``: scheduler, servers, workers.

    Args:
        alloc (SlurmAllocation): the allocation.
        command (Sequence[str]): the worker command, non-empty.
        scheduler_host (str): ``DMLC_PS_ROOT_URI``: the first node's address.
        port (int): the scheduler's port, 1..65535.
        servers_per_node (int): servers on every node, >= 1. Default 1.
        base_env (Mapping[str, str] | None): inherited environment (default ``os.environ``).
        extra_env (Mapping[str, str] | None): ``--env`` entries for every process.
        identity (JobIdentity | None): default :meth:`JobIdentity.fresh`.
        python (str | None): interpreter of the worker tasks' :mod:`byteps.launch.slurm_task`
            (default ``sys.executable``: the nodes share the launcher's file system).
        server_argv (Sequence[str] | None): command of the scheduler and server tasks (default
            :func:`byteps.launch.common.default_server_argv`).

    Returns:
        list[ChildSpec]: ``[scheduler, server, worker]``, each an ``srun`` command (rank None:
        srun's ``--label`` numbers the tasks: the server index, the global worker rank) with its
        environment (``srun`` passes it on to the tasks).

    Raises:
        LaunchError: empty command, ``servers_per_node < 1`` or a port out of range.
    """
    if not command:
        raise LaunchError("no COMMAND given (usage: bpslaunch --slurm [options] COMMAND ...)")
    if servers_per_node < 1:
        raise LaunchError(f"--servers-per-node must be >= 1, got {servers_per_node}")
    if not 1 <= port <= 65535:
        raise LaunchError(f"--port must be in 1..65535, got {port}")
    nodes, n, local = list(alloc.nodes), len(alloc.nodes), alloc.local_size
    try:
        spec = ClusterSpec(n, n * servers_per_node, local, scheduler_host, port,
                           identity or JobIdentity.fresh())
    except ClusterSpecError as exc:
        raise LaunchError(str(exc)) from None
    inherited = {**(os.environ if base_env is None else base_env), **(extra_env or {})}
    srv = list(server_argv) if server_argv is not None else default_server_argv()
    # srun also reads the allocation's SLURM_NTASKS & co. from this environment: the options
    # below override every one that shapes a step.
    cpus = inherited.get("SLURM_CPUS_PER_TASK", "").strip()
    pass_cpus = cpus.isdigit() and int(cpus) > 0 and not inherited.get("SRUN_CPUS_PER_TASK")

    def srun(role: str, nodelist: Sequence[str], per_node: int, argv: Sequence[str]) -> list[str]:
        out = ["srun", f"--job-name={step_name(role, spec.identity.job_id)}", "--overlap",
               f"--nodes={len(nodelist)}", f"--ntasks={len(nodelist) * per_node}",
               f"--ntasks-per-node={per_node}", f"--nodelist={','.join(nodelist)}",
               "--distribution=block", "--kill-on-bad-exit=1", "--quit-on-interrupt", "--label",
               "--export=ALL"]
        if role == "worker":
            if pass_cpus:  # srun >= 22.05 does not take the job's --cpus-per-task by itself
                out.append(f"--cpus-per-task={cpus}")
        else:  # the scheduler and servers fit however few CPUs the job has per node
            out += ["--overcommit", "--cpus-per-task=1"]
        return out + list(argv)

    # DMLC_INTERFACE (the same name on every node) is kept; DMLC_NODE_HOST cannot be.
    interface = inherited.get("DMLC_INTERFACE") or None

    def env_of(role: str, **worker) -> dict[str, str]:
        return role_env(spec, role, base=inherited, interface=interface, **worker)

    worker_argv = [python or sys.executable, "-m", "byteps.launch.slurm_task", "--", *command]
    return [
        ChildSpec("scheduler", None, srun("scheduler", nodes[:1], 1, srv), env_of("scheduler")),
        ChildSpec("server", None, srun("server", nodes, servers_per_node, srv), env_of("server")),
        # slurm_task replaces the id and local rank with the task's own
        ChildSpec("worker", None, srun("worker", nodes, local, worker_argv),
                  env_of("worker", worker_id=0, local_rank=0)),
    ]


class TaskFailureWatch:
    """A text stream for :func:`run_job`'s ``stderr`` that remembers srun's first task failure.

    Every write goes on to ``stream``. Lines ``[role] srun: error: NODE: task(s) IDS: WHAT``
    (srun's report of a task that failed) and ``bpslaunch: ...; stopping the job`` (run_job's
    first failure) are recorded.

    Attributes:
        first (tuple[str, str, str, str] | None): ``(role, node, task ids, what)`` of the first
            failed task, e.g. ``("worker", "n1", "1", "Exited with exit code 3")``.
        failed (bool): run_job reported a failure (not a stop by signal).
    """

    _TASK = re.compile(r"\[(\w+)\] srun: error: (\S+): tasks? ([\d,\-]+): (.+?)\s*$")

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.first: tuple[str, str, str, str] | None = None
        self.failed = False
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        with self._lock:
            for line in text.splitlines():
                m = self._TASK.match(line)
                if m and self.first is None:
                    self.first = (m.group(1), m.group(2), m.group(3), m.group(4))
                if line.startswith("bpslaunch: ") and line.endswith("; stopping the job"):
                    self.failed = True
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def describe(self) -> str | None:
        """``"worker rank 1 on node n1: Exited with exit code 3"`` (``"servers 0-1 on node n0:
        Killed"``, ``"scheduler on node n0: ..."``), or None."""
        if self.first is None:
            return None
        role, node, ids, what = self.first
        many = "," in ids or "-" in ids
        if role == "worker":  # task ids are the global ranks (block distribution)
            who = f"worker rank{'s' if many else ''} {ids}"
        elif role == "server":  # ... and the server indices
            who = f"server{'s' if many else ''} {ids}"
        else:
            who = role
        return f"{who} on node {node}: {what}"

    def exit_code(self) -> int | None:
        """The first failed task's own exit code, when srun reported one (else None)."""
        m = re.fullmatch(r"Exited with exit code (\d+)", self.first[3]) if self.first else None
        return int(m.group(1)) if m and int(m.group(1)) else None


def cancel_steps(job_id: str, names: Sequence[str], run: Runner) -> list[str]:
    """``scancel`` the steps of ``job_id`` named ``names`` that are still known to Slurm.

    A step outlives its ``srun`` only when srun was killed before the step ended (SIGKILL after
    the stop timeout); this makes sure nothing of the job keeps running. Returns the step ids
    cancelled; Slurm errors are ignored (the steps may end meanwhile).
    """
    try:
        out = run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
    except LaunchError:
        return []
    steps = [line.split()[0] for line in out.splitlines()
             if len(line.split()) == 2 and line.split()[1] in names]
    if steps:
        try:
            run(["scancel", "--quiet", *steps])
        except LaunchError:
            pass
    return steps


def run_slurm(
    command: Sequence[str],
    *,
    servers_per_node: int = 1,
    port: int | None = None,
    grace: float = 10.0,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    server_argv: Sequence[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Place the job on the allocation, run its steps, return bpslaunch's exit status.

    Args:
        command (Sequence[str]): the worker command.
        servers_per_node (int): servers on every node (``--servers-per-node``), >= 1.
        port (int | None): scheduler port (``--port``); default :func:`choose_port`.
        grace (float): seconds between the first failure and stopping the other steps.
        env (Mapping[str, str] | None): the launcher's environment (default ``os.environ``).
        extra_env (Mapping[str, str] | None): ``--env`` entries.
        server_argv (Sequence[str] | None): scheduler/server command (tests).
        stderr (IO[str] | None): where the launcher's and the steps' stderr go (default
            ``sys.stderr``).

    Returns:
        int: 0 when every worker succeeded; 130/143 when stopped by SIGINT/SIGTERM; after a
        failure the first failed task's exit code as srun reported it (else srun's status).

    Raises:
        LaunchError: no allocation, unequal tasks per node, bad options (bpslaunch exits 2).
    """
    parent = dict(os.environ if env is None else env)
    err = stderr or sys.stderr
    run = scontrol_runner(parent)
    alloc = read_allocation(parent, run)
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError(f"--port must be in 1..65535, got {port}")
    host = node_address(alloc.nodes[0], run)
    specs = build_slurm_plan(alloc, command, scheduler_host=host,
                             port=port if port is not None else choose_port(alloc),
                             servers_per_node=servers_per_node, base_env=parent,
                             extra_env=extra_env, server_argv=server_argv)
    env0 = specs[0].env
    print(f"bpslaunch: Slurm job {alloc.job_id}: {len(alloc.nodes)} node(s) "
          f"({','.join(alloc.nodes)}) x {alloc.local_size} worker(s), {servers_per_node} "
          f"server(s) per node, scheduler on {alloc.nodes[0]} at {env0['DMLC_PS_ROOT_URI']}:"
          f"{env0['DMLC_PS_ROOT_PORT']} (byteps job {env0['BYTEPS_JOB_ID']})", file=err,
          flush=True)
    watch = TaskFailureWatch(err)
    names = [step_name(role, env0["BYTEPS_JOB_ID"]) for role in ("scheduler", "server", "worker")]
    rc = run_job(specs, grace=grace, stderr=watch,
                 on_exit=lambda: cancel_steps(alloc.job_id, names, run))
    if rc and watch.failed:
        cause = watch.describe()
        if cause:
            print(f"bpslaunch: first failed task: {cause}", file=err, flush=True)
        return watch.exit_code() or rc
    return rc
