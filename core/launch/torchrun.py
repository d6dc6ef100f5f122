"""Starting a byteps job from a torchrun-style environment, inside ``byteps.init()``.

``byteps.init()`` calls :func:`activate` before it starts the core. When the process has a
torchrun-style environment and no ``DMLC_*`` job description (:mod:`byteps.launch.torchrun_env`), it

1. maps the environment onto byteps' placement (:func:`byteps.launch.torchrun_env.placement_from_env`);
2. settles the job's identity: ``BYTEPS_JOB_ID`` (:func:`byteps.launch.torchrun_env.derive_job_id`
   unless exported) and the job secret (:func:`resolve_secret`);
3. in a distributed job, starts the node's server (local rank 0 of every node) and the
   scheduler (global rank 0) as children, ``python -m byteps.server`` with
   :func:`byteps.launch.contract.role_env`, their output prefixed ``[byteps server of node N] `` /
   ``[byteps scheduler] `` on this process's stderr; they die with this process
   (``PR_SET_PDEATHSIG``), and one that fails while the job runs is reported on stderr (the
   core fails the job's operations with ``PeerLostError``); a scheduler that exits before it
   listens fails ``init()`` at once;
4. puts the worker's ``DMLC_*``/``BYTEPS_*`` variables into ``os.environ`` for the core.

``byteps.shutdown()`` calls :func:`deactivate`: it waits for the children to end by themselves
(they do once every worker of the job has shut down), stops what is left, and gives
``os.environ`` its previous values back, so a later ``init()`` maps the environment again.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta

from ..errors import BytePSTimeoutError, InternalError, PeerLostError
from .contract import CONTRACT_VARS, ClusterSpec, JobIdentity, is_true, role_env
from .supervise import PrefixWriter, exit_code_of, make_preexec, start_pump
from .torchrun_env import (
    TorchrunEnvError,
    TorchrunPlacement,
    derive_job_id,
    is_torchrun_env,
    placement_from_env,
)

log = logging.getLogger("byteps.torchrun")

#: Seconds :func:`deactivate` waits for the scheduler and server to end by themselves.
STOP_WAIT = 10.0
#: Seconds between SIGTERM and SIGKILL when they have to be stopped.
TERM_WAIT = 3.0
#: Seconds ``init()`` waits for its scheduler to listen before it leaves the rest to the core.
SCHEDULER_START_WAIT = 10.0
#: Lines of a child's output kept for the error that reports its failure.
TAIL_LINES = 20

_stderr_lock = threading.Lock()


def _say(message: str) -> None:
    """One line on this process's stderr (shared with the children's prefixed output)."""
    with _stderr_lock:
        try:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def store_key(placement: TorchrunPlacement, generation: int = 0) -> str:
    """The key of the job secret in torchrun's store:
    ``byteps/<run id>/<restart>/<generation>/secret``; ``generation`` counts this process's
    earlier activations (an ``init()`` after ``shutdown()`` starts a new job: every rank counts
    alike)."""
    return f"byteps/{placement.run_id}/{placement.restart_count}/{generation}/secret"


def resolve_secret(placement: TorchrunPlacement, env: Mapping[str, str],
                   timeout: float, generation: int = 0) -> str:
    """The job secret every process of the job must share (``BYTEPS_SECRET``).

    In order: ``BYTEPS_SECRET`` from ``env`` (export the same value on every node); "" for a
    one-machine job (no connection is authenticated); in a process started by torchrun's agent
    (``TORCHELASTIC_USE_AGENT_STORE=True``), a fresh 64-hex secret that global rank 0 puts into
    torchrun's store at ``MASTER_ADDR:MASTER_PORT`` under :func:`store_key` and every other rank
    reads from there; "" when ``BYTEPS_ALLOW_UNAUTHENTICATED=1`` (the core warns).

    The store has no authentication of its own: whoever can connect to ``MASTER_PORT`` while the
    job runs can read the secret. It keeps other jobs' processes out, not an attacker on the
    job's network (who could as well disrupt torchrun's rendezvous); against that, export a
    ``BYTEPS_SECRET`` on every node.

    Raises:
        TorchrunEnvError: no secret and no way to share one (not torchrun's agent, or torch is
            not importable) without ``BYTEPS_ALLOW_UNAUTHENTICATED=1``.
        BytePSTimeoutError: the store did not answer, or rank 0 did not publish the secret,
            within ``timeout`` seconds.
    """
    given = env.get("BYTEPS_SECRET", "")
    if given or not placement.distributed:
        return given
    if is_true(env.get("TORCHELASTIC_USE_AGENT_STORE")) and placement.master_port:
        try:
            from torch.distributed import TCPStore
        except ImportError:
            TCPStore = None
        if TCPStore is not None:
            return _secret_through_store(TCPStore, placement, timeout, generation)
    if is_true(env.get("BYTEPS_ALLOW_UNAUTHENTICATED")):
        return ""
    raise TorchrunEnvError(
        f"rank {placement.rank}: BYTEPS_SECRET is not set and this process was not started by "
        "torchrun's agent (TORCHELASTIC_USE_AGENT_STORE), whose store byteps would share a "
        "fresh secret through: export the same BYTEPS_SECRET on every node (e.g. the output of "
        "`python -c 'import secrets; print(secrets.token_hex(32))'`), or set "
        "BYTEPS_ALLOW_UNAUTHENTICATED=1 to run without authentication")


def _secret_through_store(TCPStore, placement: TorchrunPlacement, timeout: float,
                          generation: int) -> str:
    where = f"{placement.master_addr}:{placement.master_port}"
    key = store_key(placement, generation)
    try:
        store = TCPStore(placement.master_addr, placement.master_port, is_master=False,
                         timeout=timedelta(seconds=timeout), wait_for_workers=False)
        if placement.rank == 0:
            store.set(key, secrets.token_hex(32))
        value = store.get(key).decode()
    except Exception as exc:  # torch raises RuntimeError / DistStoreError / DistNetworkError
        raise BytePSTimeoutError(
            f"rank {placement.rank}: could not {'publish' if placement.rank == 0 else 'read'} "
            f"the job secret in torchrun's store at {where} (key {key}) within {timeout:g} s: "
            f"{exc}. Export the same BYTEPS_SECRET on every node to do without the store"
        ) from exc
    finally:
        store = None  # closes the client connection
    return value


# ----------------------------------------------------------------------------------- children


class _TailWriter(PrefixWriter):
    """A :class:`PrefixWriter` that also keeps the last :data:`TAIL_LINES` lines."""

    def __init__(self, prefix: str, stream, lock: threading.Lock) -> None:
        super().__init__(prefix, stream, lock)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)

    def write_piece(self, piece: bytes) -> None:
        text = piece.decode("utf-8", errors="replace").rstrip("\r\n")
        if text:
            self.tail.append(text)
        super().write_piece(piece)


@dataclass
class _Child:
    label: str  # "scheduler", "server 1"
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    proc: subprocess.Popen | None = None
    writer: _TailWriter | None = None
    pumps: list[threading.Thread] = field(default_factory=list)
    reported: bool = False

    def describe(self) -> str:
        pid = self.proc.pid if self.proc else "?"
        return f"the byteps {self.label} (pid {pid}) this process started"

    def last_output(self) -> str:
        lines = list(self.writer.tail) if self.writer else []
        return ("; its last output: " + " | ".join(lines[-5:])) if lines else ""


class Services:
    """The scheduler and/or server one worker process runs for its node.

    They are spawned by a supervisor thread that lives until they are reaped (the parent of
    ``PR_SET_PDEATHSIG`` is the spawning *thread*: spawning from ``init()``'s caller would kill
    them when that thread ends). The supervisor reports a child that fails before
    :meth:`stop` on stderr, once.

    Args:
        children (list[_Child]): what to run.
        rank (int): this worker's global rank (for messages).
    """

    def __init__(self, children: list[_Child], rank: int) -> None:
        self.children = children
        self.rank = rank
        self._stopping = threading.Event()
        self._spawned = threading.Event()
        self._settled = threading.Event()  # start() has returned or raised
        self._spawn_error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def pids(self) -> list[int]:
        """The children's pids (those spawned)."""
        return [c.proc.pid for c in self.children if c.proc is not None]

    def start(self) -> None:
        """Spawn the children; with a scheduler among them, wait until it listens.

        Raises:
            InternalError: a child could not be spawned.
            PeerLostError: the scheduler exited before it listened (e.g. ``MASTER_ADDR`` is
                not an address of this host, or its port is taken); the message carries its
                exit code and last output.
        """
        self._thread = threading.Thread(target=self._supervise, name="byteps-torchrun-services",
                                        daemon=True)
        self._thread.start()
        self._spawned.wait()
        try:
            if self._spawn_error is not None:
                raise InternalError(f"rank {self.rank}: could not start the byteps scheduler/"
                                    f"server: {self._spawn_error}") from self._spawn_error
            for child in self.children:
                if child.label == "scheduler":
                    self._wait_listening(child)
        except BaseException:
            self._settled.set()
            self.stop(0)
            raise
        self._settled.set()

    def _spawn(self) -> None:
        preexec = make_preexec(os.getpid())
        for child in self.children:
            proc = subprocess.Popen(child.argv, env=child.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    preexec_fn=preexec, close_fds=True)
            child.proc = proc
            child.writer = _TailWriter(f"[byteps {child.label}] ", sys.stderr, _stderr_lock)
            child.pumps = [start_pump(proc.stdout, child.writer, f"byteps-{child.label}-out"),
                           start_pump(proc.stderr, child.writer, f"byteps-{child.label}-err")]
            log.info("rank %d started the byteps %s, pid %d", self.rank, child.label, proc.pid)

    def _supervise(self) -> None:
        try:
            self._spawn()
        except BaseException as exc:  # reported by start(); children spawned so far are stopped
            self._spawn_error = exc
        finally:
            self._spawned.set()
        # Failures are reported once start() is over (it reports its own) and until stop().
        while not self._settled.is_set() or self._report_failures():
            time.sleep(0.05)

    def _report_failures(self) -> bool:
        """Report children that failed since the last call; True while any is running."""
        running = False
        for child in self.children:
            code = child.proc.poll() if child.proc is not None else None
            running |= child.proc is not None and code is None
            if code and not child.reported and not self._stopping.is_set():
                child.reported = True
                self._say(f"byteps: rank {self.rank}: {child.describe()} {_exit_text(code)} "
                          f"while the job was running{child.last_output()}; the job's "
                          "operations fail with PeerLostError")
        return running

    def _say(self, message: str) -> None:
        _say(message)

    def _wait_listening(self, child: _Child) -> None:
        deadline = time.monotonic() + SCHEDULER_START_WAIT
        while time.monotonic() < deadline:
            code = child.proc.poll()
            if code is not None:
                for pump in child.pumps:  # its last words, for the message
                    pump.join(1.0)
                child.reported = True
                raise PeerLostError(
                    f"rank {self.rank}: {child.describe()} {_exit_text(code)} before it "
                    f"listened on {child.env.get('DMLC_PS_ROOT_URI')}:"
                    f"{child.env.get('DMLC_PS_ROOT_PORT')} (is MASTER_ADDR an address of "
                    f"this host, and is the port free?){child.last_output()}")
            listening = _listens(child.proc.pid)
            if listening is None or listening:
                return  # listening, or this system cannot tell: the core's timeouts apply
            time.sleep(0.05)

    def stop(self, wait_s: float = STOP_WAIT) -> None:
        """Let the children end by themselves for ``wait_s`` seconds, then SIGTERM, then
        SIGKILL after :data:`TERM_WAIT`; reap them and join the threads. Idempotent."""
        self._stopping.set()
        live = [c.proc for c in self.children if c.proc is not None]
        for action, seconds in ((None, wait_s), ("terminate", TERM_WAIT), ("kill", 5.0)):
            pending = [p for p in live if p.poll() is None]
            if not pending:
                break
            for proc in pending:
                if action:
                    getattr(proc, action)()
            deadline = time.monotonic() + max(seconds, 0.0)
            for proc in pending:
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    pass
        if self._thread is not None:
            self._thread.join(5.0)
        for child in self.children:
            for pump in child.pumps:
                pump.join(2.0)


