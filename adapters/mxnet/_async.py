"""Asynchronous training for MXNet (``BYTEPS_ENABLE_ASYNC=1``; docs/async.md): what
:class:`~byteps.mxnet.DistributedTrainer` does in asynchronous mode, and :func:`pull_parameters`.

A step: the parameters' first step (in this process) reads their initial value from the servers
(rank 0's, pushed by this very step on rank 0); the Gluon update then runs locally on the local
gradients (no gradient is reduced), each weight becomes its delta (after minus before), which is
push_pulled in place (summed, under ``"AsyncParam.<parameter name>"``), and the servers' answer,
the parameters' current value, is the new weight. Nothing waits for the other workers.
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import mxnet as mx

from byteps.sync import async_train

from . import ops

__all__ = ["AsyncWeights", "module_update", "pull_parameters"]


class AsyncWeights:
    """The asynchronous parameters ``(name, NDArray)`` of a trainer, pushed as
    ``"AsyncParam.<name>"`` (earlier parameters at higher priority)."""

    def __init__(self, named: Sequence[Tuple[str, mx.nd.NDArray]]):
        self.named: List[Tuple[str, mx.nd.NDArray]] = [
            (async_train.wire_name(n), w) for n, w in named]
        for wire, _w in self.named:
            ops.byteps_declare_tensor(wire)

    def _exchange(self, items) -> None:
        for i, (wire, w) in enumerate(items):
            ops.byteps_push_pull(w, name=wire, is_average=False, priority=-(i + 1))
        for _wire, w in items:
            w.wait_to_read()  # raises the operation's error, if any

    def pull(self, only_first: bool = False) -> None:
        """Overwrite the weights with the servers' value. A weight's first push_pull (in this
        process) offers its value as the initial one (local rank 0; the others push zeros);
        later ones push a zero delta (one of this worker's rounds) unless ``only_first``."""
        first = [(wire, w) for wire, w in self.named if async_train.pushes_initial_value(wire)]
        if first:
            if not async_train.contributes_initial_value():
                for _wire, w in first:
                    w[:] = 0
            self._exchange(first)
        if only_first:
            return
        rest = [(wire, w) for wire, w in self.named if all(wire != f for f, _ in first)]
        for _wire, w in rest:
            w[:] = 0
        self._exchange(rest)

    def step(self, local_update: Callable[[], None]) -> None:
        """One asynchronous step around ``local_update`` (the trainer's own update)."""
        self.pull(only_first=True)
        before = [w.copy() for _wire, w in self.named]
        local_update()
        for (_wire, w), old in zip(self.named, before):
            w -= old  # the weight's memory holds its delta ...
        self._exchange(self.named)  # ... and then the servers' value


def module_update(update: Callable, index, weight, grad, state) -> None:
    """The Module-API ``DistributedOptimizer``'s ``update`` in asynchronous mode (upstream's
    semantics): the wrapped ``update(index, weight, grad, state)`` locally, then weight ``i``'s
    delta exchanged for the servers' value under ``"AsyncParam.optimizer.weight_<i>"`` (its
    first update starts from the servers' initial value, rank 0's)."""
    indices = index if isinstance(index, (list, tuple)) else [index]
    weights = weight if isinstance(index, (list, tuple)) else [weight]
    named = [(f"optimizer.weight_{i}", w) for i, w in zip(indices, weights)]
    AsyncWeights(named).step(lambda: update(index, weight, grad, state))


def pull_parameters(trainer) -> None:
    """Read the servers' parameters into the weights of ``trainer`` (a
    :class:`~byteps.mxnet.DistributedTrainer` in asynchronous training,
    ``BYTEPS_ENABLE_ASYNC=1``), e.g. before saving a checkpoint or at the end of training.

    A weight's first push_pull in this process offers its value as the initial one (rank 0's is
    kept). Each call counts as one round of this worker for the staleness bound.

    Raises:
        UsageError: not in asynchronous mode.
        InvalidArgumentError: ``trainer`` is not a DistributedTrainer, or its parameters are not
            initialised yet.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    from byteps.errors import InvalidArgumentError

    async_train.require("pull_parameters")
    weights = getattr(trainer, "_bps_async_weights", None)
    if not callable(weights):
        raise InvalidArgumentError("pull_parameters: expects a byteps.mxnet.DistributedTrainer")
    weights().pull()
