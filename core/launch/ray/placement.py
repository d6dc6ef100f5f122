"""The placement plan of :mod:`byteps.ray`: pure functions, no Ray import (unit-testable anywhere).

:class:`byteps.ray.RayExecutor` asks Ray for one placement-group bundle per worker
(:func:`worker_bundles`), learns which Ray node each worker actor landed on, and turns that into
byteps' contract (:mod:`byteps.launch.contract`) here:

* worker machines (:func:`plan_machines`): the workers on one Ray node form one worker machine
  (``BYTEPS_LOCAL_SIZE`` = their number; they reduce through shared memory first, as the paper's
  machines do) when every node hosting workers holds the same number of them, because byteps
  needs one local size for the whole job; otherwise every worker is a machine of its own
  (local size 1; workers on one node then talk to the servers separately);
* servers (:func:`place_servers`): by default one per Ray node hosting workers, on that node (the
  paper's colocated layout); ``num_servers`` given explicitly: round-robin over those nodes;
* the scheduler: on the node of worker machine 0.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import InvalidArgumentError
from ..contract import is_true

#: Ray placement-group strategies accepted for the workers' bundles.
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _positive(value, what: str, integer: bool) -> None:
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        raise InvalidArgumentError(
            f"RayExecutor: {what} must be a positive {'integer' if integer else 'number'}, "
            f"got {value!r}")


def check_options(num_workers, num_servers, cpus_per_worker, use_gpu, gpus_per_worker,
                  placement_strategy, timeout_s=100.0) -> None:
    """Validate :class:`byteps.ray.RayExecutor`'s arguments.

    Raises:
        byteps.errors.InvalidArgumentError: ``num_workers`` not an integer >= 1,
            ``num_servers`` neither ``None`` nor an integer >= 1, ``cpus_per_worker`` or
            ``gpus_per_worker`` not a number > 0, ``gpus_per_worker`` without ``use_gpu``, or an
            unknown ``placement_strategy`` (one of :data:`STRATEGIES`), ``timeout_s`` not a
            number > 0.
    """
    _positive(num_workers, "num_workers", integer=True)
    if num_servers is not None:
        _positive(num_servers, "num_servers", integer=True)
    _positive(cpus_per_worker, "cpus_per_worker", integer=False)
    if gpus_per_worker is not None:
        if not use_gpu:
            raise InvalidArgumentError("RayExecutor: gpus_per_worker is set but use_gpu is False")
        _positive(gpus_per_worker, "gpus_per_worker", integer=False)
    if placement_strategy not in STRATEGIES:
        raise InvalidArgumentError(f"RayExecutor: placement_strategy must be one of "
                                   f"{', '.join(STRATEGIES)}, got {placement_strategy!r}")
    _positive(timeout_s, "timeout_s", integer=False)


def worker_bundles(num_workers: int, cpus_per_worker: float = 1, use_gpu: bool = False,
                   gpus_per_worker: float | None = None) -> list[dict[str, float]]:
    """The placement-group bundles of the workers: one per worker.

    Args:
        num_workers (int): worker processes (Ray actors), >= 1.
        cpus_per_worker (float): Ray ``CPU`` resource of each, > 0. Default 1.
        use_gpu (bool): reserve GPUs too. Default False.
        gpus_per_worker (float | None): Ray ``GPU`` resource of each when ``use_gpu``
            (default 1).

    Returns:
        list[dict[str, float]]: ``[{"CPU": cpus_per_worker}]`` (plus ``"GPU"``) per worker.
    """
    bundle: dict[str, float] = {"CPU": cpus_per_worker}
    if use_gpu:
        bundle["GPU"] = 1 if gpus_per_worker is None else gpus_per_worker
    return [dict(bundle) for _ in range(num_workers)]


@dataclass(frozen=True)
class MachinePlan:
    """Worker machines made of worker actors.

    Attributes:
        local_size (int): workers per machine (``BYTEPS_LOCAL_SIZE``).
        num_machines (int): worker machines (``DMLC_NUM_WORKER``).
        slots (tuple[tuple[int, int], ...]): ``(worker_id, local_rank)`` of actor ``i``.
        nodes (tuple[str, ...]): the Ray node id of each worker machine's node, by worker_id
            (a node repeats when it hosts several machines of local size 1).
        worker_nodes (tuple[str, ...]): the distinct nodes hosting workers, in the order of
            their first worker actor.
    """

    local_size: int
    num_machines: int
    slots: tuple
    nodes: tuple
    worker_nodes: tuple

    def rank(self, actor: int) -> int:
        """Global rank of actor ``actor`` (``worker_id * local_size + local_rank``)."""
        worker_id, local_rank = self.slots[actor]
        return worker_id * self.local_size + local_rank


def plan_machines(actor_nodes: Sequence[str]) -> MachinePlan:
    """Group worker actors into worker machines by the Ray node they run on (module docstring).

    Args:
        actor_nodes (Sequence[str]): the node id of each worker actor, by actor index (the
            placement-group bundle index); non-empty.

    Returns:
        MachinePlan: machines numbered in the order of their first actor; within a machine,
        local ranks in actor order.

    Raises:
        byteps.errors.InvalidArgumentError: ``actor_nodes`` is empty.
    """
    if not actor_nodes:
        raise InvalidArgumentError("plan_machines: no worker actors")
    by_node: dict[str, list[int]] = {}
    for actor, node in enumerate(actor_nodes):
        by_node.setdefault(node, []).append(actor)
    counts = {len(actors) for actors in by_node.values()}
    worker_nodes = tuple(by_node)
    if len(counts) == 1:
        local_size = counts.pop()
        slots: list = [None] * len(actor_nodes)
        for worker_id, actors in enumerate(by_node.values()):
            for local_rank, actor in enumerate(actors):
                slots[actor] = (worker_id, local_rank)
        return MachinePlan(local_size, len(by_node), tuple(slots), worker_nodes, worker_nodes)
    return MachinePlan(1, len(actor_nodes), tuple((i, 0) for i in range(len(actor_nodes))),
                       tuple(actor_nodes), worker_nodes)


def place_servers(num_servers: int | None, worker_nodes: Sequence[str]) -> list[str]:
    """The node of every server.

    Args:
        num_servers (int | None): servers; ``None``: one per node in ``worker_nodes``.
        worker_nodes (Sequence[str]): the distinct nodes hosting workers (non-empty).

    Returns:
        list[str]: node ids, server ``s`` on ``worker_nodes[s % len(worker_nodes)]``.
    """
    count = len(worker_nodes) if num_servers is None else num_servers
    return [worker_nodes[s % len(worker_nodes)] for s in range(count)]


def is_distributed(plan: MachinePlan, env: Mapping[str, str]) -> bool:
    """A job with servers: more than one worker machine, or ``BYTEPS_FORCE_DISTRIBUTED`` true in
    ``env`` (as ``bpslaunch``'s local mode decides)."""
    return plan.num_machines > 1 or is_true(env.get("BYTEPS_FORCE_DISTRIBUTED"))