def loopback_warning(master_addr: str) -> str | None:
    """A warning when ``master_addr`` resolves to a loopback address on this host (Debian's
    ``/etc/hosts`` maps the host's own name to 127.0.1.1): the scheduler binds the address its
    name resolves to, so the other machines could not reach it. None otherwise (also when the
    name does not resolve: the scheduler then says so)."""
    try:
        infos = socket.getaddrinfo(master_addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    addresses = sorted({info[4][0] for info in infos})
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                                for a in addresses):
        return None
    return (f"byteps: warning: MASTER_ADDR={master_addr} resolves to {', '.join(addresses)} on "
            "global rank 0's host: the scheduler listens there, where the other machines "
            "cannot reach it; give MASTER_ADDR as this host's network address (or fix its "
            "/etc/hosts entry)")


def _exit_text(code: int) -> str:
    text = f"exited with code {exit_code_of(code)}"
    return text + (f" (signal {-code})" if code < 0 else "")


def _listens(pid: int) -> bool | None:
    """Whether process ``pid`` holds a listening TCP socket (``/proc``); None if unknown."""
    listening = set()
    readable = False
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # TCP_LISTEN
                listening.add(fields[9])
    if not readable:
        return None
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            return True
    return False


# ------------------------------------------------------------------------------------ session


