"""Asynchronous training for PyTorch (``BYTEPS_ENABLE_ASYNC=1``; docs/async.md): what
``DistributedOptimizer.step()`` does in asynchronous mode, and :func:`pull_parameters`.

A step: the parameters' first step (in this process) pulls their initial value from the
servers (rank 0's, pushed by this very call on rank 0); then the wrapped optimizer steps
locally, each parameter becomes its delta (after minus before), the deltas are push_pulled
(summed, under ``"AsyncParam.<name>"``) and the servers' answer, the parameters' current value,
becomes the new parameter. Nothing waits for the other workers.
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import torch

from byteps.errors import InvalidArgumentError
from byteps.sync import async_train

from . import ops

__all__ = ["AsyncParameters", "pull_parameters"]


class AsyncParameters:
    """The asynchronous parameters of one model: ``(name, tensor)`` pairs, pushed as
    ``"AsyncParam.<name>"`` (earlier parameters at higher priority). Every rank must use the
    same names, in the same order."""

    def __init__(self, named: Sequence[Tuple[str, torch.Tensor]]):
        self.params: List[Tuple[str, torch.Tensor]] = [
            (async_train.wire_name(n), p) for n, p in named]
        names = [n for n, _ in self.params]
        if len(set(names)) != len(names):
            raise InvalidArgumentError("asynchronous parameters need unique names")
        for wire, _p in self.params:
            ops.declare(wire)

    def _exchange(self, bufs: List[torch.Tensor]) -> None:
        """push_pull every buffer in place (sum), all started before any is waited for."""
        handles, first_error = [], None
        for i, ((wire, _p), buf) in enumerate(zip(self.params, bufs)):
            handles.append(ops.push_pull_async_inplace(buf, average=False, name=wire,
                                                       priority=-(i + 1)))
        for h in handles:
            try:
                ops.synchronize(h)
            except Exception as e:  # keep draining, so no buffer is left to the core
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def pull(self) -> None:
        """Overwrite every parameter with the servers' value. A parameter's first push_pull
        (in this process) offers its value as the initial one (local rank 0; the others add
        zeros); later ones push a zero delta, which counts as one of this worker's rounds."""
        bufs = []
        for wire, p in self.params:
            initial = async_train.pushes_initial_value(wire)
            if initial and async_train.contributes_initial_value():
                bufs.append(p.detach().clone())
            else:
                bufs.append(torch.zeros_like(p.detach()))
        self._exchange(bufs)
        with torch.no_grad():
            for (_wire, p), buf in zip(self.params, bufs):
                p.copy_(buf)

    def step(self, local_step: Callable[[], object]) -> object:
        """One asynchronous step around ``local_step`` (the wrapped optimizer's ``step``);
        returns what it returns."""
        if any(async_train.pushes_initial_value(w) for w, _p in self.params):
            self.pull()  # start from the servers' parameters (rank 0's)
        with torch.no_grad():
            before = [p.detach().clone() for _w, p in self.params]
        result = local_step()
        with torch.no_grad():
            deltas = []
            for (_wire, p), old in zip(self.params, before):
                deltas.append(p.detach().sub_(old))  # the parameter's storage holds its delta
        self._exchange(deltas)  # ... and then the servers' value
        return result


def pull_parameters(params) -> None:
    """Read the servers' parameters into ``params`` in place (asynchronous training,
    ``BYTEPS_ENABLE_ASYNC=1``): e.g. before saving a checkpoint, or at the end of training.

    Args:
        params: a ``DistributedOptimizer`` in asynchronous mode (its parameters), or
            ``model.named_parameters()`` / a list of ``(name, tensor)`` tuples / a dict
            ``name -> tensor`` with the names the optimizer was given. Tensors are overwritten
            in place with their current value on the servers (float32 etc., same shape).

    A name's first push_pull in this process offers the tensor's value as the initial one (rank
    0's is kept), so calling it before training makes every worker start from rank 0's
    parameters. Each call counts as one round of this worker for the staleness bound. Other
    workers are not waited for.

    Raises:
        UsageError: not in asynchronous mode.
        InvalidArgumentError: duplicate names.
        byteps.errors.NotInitializedError: before ``init()``.
        byteps.errors.PeerLostError, BytePSTimeoutError: a server is gone / no answer within
            ``BYTEPS_TIMEOUT``.
    """
    async_train.require("pull_parameters")
    holder = getattr(params, "_bps_async_params", None)
    if holder is not None:
        holder.pull()
        return
    if isinstance(params, dict):
        named = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        named = [(str(n), t) for n, t in params]
    AsyncParameters(named).pull()
