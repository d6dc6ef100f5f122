"""byteps on a Ray cluster: :class:`RayExecutor`, in the shape of Horovod's ``horovod.ray``.

::

    import ray
    from byteps.ray import RayExecutor

    ray.init(address="auto")              # or any running cluster; Ray starts one otherwise

    def train(epochs):
        import byteps.torch as bps        # the worker's environment is set before fn runs
        bps.init()
        ...
        return bps.rank()

    with RayExecutor(num_workers=4, cpus_per_worker=2) as ex:
        print(ex.run(train, args=(5,)))   # [0, 1, 2, 3]: one value per worker, by rank

Layout (:mod:`byteps.launch.ray.placement` has the rules): every worker is a Ray actor holding one
placement-group bundle (``placement_strategy``, default ``PACK``); the workers on one node form
one worker machine when every node holds as many (otherwise each is its own machine); one server
per node hosting workers, colocated; the scheduler on worker machine 0's node, on a port its
actor finds free there. Servers and scheduler are actors too (0 CPUs reserved), each running
``python -m byteps.server`` as a child process with its role's environment
(:func:`byteps.launch.contract.role_env`); the child dies with its actor (``PR_SET_PDEATHSIG``).
A one-machine job (one worker, or all workers packed as one machine) has no scheduler and no
servers unless ``BYTEPS_FORCE_DISTRIBUTED=1``.

Each :meth:`RayExecutor.run` is a fresh byteps job (new job id, secret and scheduler port): the
servers are started, every worker actor sets its ``DMLC_*``/``BYTEPS_*`` environment and then
calls ``fn``; after ``fn`` returns, byteps is shut down in the worker if ``fn`` left it running.
Byteps must be importable on every node (installed in the workers' Python, as for Horovod).

Requires Ray (``pip install 'byteps[engines]'``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

try:
    import ray
except ImportError as _missing:
    raise ImportError("byteps.ray needs Ray, which is not installed: pip install "
                      "'byteps[engines]' (or pip install ray)") from _missing
if not callable(getattr(ray, "remote", None)):  # a local file or directory named ray shadows it
    raise ImportError(f"byteps.ray: 'import ray' found {getattr(ray, '__file__', ray)!r}, which "
                      "is not the Ray package (a file or directory named ray on sys.path?)")
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from ...errors import (
    BytePSError,
    BytePSTimeoutError,
    InvalidTypeError,
    JobFailedError,
    UsageError,
)
from ..contract import CONTRACT_VARS, ClusterSpec, JobIdentity
from .actors import TERM_GRACE_S as _TERM_GRACE_S
from .actors import ServiceActor as _ServiceActor
from .actors import WorkerActor as _WorkerActor
from .placement import (
    check_options,
    is_distributed,
    place_servers,
    plan_machines,
    worker_bundles,
)

__all__ = ["RayExecutor"]

_log = logging.getLogger("byteps.ray")

#: Seconds between checks of the servers' and scheduler's processes while a run is in flight.
_POLL_S = 0.5
#: After the first failure, seconds to collect failures arriving with it (the root cause, e.g. a
#: killed worker, is preferred over the errors it causes on the other workers).
_CAUSE_WINDOW_S = 0.5
#: After a failure, seconds the other workers get to return (their servers are stopped, so they
#: fail fast with PeerLostError) before their actors are killed.
_ABORT_GRACE_S = 10.0
#: After every worker returned, seconds the servers and scheduler get to exit by themselves.
_EXIT_GRACE_S = 5.0


def _forwarded_env(extra_env_vars: Optional[Mapping[str, str]]) -> dict[str, str]:
    """The driver's ``BYTEPS_*`` knobs (not the job description) plus ``extra_env_vars``."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith("BYTEPS_") and k not in CONTRACT_VARS}
    for key, value in (extra_env_vars or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidTypeError(f"RayExecutor.start: extra_env_vars must map str to str, got "
                                   f"{key!r}: {value!r}")
        env[key] = value
    return env


class RayExecutor:
    """A byteps job on Ray actors: start once, run functions on every worker, shut down.

    Args:
        num_workers (int): worker processes (one Ray actor each), >= 1.
        num_servers (int | None): servers; default one per Ray node hosting workers, on that
            node (the paper's colocated layout); given: placed round-robin over those nodes.
            Ignored (no servers) for a one-machine job.
        cpus_per_worker (float): Ray ``CPU`` resource each worker reserves, > 0. Default 1.
        use_gpu (bool): each worker also reserves ``gpus_per_worker`` Ray ``GPU`` resources and
            sees them as ``CUDA_VISIBLE_DEVICES``. Default False.
        gpus_per_worker (float | None): default 1 when ``use_gpu``; only with ``use_gpu``.
        placement_strategy (str): Ray placement-group strategy of the workers' bundles:
            ``"PACK"`` (default, as Horovod: few nodes, so workers share machines and reduce
            locally first), ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"`` (one worker
            per node).
        timeout_s (float): seconds :meth:`start` waits for the placement group and the actors,
            and :meth:`run` for the servers to start. Default 100.

    Raises:
        byteps.errors.InvalidArgumentError: an argument out of range (the message names it).

    Servers and scheduler reserve no Ray resources: they run beside the workers, as in
    ``bpslaunch``. Every process gets the driver's ``BYTEPS_*`` variables and ``extra_env_vars``
    of :meth:`start`. Usable as a context manager (``start()`` on entry, ``shutdown()`` on exit).
    """

    def __init__(self, num_workers: int, num_servers: Optional[int] = None,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, placement_strategy: str = "PACK",
                 timeout_s: float = 100.0) -> None:
        check_options(num_workers, num_servers, cpus_per_worker, use_gpu, gpus_per_worker,
                      placement_strategy, timeout_s)
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = bool(use_gpu)
        self.gpus_per_worker = (1 if gpus_per_worker is None else gpus_per_worker) \
            if self.use_gpu else 0
        self.placement_strategy = placement_strategy
        self.timeout_s = float(timeout_s)
        self._reset()

    def _reset(self) -> None:
        self._pg = None
        self._workers: list = []  # actor handles, by actor index
        self._worker_info: list = []  # (ip, node id, pid), by actor index
        self._plan = None
        self._services: list = []  # (label, role, index, actor handle): scheduler, servers
        self._service_info: dict = {}  # label -> (ip, node id, pid)
        self._children: dict = {}  # label -> pid of the current byteps.server child
        self._env: dict = {}
        self._distributed = False
        self._failed: Optional[str] = None

    # ----------------------------------------------------------------------------------- setup

    def worker_bundles(self) -> list[dict[str, float]]:
        """The placement-group bundles :meth:`start` requests (one per worker)."""
        return worker_bundles(self.num_workers, self.cpus_per_worker, self.use_gpu,
                              self.gpus_per_worker if self.use_gpu else None)

    def start(self, extra_env_vars: Optional[Mapping[str, str]] = None) -> None:
        """Reserve the workers' resources and create every actor.

        Args:
            extra_env_vars (Mapping[str, str] | None): added to every process's environment
                (workers, servers, scheduler), e.g. ``{"BYTEPS_TIMEOUT": "60"}``.

        Raises:
            byteps.errors.UsageError: already started.
            byteps.errors.InvalidTypeError: ``extra_env_vars`` holds a key or value that is not
                a ``str``.
            byteps.errors.BytePSTimeoutError: the cluster cannot hold the placement group or the
                actors did not start within ``timeout_s`` (the message gives the request and
                the cluster's free resources).
            byteps.errors.JobFailedError: an actor failed to start (e.g. byteps is not
                importable on its node: the message ends with the remote error).

        Whatever fails, the actors and placement group created so far are released.
        """
        if self._workers:
            raise UsageError("RayExecutor.start(): already started (call shutdown() first)")
        env = _forwarded_env(extra_env_vars)
        try:
            self._start(env)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, env: dict[str, str]) -> None:
        self._env = env
        bundles = self.worker_bundles()
        self._pg = placement_group(bundles, strategy=self.placement_strategy)
        ready, _ = ray.wait([self._pg.ready()], timeout=self.timeout_s)
        if not ready:
            raise BytePSTimeoutError(
                f"RayExecutor.start: Ray could not reserve {len(bundles)} x {bundles[0]} "
                f"({self.placement_strategy}) within {self.timeout_s:g} s; the cluster has "
                f"{ray.available_resources()} free of {ray.cluster_resources()}")
        self._workers = [
            _WorkerActor.options(
                num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=i)).remote(i)
            for i in range(self.num_workers)]
        self._worker_info = self._get([w.node.remote() for w in self._workers], "worker actors")
        self._plan = plan_machines([node for _, node, _ in self._worker_info])
        self._distributed = is_distributed(self._plan, env)
        if not self._distributed:
            return

        def service(role: str, index: Optional[int], node: str):
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            return _ServiceActor.options(num_cpus=0, scheduling_strategy=strategy).remote(
                role, index)

        self._services = [("scheduler", "scheduler", None,
                           service("scheduler", None, self._plan.nodes[0]))]
        for s, node in enumerate(place_servers(self.num_servers, self._plan.worker_nodes)):
            self._services.append((f"server {s}", "server", s, service("server", s, node)))
        infos = self._get([a.node.remote() for *_, a in self._services], "server actors")
        self._service_info = {label: info for (label, *_), info in zip(self._services, infos)}

    def _get(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except GetTimeoutError:
            raise BytePSTimeoutError(
                f"RayExecutor: the {what} did not answer within {self.timeout_s:g} s (cluster "
                f"resources free: {ray.available_resources()})") from None
        except RayError as err:  # an actor died, or failed to start (e.g. no byteps there)
            raise JobFailedError(f"byteps.ray: one of the {what} failed: {_summary(err)}",
                                 role="worker" if what.startswith("worker") else None) from err

    def __enter__(self) -> RayExecutor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------------------------- run

    @property
    def workers(self) -> list:
        """The workers' Ray actor handles, by global rank (empty before :meth:`start`)."""
        if not self._workers:
            return []
        return [self._workers[a] for a in sorted(range(self.num_workers), key=self._plan.rank)]

    @property
    def local_size(self) -> int:
        """Workers per worker machine (``BYTEPS_LOCAL_SIZE``); known after :meth:`start`."""
        self._require_started("local_size")
        return self._plan.local_size

    def processes(self) -> list[dict[str, Any]]:
        """Every actor of the job: ``{"role", "rank", "node_ip", "node_id", "pid"}`` (workers by
        rank, then the scheduler and servers, whose current ``python -m byteps.server`` child
        is ``"child_pid"``, ``None`` between runs)."""
        self._require_started("processes")
        out = []
        for actor in sorted(range(self.num_workers), key=self._plan.rank):
            ip, node, pid = self._worker_info[actor]
            out.append({"role": "worker", "rank": self._plan.rank(actor), "node_ip": ip,
                        "node_id": node, "pid": pid})
        for label, role, index, _ in self._services:
            ip, node, pid = self._service_info[label]
            out.append({"role": role, "rank": index, "node_ip": ip, "node_id": node,
                        "pid": pid, "child_pid": self._children.get(label)})
        return out

    def _require_started(self, what: str) -> None:
        if not self._workers:
            raise UsageError(f"RayExecutor.{what}: the executor is not started (call start() "
                             "first, or use it as a context manager: with RayExecutor(...) as "
                             "ex: ex.run(fn))")

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Mapping] = None) -> list:
        """Run ``fn(*args, **kwargs)`` on every worker as one byteps job.

        ``fn`` is shipped by Ray (cloudpickle); it runs in the worker actor with ``DMLC_*`` /
        ``BYTEPS_*`` set, so it calls ``byteps.<framework>.init()`` itself.

        Args:
            fn (Callable): the function.
            args (Sequence): positional arguments, the same on every worker. Default ``()``.
            kwargs (Mapping | None): keyword arguments. Default none.

        Returns:
            list: ``fn``'s return values, index = global rank.

        Raises:
            byteps.errors.UsageError: not started, or an earlier run failed (shut down and start
                again).
            byteps.errors.InvalidTypeError: ``fn`` is not callable.
            byteps.errors.JobFailedError: a worker died or ``fn`` raised on it, or a server or
                the scheduler exited non-zero or its actor died. Names the root cause, in this
                order: a dead worker; a server or the scheduler killed by a signal or whose
                actor died; an exception of ``fn`` that is not a byteps error; a server or the
                scheduler that exited non-zero; a byteps error of ``fn`` (what the others raise
                when a peer fails); the lowest rank (the scheduler before server 0) first. ``rank``, ``role`` and ``cause`` (``fn``'s exception)
                are attributes. The other workers are stopped (their actors killed if they do
                not return within 10 s); the executor must be shut down and started again.
            byteps.errors.BytePSTimeoutError: the servers did not start within ``timeout_s``.
        """
        self._require_started("run")
        if self._failed:
            raise UsageError(f"RayExecutor.run: an earlier run failed ({self._failed}); call "
                             "shutdown() and start() again")
        if not callable(fn):
            raise InvalidTypeError(f"RayExecutor.run: fn must be callable, got {type(fn)}")
        spec = self._fresh_job()
        pending = {}
        for actor, worker in enumerate(self._workers):
            worker_id, local_rank = self._plan.slots[actor]
            ref = worker.execute.remote(fn, tuple(args), dict(kwargs or {}), spec, worker_id,
                                        local_rank, self._env)
            pending[ref] = actor
        results: dict[int, Any] = {}
        try:
            failures = self._supervise(pending, results)
        except BaseException:  # e.g. KeyboardInterrupt: the workers still run; shutdown() ends
            self._failed = "interrupted"
            raise
        if failures:
            self._abort(pending)
            raise self._error(failures)
        self._finish_services()
        return [results[rank] for rank in range(self.num_workers)]

    def _fresh_job(self) -> ClusterSpec:
        """A new job identity and scheduler port; the servers and scheduler started for it."""
        if self._distributed:
            scheduler = self._services[0][3]
            host = self._service_info["scheduler"][0]
            port = self._get([scheduler.free_port.remote()], "scheduler actor")[0]
        else:
            host = self._worker_info[0][0]
            port = self._get([self._workers[0].free_port.remote()], "worker actors")[0]
        spec = ClusterSpec(self._plan.num_machines, len(self._services) - 1 if self._services
                           else 0, self._plan.local_size, host, port, JobIdentity.fresh())
        if self._services:
            pids = self._get([a.spawn.remote(spec, self._env) for *_, a in self._services],
                             "servers and scheduler")
            self._children = {label: pid for (label, *_), pid in zip(self._services, pids)}
        return spec

    def _supervise(self, pending: dict, results: dict) -> list:
        """Wait for the workers; return the failures (empty when every worker returned)."""
        failures: list = []
        while pending and not failures:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
            failures += self._collect(ready, pending, results)
            if not failures:
                failures += self._service_failures()
        if failures:  # the root cause may show just after its consequences
            if pending:
                ready, _ = ray.wait(list(pending), num_returns=len(pending),
                                    timeout=_CAUSE_WINDOW_S)
                failures += self._collect(ready, pending, results)
            else:
                time.sleep(_CAUSE_WINDOW_S)
            if not any(f[3] != "worker" for f in failures):
                failures += self._service_failures()
        return failures

    def _collect(self, ready: list, pending: dict, results: dict) -> list:
        failures = []
        for ref in ready:
            actor = pending.pop(ref)
            rank = self._plan.rank(actor)
            try:
                results[rank] = ray.get(ref)
            except RayTaskError as err:
                failures.append(self._raised(actor, rank, err))
            except RayError as err:  # the actor died (killed, crashed, its node lost)
                failures.append((0, rank, self._where(actor) + f" died: {_summary(err)}",
                                 "worker", None))
        return failures

    def _where(self, actor: int) -> str:
        ip, _, pid = self._worker_info[actor]
        return f"worker rank {self._plan.rank(actor)} (node {ip}, pid {pid})"

    def _raised(self, actor: int, rank: int, err: RayTaskError) -> tuple:
        cause = getattr(err, "cause", None)
        if cause is None:
            cause = err
        text = f"{type(cause).__name__}: {_first_line(cause)}"
        # A worker that fails makes the others fail in byteps (PeerLostError, a timeout, a
        # MismatchError naming the rank that left): their errors come second to its own.
        order = 4 if isinstance(cause, BytePSError) else 2
        return (order, rank, self._where(actor) + f" raised {text}", "worker", cause)

    def _service_failures(self) -> list:
        failures = []
        polls = [(label, role, index, actor.poll.remote())
                 for label, role, index, actor in self._services]
        for label, role, index, ref in polls:
            ip, _, pid = self._service_info[label]
            try:
                code = ray.get(ref, timeout=self.timeout_s)
            except RayError as err:  # its actor died (killed, its node lost) or hangs
                order, text = 1, f"{label} (node {ip}, actor pid {pid}) died: {_summary(err)}"
            else:
                if not code:  # None (running) and 0 are not failures
                    continue
                # killed by a signal (128 + n): a cause; exit status 1 is also how a server
                # or the scheduler ends when another process of the job failed
                order = 1 if code > 128 else 3
                text = (f"{label} (node {ip}, pid {self._children.get(label)}) exited with "
                        f"code {code}")
            failures.append((order, -1 if index is None else index, text, role, None))
        return failures

    def _error(self, failures: list) -> JobFailedError:
        failures.sort(key=lambda f: (f[0], f[1]))
        _, rank, text, role, cause = failures[0]
        others = [f"{f[3]} {f[1]}" if f[1] >= 0 else f[3] for f in failures[1:]]
        also = f" (also failed: {', '.join(others)})" if others else ""
        self._failed = text
        err = JobFailedError(f"byteps.ray: {text}{also}", role=role,
                             rank=rank if rank >= 0 else None, cause=cause)
        err.__cause__ = cause
        return err

    def _abort(self, pending: dict) -> None:
        """Stop the servers (the remaining workers then fail fast), then kill stragglers."""
        self._stop_services()
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_ABORT_GRACE_S)
            for ref in ready:
                pending.pop(ref)
        for actor in pending.values():
            _log.warning("byteps.ray: %s did not return after the job failed; killing its actor",
                         self._where(actor))
            ray.kill(self._workers[actor], no_restart=True)

    def _finish_services(self) -> None:
        """Give the servers and scheduler a moment to exit after the workers, then stop them."""
        deadline = time.monotonic() + _EXIT_GRACE_S
        while self._services and time.monotonic() < deadline:
            try:
                codes = self._get([a.poll.remote() for *_, a in self._services], "servers")
            except BytePSError as err:  # the workers' results stand; report and stop the rest
                _log.warning("byteps.ray: after the workers finished: %s", err)
                break
            if all(code is not None for code in codes):
                for (label, *_), code in zip(self._services, codes):
                    if code:
                        _log.warning("byteps.ray: %s exited with code %s after the workers "
                                     "finished", label, code)
                break
            time.sleep(0.1)
        self._stop_services()

    def _stop_services(self) -> None:
        refs = [a.stop.remote() for *_, a in self._services]
        try:
            ray.get(refs, timeout=_TERM_GRACE_S + 10)
        except (RayActorError, GetTimeoutError) as err:
            _log.warning("byteps.ray: stopping the servers: %s", _first_line(err))
        self._children = {}

    # -------------------------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Stop the servers and scheduler, kill every actor, release the placement group.

        Safe to call twice, before :meth:`start` and after a failed :meth:`run`. Returns once Ray
        reports every actor dead (at most ``timeout_s``); each ``python -m byteps.server`` is
        stopped and reaped by its actor first, and dies with it in any case.
        """
        actors = [a for *_, a in self._services] + list(self._workers)
        if self._services:
            self._stop_services()
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except (RayActorError, ValueError):
                pass
        if actors:  # a call on a killed actor fails once Ray has seen it die
            probes = [a.node.remote() for a in actors]
            deadline = time.monotonic() + self.timeout_s
            for probe in probes:
                try:
                    ray.get(probe, timeout=max(0.0, deadline - time.monotonic()))
                except (RayActorError, GetTimeoutError):
                    pass
        if self._pg is not None:
            remove_placement_group(self._pg)
        self._reset()


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _summary(err: BaseException) -> str:
    """The first line of ``err``'s text, and its last when they differ (Ray's actor errors put
    the remote exception, e.g. ``ModuleNotFoundError: No module named 'byteps'``, last)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[0] if len(lines) == 1 or lines[-1] == lines[0] else f"{lines[0]} ... {lines[-1]}"