@dataclass
class _Session:
    placement: TorchrunPlacement
    saved: dict[str, str | None]
    services: Services | None


_session: _Session | None = None
_generation = 0  # activations of this process so far


def plan(placement: TorchrunPlacement, identity: JobIdentity, env: Mapping[str, str],
         server_argv: list[str] | None = None) -> tuple[dict[str, str], list[_Child]]:
    """The worker's contract variables and the children this process must start.

    Args:
        placement (TorchrunPlacement): this process's place.
        identity (JobIdentity): the job id and secret.
        env (Mapping[str, str]): the inherited environment (the children's base;
            ``DMLC_NODE_HOST`` / ``DMLC_INTERFACE`` from it are kept for every role).
        server_argv (list[str] | None): default ``[sys.executable, "-m", "byteps.server"]``.

    Returns:
        tuple[dict[str, str], list[_Child]]: the :data:`~byteps.launch.contract.CONTRACT_VARS` of
        this worker (without ``DMLC_PS_ROOT_URI``/``DMLC_PS_ROOT_PORT`` in a one-machine job,
        which has no scheduler), and the scheduler (global rank 0) and server (local rank 0)
        of a distributed job.
    """
    spec = ClusterSpec(placement.num_machines, placement.num_servers, placement.local_size,
                       placement.master_addr or "127.0.0.1", placement.scheduler_port or 1,
                       identity)
    where = {"node_host": env.get("DMLC_NODE_HOST") or None,
             "interface": env.get("DMLC_INTERFACE") or None}
    worker = role_env(spec, "worker", worker_id=placement.worker_id,
                      local_rank=placement.local_rank, **where)
    if not placement.distributed:
        del worker["DMLC_PS_ROOT_URI"], worker["DMLC_PS_ROOT_PORT"]
    argv = list(server_argv or [sys.executable, "-m", "byteps.server"])
    children = []
    if placement.starts_scheduler:
        children.append(_Child("scheduler", argv, role_env(spec, "scheduler", base=env,
                                                           **where)))
    if placement.starts_server:
        children.append(_Child(f"server of node {placement.worker_id}", argv,
                               role_env(spec, "server", base=env, **where)))
    return worker, children


