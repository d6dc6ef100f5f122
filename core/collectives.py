"""Allgather, broadcast, reducescatter and alltoall on NumPy arrays, with Horovod's semantics
(docs/collectives.md): the framework-independent half every adapter builds on.

The core runs each as a program over the worker mesh (``core/cpp/ps/collective_programs.h``),
scheduled and partitioned like push_pull, on one buffer of the same size on every worker
machine. This module plans that buffer's *layout* from what the ranks agree on, starts the
operation (:func:`collective_async`) and cuts the result back into what Horovod returns:

* **allgather**: ranks may contribute different first-dimension sizes. The sizes (and each
  rank's worker machine) are agreed first, in a push_pull of ``2 * size()`` int64s; then every
  rank's rows get a slot of the buffer, machine by machine (a machine's slots are one block the
  mesh's ring passes on), and the result is the concatenation in rank order.
* **broadcast**: the root rank's buffer reaches every rank (a chain from the root's machine).
* **reducescatter**: the first dimension is split as Horovod splits it (``rows // size`` per
  rank, the first ``rows % size`` ranks one more); each rank gets its shard combined with
  ``op`` over every rank (``average``: divided by ``size()``).
* **alltoall**: rank i sends ``splits[j]`` rows to rank j (the splits of every rank are agreed
  first); rank j's result is the rows every rank sent it, in rank order, and the number from
  each. The buffer holds every rank's rows in n phases: in phase k machine s's rows for machine
  (s + k) mod n (by destination rank, then source rank), so that the partitions of a phase keep
  every link busy.

On a machine with several worker processes the machine's processes first combine their
buffers with a sum (the core's local reduce): a process writes its own rows and zeros
elsewhere, so the sum is the machine's part of the layout.

A name keeps one layout in the core: each distinct layout (sizes, root, dtype, shape) of a name
is a tensor of its own there, named ``<name>#<digest>`` (at most 65535 tensors per job).

Every function takes ``process_set=`` (a registered ``byteps.process_sets.ProcessSet``; None:
every rank): then only the set's ranks call it, ranks, sizes and splits are the set's (rank i
of the set is its i-th lowest global rank), and the layout numbers the set's machines.

**Join** (:func:`join`, Horovod's): while some ranks have joined, the others' collectives
complete without them. Each collective first agrees which ranks take part (a column of its
small exchange, which every caller sees alike: a joined rank's push_pull contributions are
none); with a rank missing, allgather and broadcast go through the summation service instead
of the mesh (each present rank's bytes in their place, zeros elsewhere, summed), reducescatter
sums the whole tensor there and keeps this rank's shard, and alltoall is refused.
Asynchronous training (no mesh) broadcasts the summed way; the other collectives raise
``ConfigError`` there.
"""

from __future__ import annotations

import hashlib
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from . import _core, basics, buffers, process_sets
from .errors import InvalidArgumentError, InvalidTypeError
from .process_sets import Scope

#: The collectives this module runs beside push_pull (the core's allreduce).
COLLECTIVES = ("allgather", "broadcast", "reducescatter", "alltoall")


