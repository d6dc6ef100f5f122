"""Asynchronous training, the framework-free part (``BYTEPS_ENABLE_ASYNC=1``; docs/async.md).

The servers keep every tensor whose name starts with :data:`PREFIX` ("asynchronous
parameters"). A worker's first push_pull of such a name (in this process, since ``init()``)
carries its initial value: the servers keep rank 0's (the lowest worker machine that is still
in the job) and answer every worker with it. Every later push_pull carries a delta (the
parameter after the local optimizer step minus before), which the servers add at once, and
answers with the parameters' current value, without waiting for the other workers (unless
``BYTEPS_ASYNC_MAX_STALENESS`` holds a worker that is too far ahead). They are summed, never
averaged. The adapters' ``DistributedOptimizer`` (and MXNet's ``DistributedTrainer``) use this
module to decide what to push; ``pull_parameters`` reads the servers' parameters.
"""

from __future__ import annotations

from byteps import _core
from byteps.errors import UsageError

__all__ = ["PREFIX", "enabled", "max_staleness", "wire_name", "pushes_initial_value",
           "contributes_initial_value", "require"]

#: Names starting with this are asynchronous parameters when ``BYTEPS_ENABLE_ASYNC=1`` (the
#: core's ``kAsyncParamPrefix``); every other name stays synchronous (metrics, broadcasts).
PREFIX = "AsyncParam."


def enabled() -> bool:
    """True when the running core has ``BYTEPS_ENABLE_ASYNC=1`` (False before ``init()``)."""
    return bool(_core.is_initialized() and _core.async_mode())


def max_staleness() -> int:
    """``BYTEPS_ASYNC_MAX_STALENESS`` of the running core (-1: unbounded).

    Raises:
        byteps.errors.NotInitializedError: before ``init()``.
    """
    return int(_core.max_staleness())


def wire_name(name: str) -> str:
    """The asynchronous parameter's tensor name for parameter ``name``: ``"AsyncParam.<name>"``."""
    return PREFIX + str(name)


def pushes_initial_value(wire: str) -> bool:
    """True when the next push_pull of ``wire`` is its first since ``init()`` (or ``resume()``):
    it carries the initial value, and its answer is the servers' value (rank 0's initial value
    unless the servers had it already)."""
    return int(_core.rounds(wire)) == 0


def contributes_initial_value() -> bool:
    """True on local rank 0: the worker processes of a machine are summed before the servers,
    so only local rank 0 pushes the initial value, the others push zeros."""
    return int(_core.local_rank()) == 0


def require(fn: str) -> None:
    """Raise unless asynchronous mode is on.

    Raises:
        UsageError: ``BYTEPS_ENABLE_ASYNC`` is not 1 (the servers keep no parameters).
        byteps.errors.NotInitializedError: before ``init()``.
    """
    if not _core.is_initialized():
        _core.size()  # raises NotInitializedError
    if not enabled():
        raise UsageError(f"{fn}: the servers keep parameters only in asynchronous training "
                         "(BYTEPS_ENABLE_ASYNC=1 on every worker, server and the scheduler); "
                         "in synchronous training every worker already holds them")