def active() -> bool:
    """True between an :func:`activate` that applied the mapping and :func:`deactivate`."""
    return _session is not None


def service_pids() -> list[int]:
    """Pids of the scheduler/server this process started (empty when none)."""
    return _session.services.pids() if _session and _session.services else []


def activate(environ: MutableMapping[str, str] | None = None, timeout: float = 120.0,
             server_argv: list[str] | None = None) -> bool:
    """Apply the torchrun mapping to ``environ`` and start this node's services (module doc).

    Args:
        environ (MutableMapping[str, str] | None): default ``os.environ`` (the core reads it).
        timeout (float): seconds for torchrun's store (``BYTEPS_TIMEOUT``).
        server_argv (list[str] | None): the scheduler/server command (tests).

    Returns:
        bool: False (nothing done) when the environment is not torchrun-style or a previous
        activation is still active; True when applied.

    Raises:
        TorchrunEnvError, BytePSTimeoutError, InternalError, PeerLostError: see
            :func:`byteps.launch.torchrun_env.placement_from_env`, :func:`resolve_secret`,
            :meth:`Services.start`; ``environ`` is left as it was.
    """
    global _session, _generation
    env = os.environ if environ is None else environ
    if _session is not None or not is_torchrun_env(env):
        return False
    placement = placement_from_env(env)
    fallback = "" if placement.run_id or placement.master_port else f"p{os.getppid()}"
    identity = JobIdentity(env.get("BYTEPS_JOB_ID") or derive_job_id(placement, fallback),
                           resolve_secret(placement, env, timeout, _generation))
    worker, children = plan(placement, identity, dict(env), server_argv)
    if placement.starts_scheduler and placement.num_machines > 1:
        warning = loopback_warning(placement.master_addr)
        if warning:
            _say(warning)
    services = Services(children, placement.rank) if children else None
    if services is not None:
        services.start()
    saved = {name: env.get(name) for name in CONTRACT_VARS}
    for name in CONTRACT_VARS:
        if name in worker:
            env[name] = worker[name]
        else:
            env.pop(name, None)
    _session = _Session(placement, saved, services)
    _generation += 1
    log.info("rank %d: torchrun environment mapped: machine %d of %d, local rank %d of %d, "
             "%s", placement.rank, placement.worker_id, placement.num_machines,
             placement.local_rank, placement.local_size,
             f"scheduler {placement.master_addr}:{placement.scheduler_port}"
             if placement.distributed else "one machine (no servers)")
    return True


def deactivate(environ: MutableMapping[str, str] | None = None,
               wait_s: float = STOP_WAIT) -> None:
    """Stop this node's services (after up to ``wait_s`` seconds of letting them end by
    themselves) and restore the variables :func:`activate` set. No-op when not active."""
    global _session
    session, _session = _session, None
    if session is None:
        return
    env = os.environ if environ is None else environ
    try:
        if session.services is not None:
            session.services.stop(wait_s)
    finally:
        for name, value in session.saved.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
