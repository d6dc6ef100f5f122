"""Framework-independent basics shared by every adapter (upstream ``BytePSBasics``).

These wrap ``byteps._core``, and are the one seam between the adapters (``byteps.torch`` …,
:mod:`byteps.dlpack`) and the core: an adapter calls the public functions here, never
``_core`` or an underscore helper (``tests/test_layout.py`` checks it). Tensors reach the core
as raw buffers: a data pointer, a byte count, a dtype name and a shape, plus, for a device
tensor, its device kind, device id and a ready event (:func:`push_pull_async`), or, for a
framework engine (MXNet's), an operation record the engine runs (:func:`engine_op`). Adapters
turn framework tensors into that and keep the tensors alive until the operation's handle is
waited on.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import math
import numbers
import operator
import os
import threading
from typing import Mapping, Optional, Sequence

from . import _core
from . import process_sets as process_sets_module
from .errors import InvalidArgumentError, InvalidTypeError, NotInitializedError
from .launch import torchrun
from .sync import schemes
from .telemetry import get_pushpull_speed, get_telemetry  # noqa: F401  (re-exported)

#: dtype names the summation service supports (docs/architecture.md §7: the SIMD kernels).
SUPPORTED_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int32",
    "int64",
)

#: How push_pull combines the ranks' values (docs/collectives.md "Reduction ops"): the servers,
#: the local reduce and the all-reduce schemes run the same SIMD kernels for each.
REDUCE_OPS = ("sum", "min", "max", "product")

_lock = threading.Lock()
_atexit_registered = False
_noname_counter = itertools.count()
# name -> the canonical compressor text it was declared with (re-declared by resume()).
_compression_of: dict = {}
# name -> the synchronization scheme it was declared with (re-declared by resume()).
_sync_of: dict = {}
# BYTEPS_SYNC=auto: the cost model's choose(nbytes) (byteps.sync.schemes.auto_chooser), from init().
_auto_choose = None


def init(lazy: bool = True, process_sets=None) -> None:
    """Start the core: read and validate every knob, connect to the job.

    Idempotent: a second call while initialised does nothing. ``lazy`` is accepted for upstream
    compatibility; the core always connects at init so that configuration and network errors
    surface here (upstream deferred the connection to the first tensor). ``process_sets``:
    Horovod's list of ``ProcessSet`` to add now, in order (``"dynamic"``, None: none).

    Raises:
        byteps.errors.ConfigError: a ``BYTEPS_*``/``DMLC_*`` variable is missing or malformed
            (raised before any thread or socket starts).
        byteps.errors.BytePSTimeoutError: the scheduler did not answer within ``BYTEPS_TIMEOUT``.
        byteps.errors.PeerLostError: a peer failed during rendezvous.
        byteps.launch.torchrun_env.TorchrunEnvError (a ``ConfigError``): a torchrun-style environment
            (``RANK``, ``WORLD_SIZE``... without ``DMLC_*``) that describes no byteps job.

    Without a ``DMLC_*`` job description, a torchrun-style environment is mapped onto one and
    this node's scheduler/server are started (:mod:`byteps.launch.torchrun`).
    """
    global _atexit_registered, _auto_choose
    with _lock:
        if not _core.is_initialized():
            # BYTEPS_SYNC=auto needs the cost model: fail here, not at the first push_pull.
            knobs = _core.knob_values(dict(os.environ))
            _auto_choose = (schemes.auto_chooser() if schemes.sync_setting(knobs) == "auto"
                            else None)
        if not _core.is_initialized() and torchrun.is_torchrun_env(os.environ):
            knobs = _core.knob_values(dict(os.environ))
            torchrun.activate(timeout=float(knobs["BYTEPS_TIMEOUT"]))
        try:
            _core.init()
        except BaseException:
            torchrun.deactivate(wait_s=0)
            raise
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    if process_sets not in (None, "dynamic"):
        for ps in process_sets:
            if ps.process_set_id is None:
                process_sets_module.add_process_set(ps)


def shutdown() -> None:
    """Stop the core: finish with the servers, join every thread, release shared memory.

    Safe to call twice or without ``init()``. Forgets the process sets. Then stops the
    scheduler/server a torchrun-style ``init()`` started, once they have ended by themselves
    or after ``byteps.launch.torchrun.STOP_WAIT`` seconds.
    """
    with _lock:
        try:
            _core.shutdown()
        finally:
            process_sets_module.reset()
            torchrun.deactivate()


_suspended_names: list[str] = []


def suspend() -> None:
    """Leave the job for an elastic restart (upstream ``suspend``): like :func:`shutdown`, but
    the names declared so far are kept, in order, for :func:`resume`.

    Call it after an operation failed with :class:`byteps.errors.PeerLostError` (a worker or
    server is gone); then restart the scheduler and servers for the new job size and call
    :func:`resume`. Safe without ``init()``.
    """
    global _suspended_names
    with _lock:
        if _core.is_initialized():
            _suspended_names = list(_core.declared_names())
        _core.shutdown()


def resume(num_workers: int, num_servers: int, global_rank: int, context=None) -> None:
    """Rejoin a restarted job after :func:`suspend` (upstream ``resume``).

    Sets ``DMLC_NUM_WORKER`` = ``num_workers``, ``DMLC_NUM_SERVER`` = ``num_servers`` and
    ``BYTEPS_GLOBAL_RANK`` = ``global_rank`` in ``os.environ`` (and ``DMLC_WORKER_ID`` =
    ``global_rank // BYTEPS_LOCAL_SIZE``, so the survivors of a smaller job are numbered
    ``0..num_workers-1``), starts the core again (``DMLC_PS_ROOT_URI``/``DMLC_PS_ROOT_PORT``
    unchanged: the new scheduler listens where the old one did), and re-declares every name
    that was declared before ``suspend()`` in the same order, so every worker gets the same
    keys. ``context`` is accepted for upstream compatibility and ignored.

    Raises:
        byteps.errors.InvalidTypeError: a count or rank that is not an int.
        byteps.errors.InvalidArgumentError: a count or rank out of range.
        byteps.errors.ConfigError, BytePSTimeoutError, PeerLostError: as :func:`init`.
    """
    num_workers = _as_int(num_workers, "num_workers", "resume")
    num_servers = _as_int(num_servers, "num_servers", "resume")
    global_rank = _as_int(global_rank, "global_rank", "resume")
    if num_workers < 1 or num_servers < 0:
        raise InvalidArgumentError(f"resume: num_workers must be >= 1 and num_servers >= 0, "
                                   f"got {num_workers}, {num_servers}")
    # Read through the knob registry (validated, with its default), like init() will.
    local = int(_core.knob_values(dict(os.environ))["BYTEPS_LOCAL_SIZE"])
    if not 0 <= global_rank < num_workers * local:
        raise InvalidArgumentError(f"resume: global_rank {global_rank} is not in [0, "
                                   f"{num_workers * local}) for {num_workers} workers x "
                                   f"{local} local")
    with _lock:
        _core.shutdown()
        os.environ["DMLC_NUM_WORKER"] = str(num_workers)
        os.environ["DMLC_NUM_SERVER"] = str(num_servers)
        os.environ["BYTEPS_GLOBAL_RANK"] = str(global_rank)
        os.environ["DMLC_WORKER_ID"] = str(global_rank // local)
        _core.init()
        for name in _suspended_names:
            _core.declare(name, _compression_of.get(name, ""), _sync_of.get(name, ""))


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return bool(_core.is_initialized())


def _require_init() -> None:
    if not _core.is_initialized():
        raise NotInitializedError("byteps is not initialised: call init() first")


def _as_int(value, what: str, fn: str, lo: Optional[int] = None,
            hi: Optional[int] = None) -> int:
    """``value`` as an int in ``[lo, hi)`` (Python or NumPy integer; bool and float refused).

    Raises:
        byteps.errors.InvalidTypeError: not an integer.
        byteps.errors.InvalidArgumentError: out of range.
    """
    if isinstance(value, bool):
        raise InvalidTypeError(f"{fn}: {what} must be an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidTypeError(f"{fn}: {what} must be an int, got "
                               f"{type(value).__name__}") from None
    if (lo is not None and v < lo) or (hi is not None and v >= hi):
        bound = f"in [{lo}, {hi})" if lo is not None and hi is not None else \
            f">= {lo}" if lo is not None else f"< {hi}"
        raise InvalidArgumentError(f"{fn}: {what} must be {bound}, got {v}")
    return v


def _check_name(name, fn: str) -> str:
    """``name`` if it is a non-empty str.

    Raises:
        byteps.errors.InvalidTypeError: not a str.
        byteps.errors.InvalidArgumentError: empty.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(f"{fn}: name must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError(f"{fn}: tensor name must not be empty")
    return name


def size() -> int:
    """Number of worker processes in the job (``DMLC_NUM_WORKER * BYTEPS_LOCAL_SIZE``)."""
    _require_init()
    return int(_core.size())


def rank() -> int:
    """Global rank of this process: ``worker_id * local_size + local_rank`` (or
    ``BYTEPS_GLOBAL_RANK``)."""
    _require_init()
    return int(_core.rank())


def local_size() -> int:
    """Number of worker processes on this machine (``BYTEPS_LOCAL_SIZE``)."""
    _require_init()
    return int(_core.local_size())


def local_rank() -> int:
    """Rank of this process on its machine (``BYTEPS_LOCAL_RANK``)."""
    _require_init()
    return int(_core.local_rank())


def cross_size() -> int:
    """Number of worker machines (``DMLC_NUM_WORKER``; Horovod's ``cross_size``: the ranks
    that share this process's local rank)."""
    _require_init()
    return int(_core.num_worker())


def cross_rank() -> int:
    """This process's worker machine, ``0 <= cross_rank() < cross_size()``
    (``DMLC_WORKER_ID``; Horovod's ``cross_rank``)."""
    _require_init()
    return int(_core.worker_id())


def is_homogeneous() -> bool:
    """True: every worker machine runs ``BYTEPS_LOCAL_SIZE`` processes (Horovod's
    ``is_homogeneous``; byteps's jobs have one local size)."""
    _require_init()
    return True


def _compression_text(compression: Mapping, fn: str) -> str:
    """The canonical text of a compressor's kwargs (``key=value;...`` in key order)."""
    if not isinstance(compression, Mapping):
        raise InvalidTypeError(f"{fn}: compression must be a dict of upstream's compressor "
                               f"kwargs, got {type(compression).__name__}")
    kwargs = {}
    for key, value in compression.items():
        if not isinstance(key, str):
            raise InvalidTypeError(f"{fn}: compression keys must be str, got {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            value = str(value)
        else:
            raise InvalidTypeError(f"{fn}: compression[{key!r}] must be a str, int, float or "
                                   f"bool, got {type(value).__name__}")
        kwargs[key] = value
    return str(_core.format_compression(kwargs))


def declare(name: str, compression: Optional[Mapping] = None, sync: Optional[str] = None,
            process_set=None) -> int:
    """Declare a tensor name; returns its key (declaration order, which must agree on every
    worker). Declaring an existing name returns its key again.

    Args:
        name: the tensor's name, the same on every rank.
        compression: the gradient compressor of this tensor (docs/compression.md): upstream's
            C++ compressor kwargs, e.g. ``{"compressor_type": "onebit",
            "compressor_onebit_scaling": True}`` (keys ``compressor_type`` onebit | topk |
            randomk | dithering | fp16, ``compressor_k``, ``compressor_onebit_scaling``,
            ``seed``, ``dithering_partition``, ``dithering_normalize``, ``ef_type`` vanilla,
            ``momentum_type`` nesterov, ``momentum_mu``; values str, int, float or bool).
            ``byteps.sync.compression.compression_kwargs`` makes them from the adapters' user-facing
            dict. Default ``None``: not compressed. Given before the name's first push_pull, the
            same on every worker (else ``MismatchError`` on every rank). Applies in a
            distributed job to float16/32/64 tensors of ``BYTEPS_MIN_COMPRESS_BYTES`` or more.
        sync: the tensor's synchronization scheme (docs/schemes.md): ``"ps"`` (summation
            service), ``"ring"``, ``"tree"`` (all-reduces among the workers; they need
            ``BYTEPS_SYNC`` ring, tree or auto, which starts the worker mesh) or ``"hips"``.
            Default ``None``: ``BYTEPS_SYNC`` (with ``auto``, the cost model's choice at the
            first push_pull). Part of the declaration: every worker must declare the same
            (else ``MismatchError`` on every rank); given once, before the first push_pull.
            Compression needs ``"ps"``.
        process_set: declare it among a ``ProcessSet``'s ranks (keys count per set).

    Raises:
        byteps.errors.InvalidTypeError: ``name`` is not a str; ``compression`` is not a dict of
            str keys and str/int/float/bool values; ``sync`` is not a str.
        byteps.errors.InvalidArgumentError: ``name`` is empty, or more than 65535 names; an
            unknown compressor key or value, a missing parameter (``compressor_k`` of topk,
            randomk, dithering; ``momentum_mu`` of nesterov); another compressor than the one
            the name was declared with, or one given after the name's first push_pull; a
            ``sync`` that is not a scheme, or another one than the name was declared with.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    _check_name(name, "declare")
    text = "" if compression is None else _compression_text(compression, "declare")
    scheme = "" if sync is None else schemes.check_scheme(sync, "declare")
    _require_init()
    scope = process_sets_module.scope(process_set, "declare")
    name = process_sets_module.core_name(name, scope)
    key = int(_core.declare(name, text, scheme, scope.id if scope else 0))
    if text and scope is None:  # re-declared by resume() (which forgets the sets)
        _compression_of[name] = text
    if scheme and scope is None:
        _sync_of[name] = scheme
    return key


def set_learning_rate(lr: float) -> None:
    """Tell error feedback the current learning rate (upstream: the ``lr.s`` file its MXNet
    trainer wrote every step).

    Vanilla error feedback scales the error it carries by ``previous lr / current lr`` before
    adding it to the next gradient (docs/compression.md); the adapters' optimizers call this
    before each step's push_pulls. Process-wide; the servers get it with each push. Until it is
    called, no correction is applied.

    Args:
        lr: the learning rate, a finite float > 0.

    Raises:
        byteps.errors.InvalidTypeError: ``lr`` is not a real number.
        byteps.errors.InvalidArgumentError: ``lr`` is not finite and > 0.
    """
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise InvalidTypeError(f"set_learning_rate: lr must be a float, got {type(lr).__name__}")
    lr = float(lr)
    if not math.isfinite(lr) or lr <= 0:
        raise InvalidArgumentError(f"set_learning_rate: lr must be finite and > 0, got {lr}")
    _core.set_learning_rate(lr)


def unique_name(prefix: str = "noname") -> str:
    """A process-unique tensor name (upstream gave every unnamed tensor the same name)."""
    return f"{prefix}.{next(_noname_counter)}"


def _auto_declare(name: str, nbytes: int) -> None:
    """``BYTEPS_SYNC=auto``: declare ``name`` before its first push_pull with the cheapest scheme
    it can use (:func:`push_pull_async` and :func:`engine_op` call this; docs/schemes.md): a
    tensor the core compresses (declared with a compressor, in a distributed job, at least
    ``BYTEPS_MIN_COMPRESS_BYTES``) can use only the summation service, ``"ps"``; any other
    the cost model's choice for ``nbytes``."""
    if _auto_choose is not None and name not in _sync_of:
        if name in _compression_of and _core.compresses(nbytes):
            declare(name, sync="ps")
        else:
            declare(name, sync=schemes.auto_choice(_auto_choose, name, nbytes))


def push_pull_async(
    name: str,
    input_ptr: int,
    output_ptr: int,
    nbytes: int,
    dtype: str,
    shape: Sequence[int],
    average: bool,
    priority: Optional[int] = None,
    version: int = 0,
    *,
    device: str = "cpu",
    device_id: int = 0,
    ready_event: int = 0,
    op: str = "sum",
    process_set=None,
) -> int:
    """Start summing ``nbytes`` at ``input_ptr`` across all worker processes into ``output_ptr``
    (or reducing them with ``op``).

    With ``BYTEPS_SYNC=auto``, a name's first push_pull declares it with the cost model's
    scheme for ``nbytes`` first (docs/schemes.md).

    Args:
        name: tensor name; the same name on every rank. At most one operation per name may be
            in flight (a second raises ``InvalidArgumentError``).
        input_ptr, output_ptr: addresses of C-contiguous buffers of ``nbytes`` bytes (host
            memory, or ``device``'s); may be equal (in place). They must stay valid until the
            handle is waited on.
        dtype: one of :data:`SUPPORTED_DTYPES`.
        shape: the tensor's shape (checked across ranks on first use).
        average: divide the sum by :func:`size` (floor division for integer dtypes).
        priority: larger runs first; ``None`` = by declaration order (earlier first).
        version: accepted for upstream compatibility; rounds are versioned internally.
        device: where the buffers are: ``"cpu"`` (default: host memory), ``"cuda"`` (a CUDA
            device: the core's device stages, docs/gpu.md; needs CUDA support,
            ``byteps.cuda_status()``) or ``"fake"`` (the tests' fake device).
        device_id: the device's index (default 0; ignored for ``"cpu"``), >= 0.
        ready_event: address of an event (a ``cudaEvent_t``) recorded after the producer's
            work on the buffer: the core's first copy waits for it (default 0: none, the
            buffer is ready now).
        op: how the ranks' values combine (docs/collectives.md), one of :data:`REDUCE_OPS`:
            ``"sum"`` (default; ``average`` divides it), ``"min"``, ``"max"`` (elementwise;
            a NaN wins, as ``torch.minimum``) or ``"product"`` (integers wrap), each with
            ``average=False`` (Horovod's Sum, Min, Max, Product). Fixed by the name's first
            push_pull, and must be the same on every rank. A compressed or asynchronous
            tensor only sums.
        process_set: a registered ``byteps.process_sets.ProcessSet`` (None: every rank); only
            its ranks call it, ``average`` divides by its size (docs/collectives.md).

    Returns:
        an integer handle for :func:`poll` / :func:`wait`.

    Raises:
        byteps.errors.InvalidTypeError (a ``TypeError``): unsupported dtype or device, a name
            that is not a str, an address, size, dimension, priority, version, device id or
            event that is not an int.
        byteps.errors.InvalidArgumentError (a ``ValueError``): an empty name, a negative size,
            dimension or device id, ``nbytes`` not matching ``shape`` and ``dtype``, a null
            buffer, or an operation with this name already in flight; a name first used with
            another dtype, shape or op; ``average`` with an op other than sum; an op other than
            sum on a compressed or asynchronous tensor; ``"cuda"`` while CUDA support is off.
            Ranks that use different ops for one name fail the operation on every rank.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    fn = "push_pull_async"
    if not isinstance(dtype, str) or dtype not in SUPPORTED_DTYPES:
        raise InvalidTypeError(
            f"{fn}: unsupported dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}"
        )
    _check_name(name, fn)
    input_ptr = _as_int(input_ptr, "input_ptr", fn, 0, 1 << 64)
    output_ptr = _as_int(output_ptr, "output_ptr", fn, 0, 1 << 64)
    nbytes = _as_int(nbytes, "nbytes", fn, 0, 1 << 63)
    try:
        dims = list(shape)
    except TypeError:
        raise InvalidTypeError(f"{fn}: shape must be a sequence of ints, got "
                               f"{type(shape).__name__}") from None
    dims = [_as_int(d, "each dimension of shape", fn, 0, 1 << 63) for d in dims]
    if priority is not None:
        priority = _as_int(priority, "priority", fn, -(1 << 63), 1 << 63)
    version = _as_int(version, "version", fn)
    if not isinstance(device, str):
        raise InvalidTypeError(f"{fn}: device must be a str, got {type(device).__name__}")
    device_id = _as_int(device_id, "device_id", fn, 0, 1 << 31)
    ready_event = _as_int(ready_event, "ready_event", fn, 0, 1 << 64)
    if op not in REDUCE_OPS:
        raise InvalidArgumentError(f"{fn}: op must be one of {', '.join(REDUCE_OPS)}, "
                                   f"got {op!r}")
    _require_init()
    scope = process_sets_module.scope(process_set, fn)
    if scope is None:
        _auto_declare(name, nbytes)
    return int(_core.push_pull_async(process_sets_module.core_name(name, scope), input_ptr,
                                     output_ptr, nbytes, dtype, dims, bool(average), priority,
                                     version, device=device, device_id=device_id,
                                     ready_event=ready_event, op=op,
                                     **process_sets_module.core_args(scope)))


def copy_stream(device: str, device_id: int) -> int:
    """The stream the core's first copy of ``device``'s tensors runs on (COPY_D2H): the
    address of a ``cudaStream_t`` for ``"cuda"``. A producer that orders its pending work on
    a tensor before this stream (DLPack's ``__dlpack__(stream=...)``) needs no device-wide
    synchronize before :func:`push_pull_async`.

    Args:
        device: ``"cuda"`` (or ``"fake"``, the tests' fake device).
        device_id: the device's index, >= 0.

    Raises:
        byteps.errors.InvalidTypeError: ``device`` is not a str, ``device_id`` not an int.
        byteps.errors.InvalidArgumentError: ``device_id`` negative; ``"cuda"`` while CUDA
            support is off (``byteps.cuda_status()`` says why).
    """
    if not isinstance(device, str):
        raise InvalidTypeError(f"copy_stream: device must be a str, got {type(device).__name__}")
    device_id = _as_int(device_id, "device_id", "copy_stream", 0, 1 << 31)
    return int(_core.device.copy_stream(device, device_id))


def engine_op(name: str, nbytes: int, dtype: str, shape: Sequence[int], average: bool,
              priority: Optional[int] = None, *, ndarray: int = 0,
              mxnet_api: Sequence[int] = (), op: str = "sum") -> int:
    """A push_pull for a framework's dependency engine (MXNet's, docs/mxnet.md;
    ``core/cpp/pipeline/engine_bridge.h``): a new operation record that the engine runs
    through :func:`engine_entry_points`' ``byteps_engine_push_pull`` (on its own thread, no
    GIL), which enqueues the tensor and returns; the core calls the engine's completion
    callback when the sum is in place. Declare ``name`` (:func:`declare`) first, in program
    order; with ``BYTEPS_SYNC=auto``, a name's first record declares it with the cost model's
    scheme for ``nbytes`` too (as :func:`push_pull_async` does; docs/schemes.md).

    Args:
        name: the tensor's name, the same on every rank.
        nbytes: the tensor's bytes; 0 for an empty tensor (then no ``ndarray``).
        dtype: one of :data:`SUPPORTED_DTYPES`.
        shape: the tensor's shape.
        average: divide the sum by :func:`size`.
        priority: larger runs first; ``None`` = by declaration order.
        ndarray: an MXNet NDArray handle (a shallow copy) that the record then owns and frees;
            its buffer is looked up when the engine runs the operation (MXNet allocates a new
            array's storage lazily on the engine thread). 0 (default): none.
        mxnet_api: with ``ndarray``, the addresses of libmxnet's ``MXNDArrayToDLPack``,
            ``MXNDArrayCallDLPackDeleter``, ``MXNDArrayFree`` and ``MXGetLastError``.
        op: how the ranks' values combine, as :func:`push_pull_async`'s ``op`` (default
            ``"sum"``).

    Returns:
        int: the address of the record, freed by the engine through
        ``byteps_engine_op_delete``.

    Raises:
        byteps.errors.InvalidTypeError, InvalidArgumentError: as :func:`push_pull_async` for
            the tensor's description; ``ndarray`` without the four ``mxnet_api`` addresses;
            an unknown ``op`` (the core's checks of the op run when the engine runs it).
        byteps.errors.NotInitializedError: before ``init()``.
    """
    fn = "engine_op"
    _check_name(name, fn)
    nbytes = _as_int(nbytes, "nbytes", fn, 0, 1 << 63)
    if op not in REDUCE_OPS:
        raise InvalidArgumentError(f"{fn}: op must be one of {', '.join(REDUCE_OPS)}, "
                                   f"got {op!r}")
    _require_init()
    _auto_declare(name, nbytes)
    return int(_core.engine_op(name, 0, 0, nbytes, dtype, list(shape), bool(average), priority,
                               ndarray=ndarray, mxnet_api=list(mxnet_api), op=op))


def engine_entry_points() -> tuple:
    """``(push_pull, op_delete)``: the addresses of the core's C entry points
    ``byteps_engine_push_pull`` (MXNet's ``EngineAsyncFunc``) and ``byteps_engine_op_delete``
    (its ``EngineFuncParamDeleter``), for :func:`engine_op`'s records. Needs no ``init()``."""
    push_pull_fn, op_delete_fn = _core.engine_entry_points()
    return int(push_pull_fn), int(op_delete_fn)


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (successfully or not).

    Raises:
        byteps.errors.InvalidTypeError: ``handle`` is not an int.
        byteps.errors.InvalidArgumentError: unknown or already released handle.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    handle = _as_int(handle, "handle", "poll", -(1 << 63), 1 << 63)
    return bool(_core.poll(handle))


def wait(handle: int, timeout: Optional[float] = None) -> None:
    """Block (GIL released) until the operation finishes; release the handle.

    Args:
        handle: from :func:`push_pull_async`.
        timeout: seconds; ``None`` (default) waits until the operation finishes or the core's
            own ``BYTEPS_TIMEOUT`` fails it.

    Raises:
        byteps.errors.InvalidTypeError: ``handle`` is not an int or ``timeout`` not a number.
        byteps.errors.InvalidArgumentError: unknown or already released handle.
        the operation's error as a typed :mod:`byteps.errors` exception.
    """
    handle = _as_int(handle, "handle", "wait", -(1 << 63), 1 << 63)
    if timeout is None:
        seconds = -1.0
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise InvalidTypeError(f"wait: timeout must be a number of seconds or None, got "
                               f"{type(timeout).__name__}")
    _core.wait(handle, seconds)


#: The tensor name every barrier pushes.
BARRIER_NAME = "byteps.barrier"
_barrier_lock = threading.Lock()  # one barrier at a time per process, so one buffer suffices
_barrier_count = (ctypes.c_int32 * 1)()  # module-level: the core may write it until it is done


def barrier(process_set=None) -> None:
    """Block until every worker process (of ``process_set``, a registered ``ProcessSet``;
    default every rank) has called :func:`barrier` (Horovod's ``barrier``): a push_pull of one int32 under :data:`BARRIER_NAME`, whose round no rank can complete
    before every rank has pushed it. Costs one round trip through the summation service (no
    communication in a job of one process). Threads of one process take turns.

    Raises:
        byteps.errors.BytePSTimeoutError: a rank did not come within ``BYTEPS_TIMEOUT`` (on
            every rank, naming the missing ones).
        byteps.errors.PeerLostError: a rank or a server died meanwhile.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    with _barrier_lock:
        _barrier_count[0] = 1
        address = ctypes.addressof(_barrier_count)
        wait(push_pull_async(BARRIER_NAME, address, address, 4, "int32", (1,), False,
                             process_set=process_set))
        ranks = size() if process_set is None else process_set.size()
        if not 1 <= _barrier_count[0] <= ranks:  # fewer: ranks that joined (collectives.join)
            raise InvalidArgumentError(f"barrier: {_barrier_count[0]} of {ranks} ranks "
                                       f"counted; '{BARRIER_NAME}' was used by another "
                                       "push_pull")