def collective_async(kind: str, name: str, buffer_ptr: int, output_ptr: int, nbytes: int,
                     dtype: str, shape: Sequence[int], *, blocks: Sequence[int] = (),
                     root: int = -1, root_rank: int = -1, op: str = "sum",
                     average: bool = False, priority: Optional[int] = None,
                     scope: Optional[Scope] = None) -> int:
    """Start collective ``kind`` on a buffer laid out for it (the core's entry point).

    Args:
        kind: one of :data:`COLLECTIVES`.
        name: the tensor's name in the core; the same on every rank, one layout per name.
        buffer_ptr, output_ptr: addresses of C-contiguous host buffers of ``nbytes`` bytes
            (the input, read only where this machine's data is; the output); may be equal.
        dtype: one of ``byteps.basics.SUPPORTED_DTYPES``; ``shape`` the buffer's shape.
        blocks: allgather, reducescatter: ``n + 1`` byte offsets, worker machine ``m``'s block
            is ``[blocks[m], blocks[m + 1])`` (n = the job's worker machines); alltoall:
            ``n * n + 1``, block ``k * n + s`` what machine s sends machine (s + k) mod n.
        root, root_rank: broadcast: the worker machine whose buffer every machine receives,
            and the rank on it that sends (its machine's other processes pass zeros).
        op, average: reducescatter's combination (``byteps.basics.REDUCE_OPS``; ``average``
            divides a sum by ``size()``); allgather and broadcast take ``"sum"``, ``False``.
        priority: larger runs first (default: by first use).
        scope: the process set it runs in (``byteps.process_sets.scope``; None: every rank);
            machines, ranks and ``size()`` above are then the set's.

    Returns:
        a handle for ``byteps.basics.poll`` / ``byteps.basics.wait``.

    Raises:
        byteps.errors.InvalidArgumentError: an unknown kind, a layout that does not fit the
            job or the buffer, a name first used with another collective or layout. Ranks that
            disagree on the collective or its layout fail it on every rank (MismatchError).
        byteps.errors.InvalidTypeError: a dtype the core does not move.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    if kind not in COLLECTIVES:
        raise InvalidArgumentError(f"collective_async: kind must be one of "
                                   f"{', '.join(COLLECTIVES)}, got {kind!r}")
    if dtype not in basics.SUPPORTED_DTYPES:
        raise InvalidTypeError(f"{kind}: unsupported dtype {dtype!r}; supported: "
                               f"{', '.join(basics.SUPPORTED_DTYPES)}")
    basics._require_init()
    return int(_core.push_pull_async(process_sets.core_name(name, scope), int(buffer_ptr),
                                     int(output_ptr), int(nbytes), dtype,
                                     [int(d) for d in shape], bool(average), priority, 0, op=op,
                                     collective=kind, blocks=[int(b) for b in blocks],
                                     root=int(root), root_rank=int(root_rank),
                                     **process_sets.core_args(scope)))


class Pending(NamedTuple):
    """A collective in flight: :meth:`wait` returns its result (a new array; alltoall's: the
    array and the rows received from each rank)."""

    handle: int
    keep: tuple  # the buffers the core reads and writes until it is done
    finish: Callable[[], np.ndarray]

    def poll(self) -> bool:
        return basics.poll(self.handle)

    def wait(self, timeout: Optional[float] = None):
        basics.wait(self.handle, timeout)
        return self.finish()


def _machine_major() -> bool:
    """Ranks are numbered machine by machine (``worker_id * local_size + local_rank``) unless
    the launcher gave each process its global rank (``BYTEPS_GLOBAL_RANK``, read by the core)."""
    return not _core.rank_given()


class _Ranks(NamedTuple):
    """The ranks an operation runs among: the job's, or a process set's."""

    size: int
    rank: int  # this process's
    machines: int  # worker machines
    me: int  # this process's machine, numbered among them
    scope: Optional[Scope]


def _ranks(process_set, fn: str) -> _Ranks:
    sc = process_sets.scope(process_set, fn)
    if sc is None:
        return _Ranks(basics.size(), basics.rank(), _core.num_worker(), _core.worker_id(), None)
    return _Ranks(sc.size, sc.rank, len(sc.machines), sc.machine_index[sc.rank], sc)


def _exchange(name: str, mine: Sequence[int], among: Optional[_Ranks] = None) -> np.ndarray:
    """Every rank's ``mine`` (k int64s), as a ``size x k`` array (by rank, of the job or of
    the process set): a push_pull in which each rank fills its own row and zeros the others."""
    among = among or _ranks(None, name)
    k = len(mine)
    table = np.zeros((among.size, k), dtype=np.int64)
    table[among.rank] = mine
    ptr = table.ctypes.data
    basics.wait(basics.push_pull_async(name, ptr, ptr, table.nbytes, "int64", table.shape,
                                       False, process_set=_set_of(among)))
    return table


def _set_of(among: _Ranks):
    return None if among.scope is None else among.scope.process_set


def rank_machines(name: str, among: Optional[_Ranks] = None) -> list:
    """The worker machine of every rank, by rank (from the rank numbering, or agreed in a
    push_pull under ``<name>.machines`` when the launcher numbered the ranks); in a process
    set, the index of each set rank's machine among the set's machines."""
    if among is not None and among.scope is not None:
        return list(among.scope.machine_index)
    if _machine_major():
        return [r // basics.local_size() for r in range(basics.size())]
    return [int(m) for m in _exchange(f"{name}.machines", [_core.worker_id()])[:, 0]]


class Layout(NamedTuple):
    """Where each rank's rows are in a collective's buffer."""

    order: list  # the ranks in buffer order (machine by machine, by rank within a machine)
    start: list  # by rank: its first row in the buffer
    counts: list  # by rank: its rows
    blocks: list  # by worker machine: the byte offsets of its block (n + 1 values)
    rows: int  # the buffer's rows


def plan_layout(counts: Sequence[int], machines: Sequence[int], row_bytes: int,
                n: Optional[int] = None) -> Layout:
    """The buffer layout of ranks with ``counts`` rows of ``row_bytes`` bytes each on worker
    ``machines`` (by rank) of ``n`` (default: the job's worker machines)."""
    n = _core.num_worker() if n is None else n
    order = sorted(range(len(counts)), key=lambda r: (machines[r], r))
    start = [0] * len(counts)
    blocks = [0] * (n + 1)
    row = 0
    for r in order:
        start[r] = row
        row += int(counts[r])
        blocks[machines[r] + 1] = row * row_bytes
    for m in range(1, n + 1):  # a machine without rows: an empty block where the last ended
        blocks[m] = max(blocks[m], blocks[m - 1])
    return Layout(order, start, [int(c) for c in counts], blocks, row)


def shard_counts(rows: int, ranks: int) -> list:
    """Horovod's split of ``rows`` over ``ranks``: ``rows // ranks`` each, the first
    ``rows % ranks`` one more."""
    return [rows // ranks + (1 if r < rows % ranks else 0) for r in range(ranks)]


def _core_name(kind: str, name: str, *parts) -> str:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=6).hexdigest()
    return f"{kind}.{name}#{digest}"


def _check_movable(a: np.ndarray, kind: str) -> None:
    """allgather, broadcast and alltoall move bytes (as uint8): any dtype but Python objects."""
    if a.dtype.hasobject:
        raise InvalidTypeError(f"{kind}: arrays of Python objects cannot be sent "
                               "(allgather_object / broadcast_object pickle them)")


def _contiguous(a) -> np.ndarray:
    a = np.asarray(a)  # (np.ascontiguousarray would make a 0-d array 1-d)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _rows_of(a: np.ndarray, kind: str) -> np.ndarray:
    a = _contiguous(a)
    if a.ndim == 0:
        raise InvalidArgumentError(f"{kind}: a 0-d tensor has no first dimension to "
                                   "concatenate or split along")
    return a


def allgather_start(a: np.ndarray, name: str, priority: Optional[int] = None,
                    process_set=None) -> Pending:
    """Start Horovod's allgather of ``a`` (any dtype, at least 1-d): the result is every
    rank's array concatenated along the first dimension, in rank order. Ranks may differ in
    the first dimension only (else ``InvalidArgumentError`` naming the ranks' shapes, on every
    rank). Blocks for one small push_pull (the sizes) before it returns."""
    return _allgather(a, name, priority, _ranks(process_set, "allgather"))[0]


def allgather_object(obj, name: str, process_set=None) -> list:
    """Horovod's ``allgather_object``: every rank's picklable ``obj`` (cloudpickle: lambdas and
    local classes work), as a list in rank order. One allgather of the pickled bytes under
    ``allgather_object.<name>``; every rank calls it with the same ``name``, in the same order.

    Raises:
        byteps.errors.BytePSError subclasses: the allgather failed (on every rank).
    """
    import cloudpickle

    data = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    pending, counts = _allgather(data, f"allgather_object.{name}", None,
                                 _ranks(process_set, "allgather_object"))
    flat = pending.wait()
    bounds = np.cumsum([0] + counts)
    return [cloudpickle.loads(flat[bounds[r]:bounds[r + 1]].tobytes())
            for r in range(len(counts))]


def _allgather(a: np.ndarray, name: str, priority: Optional[int], among: _Ranks) -> tuple:
    """:func:`allgather_start`, and the rows of every rank."""
    a = _rows_of(a, "allgather")
    _check_movable(a, "allgather")  # before the sizes are exchanged
    rest = a.shape[1:]
    row_bytes = int(np.prod(rest, dtype=np.int64)) * a.dtype.itemsize
    table = _exchange(f"allgather.{name}.sizes",
                      [a.shape[0], among.me, row_bytes, a.dtype.itemsize, 1], among)
    present = table[:, 4] == 1  # False: a rank that has joined
    if len(set(map(tuple, table[present, 2:4].tolist()))) != 1:
        raise InvalidArgumentError(
            f"allgather '{name}': the ranks' tensors differ beyond the first dimension "
            f"(bytes per row and element size by rank: {table[:, 2:4].tolist()}); this rank "
            f"has shape {tuple(a.shape)} of {a.dtype}")
    counts, machines = table[:, 0].tolist(), table[:, 1].tolist()
    if not present.all():
        return _allgather_summed(a, name, counts, row_bytes, priority, among), counts
    lay = plan_layout(counts, machines, row_bytes, among.machines)
    me = among.rank
    buf = (buffers.zeros if basics.local_size() > 1 else buffers.empty)(lay.rows * row_bytes)
    begin = lay.start[me] * row_bytes
    buf[begin:begin + a.nbytes] = a.reshape(-1).view(np.uint8)
    core = _core_name("allgather", name, lay.blocks, str(a.dtype), rest)
    handle = collective_async("allgather", core, buf.ctypes.data, buf.ctypes.data, buf.nbytes,
                              "uint8", (buf.nbytes,), blocks=lay.blocks, priority=priority,
                              scope=among.scope)

    def finish() -> np.ndarray:
        out = buf.view(a.dtype).reshape((lay.rows,) + rest)
        if lay.order == sorted(lay.order):
            return out
        return buffers.concatenate([out[lay.start[r]:lay.start[r] + lay.counts[r]]
                                    for r in range(len(counts))], out)

    return Pending(handle, (buf,), finish), lay.counts


def _summed(buf: np.ndarray, name: str, priority: Optional[int], among: _Ranks,
            dtype: str = "uint8", op: str = "sum", average: bool = False) -> int:
    """A push_pull of ``buf`` in place among ``among``'s ranks (the way around the mesh while
    a rank has joined)."""
    ptr = buf.ctypes.data
    return basics.push_pull_async(name, ptr, ptr, buf.nbytes, dtype, buf.shape, average,
                                  priority, op=op, process_set=_set_of(among))


def _allgather_summed(a: np.ndarray, name: str, counts: Sequence[int], row_bytes: int,
                      priority: Optional[int], among: _Ranks) -> Pending:
    """allgather while a rank has joined (it contributes no rows): every rank's rows in rank
    order, summed through the servers (each byte comes from one rank, zeros from the others)."""
    starts = np.cumsum([0] + [int(c) for c in counts])
    buf = buffers.zeros(int(starts[-1]) * row_bytes)
    begin = int(starts[among.rank]) * row_bytes
    buf[begin:begin + a.nbytes] = a.reshape(-1).view(np.uint8)
    core = _core_name("allgather.joined", name, [int(c) for c in counts], str(a.dtype),
                      a.shape[1:])
    handle = _summed(buf, core, priority, among)
    return Pending(handle, (buf,),
                   lambda: buf.view(a.dtype).reshape((int(starts[-1]),) + a.shape[1:]))


def _present(name: str, among: _Ranks) -> np.ndarray:
    """Which ranks take part in collective ``name`` (False: joined), agreed in a push_pull."""
    return _exchange(f"{name}.present", [1], among)[:, 0] == 1


def join() -> int:
    """Horovod's ``join``: this rank has run out of data. Blocks until every rank has called
    it; meanwhile the other ranks' allreduce (push_pull), allgather, broadcast and
    reducescatter complete without this rank (it contributes nothing: zeros to a sum, no rows
    to a gather; an Average still divides by the job's size, as Horovod's), and an alltoall is
    refused (``InvalidArgumentError`` on every caller). Returns the rank that joined last, the
    same on every rank. Every operation this rank started must be finished first.

    Raises:
        byteps.errors.ConfigError: several worker processes per machine, ``BYTEPS_SYNC`` other
            than ps, asynchronous training or ``BYTEPS_AUTOTUNE`` (docs/collectives.md).
        byteps.errors.InvalidArgumentError: an operation of this rank is in flight.
        byteps.errors.PeerLostError and the job's other failures, on every rank.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    basics._require_init()
    return int(_core.join())


def broadcast_start(a: np.ndarray, root_rank: int, name: str,
                    priority: Optional[int] = None, process_set=None) -> Pending:
    """Start Horovod's broadcast: every rank's result is ``root_rank``'s ``a`` (any dtype; the
    same shape and dtype on every rank, else the core's MismatchError on every rank). In a
    process set ``root_rank`` is a global rank of the set, as in Horovod."""
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        raise InvalidTypeError(f"broadcast: root_rank must be an int, got "
                               f"{type(root_rank).__name__}")
    among = _ranks(process_set, "broadcast")
    if not 0 <= root_rank < basics.size():
        raise InvalidArgumentError(f"broadcast: root_rank {root_rank} is not a rank of this "
                                   f"job of {basics.size()}")
    root = root_rank
    if among.scope is not None:
        if root_rank not in among.scope.ranks:
            raise InvalidArgumentError(f"broadcast: root_rank {root_rank} is not in "
                                       f"{among.scope.process_set!r}")
        root = among.scope.ranks.index(root_rank)
    a = _contiguous(a)
    _check_movable(a, "broadcast")
    # Asynchronous training has no worker mesh (nor join): the summed way.
    present = (np.ones(among.size, bool) if _core.async_mode()
               else _present(f"broadcast.{name}", among))
    if not present[root]:
        raise InvalidArgumentError(f"broadcast '{name}': root_rank {root_rank} has joined")
    if not present.all() or _core.async_mode():  # the root's bytes and zeros, summed
        buf = (buffers.copy_of(a.reshape(-1).view(np.uint8)) if among.rank == root
               else buffers.zeros(a.nbytes))
        core = _core_name("broadcast.joined", name, root_rank, str(a.dtype), a.shape)
        handle = _summed(buf, core, priority, among)
        return Pending(handle, (buf,), lambda: buf.view(a.dtype).reshape(a.shape))
    root_machine = rank_machines(f"broadcast.{name}", among)[root]
    me = among.rank
    if me == root:
        buf = buffers.copy_of(a.reshape(-1).view(np.uint8))
    elif basics.local_size() > 1 and among.me == root_machine:
        buf = buffers.zeros(a.nbytes)  # the root's machine sums its processes' buffers
    else:
        buf = buffers.empty(a.nbytes)
    core = _core_name("broadcast", name, root_rank, str(a.dtype), a.shape)
    handle = collective_async("broadcast", core, buf.ctypes.data, buf.ctypes.data, buf.nbytes,
                              "uint8", (buf.nbytes,), root=root_machine, root_rank=root,
                              priority=priority, scope=among.scope)
    return Pending(handle, (buf,), lambda: buf.view(a.dtype).reshape(a.shape))


def reducescatter_start(a: np.ndarray, name: str, op: str = "sum", average: bool = False,
                        priority: Optional[int] = None, dtype: Optional[str] = None,
                        process_set=None) -> Pending:
    """Start Horovod's reducescatter: ``a`` (a dtype of ``byteps.basics.SUPPORTED_DTYPES``,
    the same shape on every rank) combined with ``op`` over the ranks (``average``: the sum
    divided by ``size()``), split along the first dimension as :func:`shard_counts`; the
    result is this rank's shard. ``dtype`` names what ``a`` holds when NumPy has no such dtype
    (``"bfloat16"``, in an array of the same item size)."""
    a = _rows_of(a, "reducescatter")
    among = _ranks(process_set, "reducescatter")
    dtype = dtype or str(a.dtype)
    if dtype != str(a.dtype) and not (dtype == "bfloat16" and a.dtype.itemsize == 2):
        raise InvalidTypeError(f"reducescatter: an array of {a.dtype} does not hold {dtype}")
    if dtype not in basics.SUPPORTED_DTYPES:
        raise InvalidTypeError(f"reducescatter: unsupported dtype {dtype}; supported: "
                               f"{', '.join(basics.SUPPORTED_DTYPES)}")
    rest = a.shape[1:]
    row_bytes = int(np.prod(rest, dtype=np.int64)) * a.dtype.itemsize
    counts = shard_counts(a.shape[0], among.size)
    mine = slice(sum(counts[:among.rank]), sum(counts[:among.rank + 1]))
    if not _present(f"reducescatter.{name}", among).all():  # a rank has joined
        whole = buffers.copy_of(_contiguous(a))
        core = _core_name("reducescatter.joined", name, dtype, a.shape)
        handle = _summed(whole, core, priority, among, dtype, op, average)
        return Pending(handle, (whole,), lambda: buffers.copy_of(whole[mine]))
    lay = plan_layout(counts, rank_machines(f"reducescatter.{name}", among), row_bytes,
                      among.machines)
    if lay.order == sorted(lay.order):
        src = a
    else:  # the shards in buffer order, so that each machine's shards are one block
        offsets = np.cumsum([0] + counts)
        src = buffers.concatenate([a[offsets[r]:offsets[r + 1]] for r in lay.order], a)
    out = buffers.empty_like(src)
    core = _core_name("reducescatter", name, lay.blocks, dtype, a.shape)
    handle = collective_async("reducescatter", core, src.ctypes.data, out.ctypes.data,
                              out.nbytes, dtype, out.shape, blocks=lay.blocks, op=op,
                              average=average, priority=priority, scope=among.scope)
    me = among.rank
    return Pending(handle, (src, out),
                   lambda: buffers.copy_of(out[lay.start[me]:lay.start[me] + counts[me]]))


def alltoall_start(a: np.ndarray, splits: Optional[Sequence[int]], name: str,
                   priority: Optional[int] = None, process_set=None) -> Pending:
    """Start Horovod's alltoall: this rank sends ``splits[j]`` rows of ``a`` (in order) to rank
    j; :meth:`Pending.wait` returns ``(rows received, in rank order; the number from each
    rank)``. ``splits`` None: ``a``'s rows divided evenly (their number must divide by
    ``size()``). Any dtype; the ranks' arrays may differ in the first dimension only. Blocks for
    one small push_pull (every rank's splits) before it returns.

    The buffer the core works on holds every rank's rows (the job's whole exchange) on every
    machine; a process that shares its machine zeroes it first, so it costs memory and a pass
    over it (docs/collectives.md)."""
    a = _rows_of(a, "alltoall")
    _check_movable(a, "alltoall")
    among = _ranks(process_set, "alltoall")
    size, me = among.size, among.rank
    rows = a.shape[0]
    if splits is None:
        if rows % size:
            raise InvalidArgumentError(f"alltoall: {rows} rows do not split evenly over "
                                       f"{size} ranks; give splits")
        splits = [rows // size] * size
    splits = [int(x) for x in splits]
    if len(splits) != size or min(splits) < 0 or sum(splits) != rows:
        raise InvalidArgumentError(f"alltoall: splits {splits} must be {size} counts >= 0 "
                                   f"adding up to the {rows} rows")
    rest = a.shape[1:]
    row_bytes = int(np.prod(rest, dtype=np.int64)) * a.dtype.itemsize
    table = _exchange(f"alltoall.{name}.splits",
                      splits + [among.me, row_bytes, a.dtype.itemsize, 1], among)
    if not (table[:, size + 3] == 1).all():
        gone = [r for r in range(size) if table[r, size + 3] != 1]
        raise InvalidArgumentError(f"alltoall '{name}': ranks {gone} have joined; Horovod's "
                                   "join covers allreduce, allgather and broadcast")
    if len(set(map(tuple, table[:, size + 1:size + 3].tolist()))) != 1:
        raise InvalidArgumentError(
            f"alltoall '{name}': the ranks' tensors differ beyond the first dimension (bytes "
            f"per row and element size by rank: {table[:, size + 1:size + 3].tolist()}); this "
            "rank has "
            f"shape {tuple(a.shape)} of {a.dtype}")
    counts = table[:, :size]  # counts[i][j]: rows rank i sends rank j
    machine = table[:, size].tolist()
    n = among.machines
    by_machine = [sorted(r for r in range(size) if machine[r] == m) for m in range(n)]
    start = {}  # (source, destination) -> first row in the buffer
    blocks, row = [], 0
    for dm in range(n):  # block dm * n + sm: what machine sm sends machine dm
        for sm in range(n):
            blocks.append(row * row_bytes)
            for d in by_machine[dm]:
                for s in by_machine[sm]:
                    start[s, d] = row
                    row += int(counts[s][d])
    blocks.append(row * row_bytes)
    buf = (buffers.zeros if basics.local_size() > 1 else buffers.empty)(row * row_bytes)
    flat = a.view(np.uint8).reshape(rows, row_bytes)  # (a is C-contiguous)
    first = 0
    for d in range(size):
        b = start[me, d] * row_bytes
        buf[b:b + splits[d] * row_bytes] = flat[first:first + splits[d]].reshape(-1)
        first += splits[d]
    core = _core_name("alltoall", name, blocks, str(a.dtype), rest)
    handle = collective_async("alltoall", core, buf.ctypes.data, buf.ctypes.data, buf.nbytes,
                              "uint8", (buf.nbytes,), blocks=blocks, priority=priority,
                              scope=among.scope)
    received = [int(counts[s][me]) for s in range(size)]

    def finish() -> tuple:
        if all(start[s, me] + received[s] == start[s + 1, me] for s in range(size - 1)):
            # one run of the buffer, in source order (one process per machine): no copy
            b = start[0, me] * row_bytes
            out = buf[b:b + sum(received) * row_bytes]
        else:
            out = buffers.concatenate(
                [buf[start[s, me] * row_bytes:(start[s, me] + received[s]) * row_bytes]
                 for s in range(size)], buf)
        return out.view(a.dtype).reshape((sum(received),) + rest), np.array(received, np.int64)

    return Pending(handle, (buf,), finish)
