"""Process sets: collectives among a subset of the ranks (Horovod's ``ProcessSet``,
``add_process_set``, ``remove_process_set``, ``global_process_set``; docs/collectives.md,
"Process sets").

A process set is a sorted list of global ranks. Every operation of ``byteps.basics``,
``byteps.collectives`` and the adapters takes ``process_set=``: only the set's ranks call it,
its ranks are numbered 0 .. ``size() - 1`` in the set (an allgather's result is in that order,
a reducescatter splits over them, an average divides by the set's size), and a rank outside
the set that calls it gets ``InvalidArgumentError``. In the core a set's tensors have keys of
their own (the set's id in the declared key), the scheduler waits for the set's worker machines
only, and the servers count only their pushes in a round.

A set covers whole worker machines: where a machine runs several worker processes (its local
reduce sums all of them before the machine pushes), a set holds all of that machine's ranks or
none (``add_process_set`` refuses others, naming the machine). Registration is collective:
every rank of the job adds (and removes) the same sets in the same order, as in Horovod; ids
count from 1 and are not reused (0 is :data:`global_process_set`).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from typing import NamedTuple, Optional, Sequence

from . import _core
from .errors import InvalidArgumentError, InvalidTypeError, NotInitializedError


class ProcessSet:
    """A set of global ranks that run collectives among themselves (Horovod's
    ``hvd.ProcessSet``).

    Args:
        ranks: the global ranks, any order, no duplicates (an int sequence).

    ``process_set_id`` is None until the set is registered (:func:`add_process_set`, or
    ``init(process_sets=[...])``), then its id (>= 1; 0 for :data:`global_process_set`).
    """

    def __init__(self, ranks: Sequence[int]):
        try:
            ranks = [int(r) if not isinstance(r, bool) and int(r) == r else None for r in ranks]
        except (TypeError, ValueError):
            raise InvalidTypeError("ProcessSet: ranks must be a sequence of ints") from None
        if None in ranks:
            raise InvalidTypeError("ProcessSet: ranks must be a sequence of ints")
        if len(set(ranks)) != len(ranks):
            raise InvalidArgumentError(f"ProcessSet: ranks {ranks} repeat a rank")
        self.ranks = sorted(ranks)
        self.process_set_id: Optional[int] = None

    def size(self) -> int:
        """The number of ranks in the set (the job's size for the global set)."""
        return _core.size() if self.process_set_id == 0 else len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set (its index among the set's ranks), or -1 when it
        is not in it."""
        if self.process_set_id == 0:
            return _core.rank()
        me = _core.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        """Whether this process is in the set."""
        return self.process_set_id == 0 or _core.rank() in self.ranks

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProcessSet) and self.ranks == other.ranks and
                self.process_set_id == other.process_set_id)

    def __hash__(self) -> int:
        return hash((tuple(self.ranks), self.process_set_id))

    def __repr__(self) -> str:
        if self.process_set_id == 0:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: Every rank of the job (id 0): the default of every operation's ``process_set=``.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_registered: dict = {}  # id -> ProcessSet
_next_id = [1]
_machines_of_ranks: list = []  # worker machine by global rank, once known


class Scope(NamedTuple):
    """A registered set as an operation uses it."""

    id: int
    ranks: list  # global ranks, ascending
    machines: list  # the worker machines of the ranks, ascending (each whole)
    machine_index: list  # by set rank: the index of its machine in `machines`
    size: int
    rank: int  # this process's rank in the set
    process_set: ProcessSet


def _require_init(fn: str) -> None:
    if not _core.is_initialized():
        raise NotInitializedError(f"{fn}: byteps is not initialized; call init() first")


def _agree(name: str, values: Sequence[int]) -> list:
    """Every rank's ``values`` (k int64s each), by global rank: a push_pull over the job in
    which each rank fills its own row and zeros the others."""
    k, n = len(values), _core.size()
    table = (ctypes.c_int64 * (n * k))()
    for i, v in enumerate(values):
        table[_core.rank() * k + i] = int(v)
    address = ctypes.addressof(table)
    # Declared through the summation service whatever BYTEPS_SYNC says (under "auto" the core
    # takes no undeclared tensor; basics, which would declare it, imports this module).
    _core.declare(name, "", "ps", 0)
    _core.wait(_core.push_pull_async(name, address, address, 8 * n * k, "int64", [n, k], False),
               -1.0)
    return [list(table[r * k:(r + 1) * k]) for r in range(n)]


def _machines() -> list:
    """The worker machine of every global rank (agreed once when the launcher numbered the
    ranks; collective the first time)."""
    if not _machines_of_ranks:
        if not _core.rank_given():
            per = _core.local_size()
            _machines_of_ranks.extend(r // per for r in range(_core.size()))
        else:
            rows = _agree("byteps.process_sets.machines", [_core.worker_id()])
            _machines_of_ranks.extend(row[0] for row in rows)
    return _machines_of_ranks


def _digest(ranks: Sequence[int], what: int) -> int:
    h = hashlib.blake2b(repr((list(ranks), what)).encode(), digest_size=7)
    return int.from_bytes(h.digest(), "little")


def add_process_set(process_set) -> ProcessSet:
    """Register a process set (Horovod's ``hvd.add_process_set``): every rank of the job calls
    it, with the same ranks, in the same order. Blocks for one small push_pull over the job
    (the agreement).

    Args:
        process_set: a :class:`ProcessSet` not yet registered, or a sequence of global ranks.

    Returns:
        the registered :class:`ProcessSet` (its ``process_set_id`` set).

    Raises:
        byteps.errors.InvalidArgumentError: a rank outside the job, an empty set, a set equal
            to a registered one or to the whole job, a machine only partly in the set, a set
            already registered, or ranks that added different sets (on every rank).
        byteps.errors.NotInitializedError: before ``init()``.
    """
    _require_init("add_process_set")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"add_process_set: {ps!r} is already registered")
    size = _core.size()
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= size:
        raise InvalidArgumentError(f"add_process_set: ranks {ps.ranks} must be 1 or more "
                                   f"ranks of this job of {size}")
    with _lock:
        new_id = _next_id[0]
        rows = _agree(f"byteps.process_sets.add.{new_id}", [_digest(ps.ranks, 1)])
        if len({row[0] for row in rows}) != 1:
            raise InvalidArgumentError(
                f"add_process_set: the ranks did not all add the same process set as set "
                f"{new_id} (this rank added {ps.ranks}); every rank adds the same sets in the "
                "same order")
        _next_id[0] += 1  # taken even when refused below, alike on every rank
        if ps.ranks == list(range(size)):
            raise InvalidArgumentError("add_process_set: the set of every rank is "
                                       "global_process_set")
        if any(r.ranks == ps.ranks for r in _registered.values()):
            raise InvalidArgumentError(f"add_process_set: a set of ranks {ps.ranks} is "
                                       "already registered")
        machines = _machines()
        for m in sorted({machines[r] for r in ps.ranks}):
            on = [r for r in range(size) if machines[r] == m]
            if not set(on) <= set(ps.ranks):
                raise InvalidArgumentError(
                    f"add_process_set: ranks {ps.ranks} hold only part of worker machine {m} "
                    f"(ranks {on}): a process set covers whole machines (their processes sum "
                    "their tensors before the machine pushes)")
        ps.process_set_id = new_id
        _registered[new_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (Horovod's ``hvd.remove_process_set``): every rank calls it,
    in the same order. Its operations must have finished. Returns False for the global set or a
    set not registered; True after removing it (its ``process_set_id`` is None again)."""
    _require_init("remove_process_set")
    if not isinstance(process_set, ProcessSet):
        raise InvalidTypeError("remove_process_set: expects a ProcessSet, got "
                               f"{type(process_set).__name__}")
    with _lock:
        pid = process_set.process_set_id
        if not pid or _registered.get(pid) is not process_set:
            return False
        del _registered[pid]
        process_set.process_set_id = None
    return True


def registered() -> list:
    """The registered sets (not the global one), by id."""
    with _lock:
        return [_registered[i] for i in sorted(_registered)]


def reset() -> None:
    """Forget every registered set (``byteps.basics.shutdown``: a new job numbers anew)."""
    with _lock:
        for ps in _registered.values():
            ps.process_set_id = None
        _registered.clear()
        _next_id[0] = 1
        _machines_of_ranks.clear()


def scope(process_set, fn: str) -> Optional[Scope]:
    """The registered set an operation ``fn`` runs in: None for the global set (or None), else
    its :class:`Scope`.

    Raises:
        byteps.errors.InvalidTypeError: not a ProcessSet.
        byteps.errors.InvalidArgumentError: a set not registered (or removed), or this rank is
            not in it.
    """
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise InvalidTypeError(f"{fn}: process_set must be a ProcessSet, got "
                               f"{type(process_set).__name__}")
    if process_set.process_set_id == 0:
        return None
    with _lock:
        pid = process_set.process_set_id
        if pid is None or _registered.get(pid) is not process_set:
            raise InvalidArgumentError(f"{fn}: {process_set!r} is not registered "
                                       "(add_process_set, or init(process_sets=...))")
    me = _core.rank()
    if me not in process_set.ranks:
        raise InvalidArgumentError(f"{fn}: rank {me} is not in {process_set!r}; only its "
                                   "ranks call its operations")
    machines_of = _machines()
    machines = sorted({machines_of[r] for r in process_set.ranks})
    index = [machines.index(machines_of[r]) for r in process_set.ranks]
    return Scope(pid, list(process_set.ranks), machines, index, len(process_set.ranks),
                 process_set.ranks.index(me), process_set)


def core_name(name: str, sc: Optional[Scope]) -> str:
    """The core's name of a set's tensor ``name`` (unchanged for the global set)."""
    return name if sc is None else f"process_set.{sc.id}.{name}"


def core_args(sc: Optional[Scope]) -> dict:
    """The core's push_pull_async arguments for a set."""
    if sc is None:
        return {}
    return {"process_set": sc.id, "set_machines": list(sc.machines), "set_size": sc.size}
