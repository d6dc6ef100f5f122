"""MXNet NDArray operations over the byteps core (upstream ``byteps/mxnet/ops.py``).

``byteps_push_pull`` is an operation of MXNet's dependency engine that writes the tensor: it is
pushed with ``MXEnginePushAsyncND`` (the NDArray as a mutable dependency), so it starts when
every earlier write of the tensor (the backward pass that produced a gradient, say) is done,
and every later read (``asnumpy``, ``wait_to_read``, the optimizer update...) waits for its
result. The engine runs the core's C entry point ``byteps_engine_push_pull`` (no Python, no
GIL on the engine thread), which enqueues the tensor in place and returns; the core calls the
engine's completion callback when the sum is in place (``core/cpp/pipeline/engine_bridge.h``).
The buffer is looked up when the engine runs the operation (through a shallow copy of the
NDArray handle and ``MXNDArrayToDLPack``): MXNet allocates a new array's storage lazily on the
engine thread, so a pointer taken at the call could miss the data (a race this avoids).

Operations on one name are ordered by the engine as well (each name has a one-byte NDArray
that every push_pull of the name also writes), so two push_pulls of a name never overlap.

Errors: a failed push_pull completes with the core's error; MXNet raises it at the next read of
the tensor as the ``byteps.errors`` class (registered with MXNet's error table here), e.g.
``byteps.errors.PeerLostError: PEER_LOST: rank 1: server 0 (...) disconnected (during push_pull
of 'gradient_3')``.

Differences from upstream (fixes): names are used as given (upstream prefixed ``"byteps."``);
``name=None`` gets a process-unique name (upstream: one shared counter that broke with
different sizes); the declaration happens in the calling thread without a blocking first push;
averaging is done by the core (floor division for integer dtypes); ``MXNET_ENGINE_TYPE=NaiveEngine``
is not supported (it requires every operation to finish inside its push).

GPU NDArrays (``mx.gpu(i)``) go through a host copy, every step an engine operation: MXNet's
own ``copyto`` into a pinned CPU NDArray kept per name (``mx.cpu_pinned()``, allocated at the
name's first push_pull and reused), the push_pull of that copy, and ``copyto`` back. The engine
orders the three after the tensor's earlier writes and before its later reads, and a failed
push_pull's error reaches the tensor's next read through the copy back. MXNet exposes no CUDA
stream or event to Python, so the core's own copy stages (docs/gpu.md) are not used.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Optional, Tuple

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from byteps import basics as _b
from byteps import errors
from byteps.basics import (  # re-exported as-is
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from byteps.errors import InvalidArgumentError, InvalidTypeError
from byteps.naming import resolve_priority

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "byteps_declare_tensor",
    "byteps_push_pull",
    "SUPPORTED_DTYPES",
]

#: NumPy dtypes of NDArrays the core can sum, with the core's name for each.
_DTYPE_NAMES: Dict[Any, str] = {
    np.float16: "float16",
    np.float32: "float32",
    np.float64: "float64",
    np.uint8: "uint8",
    np.int8: "int8",
    np.int32: "int32",
    np.int64: "int64",
}

#: Supported dtype names, in the order error messages list them.
SUPPORTED_DTYPES: Tuple[str, ...] = tuple(_DTYPE_NAMES.values())

# Every failed engine operation's message starts with the core's status code name
# ("PEER_LOST: ..."): MXNet's error table turns that into the byteps.errors class.
for _code, _cls in errors.STATUS_CLASSES.items():
    mx.base.register_error(_code, _cls)

# --------------------------------------------------------------------------------------------
# the engine push
# --------------------------------------------------------------------------------------------
_PUSH_ASYNC_ND = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,  # fn, param, del, ctx
    ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,  # const NDArrays
    ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,  # mutable NDArrays
    ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_bool,  # prop, priority, name, wait
)(("MXEnginePushAsyncND", _LIB))
# mxnet::Context {DeviceType dev_type; int32 dev_id} for cpu(0): where the engine runs the op.
_CPU_CONTEXT = (ctypes.c_int32 * 2)(1, 0)
# mxnet::FnProperty::kCPUPrioritized (include/mxnet/engine.h): the engine's priority CPU
# workers, so a push_pull never queues behind compute operations.
_CPU_PRIORITIZED = ctypes.c_int(3)
_OP_NAME = b"byteps_push_pull"

_name_vars_lock = threading.Lock()
_name_vars: Dict[str, mx.nd.NDArray] = {}


def _name_var(name: str) -> mx.nd.NDArray:
    """The one-byte NDArray every push_pull of ``name`` writes (orders them in the engine)."""
    with _name_vars_lock:
        var = _name_vars.get(name)
        if var is None:
            var = _name_vars[name] = mx.nd.zeros((1,), ctx=mx.cpu(), dtype=np.uint8)
        return var


# libmxnet functions the core's bridge calls when the engine runs a push_pull: the buffer is
# looked up then (a pending operation may still allocate the NDArray's storage; MXNet
# allocates lazily on the engine thread, so a pointer taken here could miss the data).
_MXNET_API = [ctypes.cast(getattr(_LIB, f), ctypes.c_void_p).value for f in (
    "MXNDArrayToDLPack", "MXNDArrayCallDLPackDeleter", "MXNDArrayFree", "MXGetLastError")]


def _shallow_copy(tensor: mx.nd.NDArray) -> int:
    """A new NDArray handle sharing ``tensor``'s storage (owned by the engine operation)."""
    handle = ctypes.c_void_p()
    check_call(_LIB.MXShallowCopyNDArray(tensor.handle, ctypes.byref(handle)))
    return handle.value


# --------------------------------------------------------------------------------------------
# basics (re-exported by byteps.mxnet)
# --------------------------------------------------------------------------------------------
def init(lazy: bool = True, process_sets=None) -> None:
    """Start byteps in this process (idempotent).

    Args:
        lazy: accepted for upstream compatibility; the core always connects at ``init`` so
            that configuration and network errors surface here.
        process_sets: Horovod's: a list of ``ProcessSet`` to register now, in order (every
            rank passes the same); ``"dynamic"`` or None: none (``add_process_set`` any time).

    Raises:
        byteps.errors.ConfigError: a ``BYTEPS_*`` / ``DMLC_*`` variable is missing or bad.
        byteps.errors.BytePSTimeoutError: the scheduler did not answer in time.
        byteps.errors.PeerLostError: a peer failed during rendezvous.
    """
    _b.init(lazy=lazy, process_sets=process_sets)


def byteps_declare_tensor(name: str, **kwargs) -> int:
    """Declare a tensor name ahead of use, optionally with its gradient compressor, and return
    its key (upstream API).

    Keys follow declaration order, which must be the same on every worker;
    :class:`~byteps.mxnet.DistributedTrainer` declares all of its names when it is created.
    Declaring an existing name returns the same key.

    Args:
        name: the tensor's name (used unchanged; upstream prefixed ``"byteps."``).
        **kwargs: the core's compressor kwargs with a prefix, as upstream's trainer passed its
            parameters' ``byteps_*`` attributes: the first ``_``-separated token of each key is
            dropped (``byteps_compressor_type`` -> ``compressor_type``; keys
            ``compressor_type``, ``compressor_k``, ``compressor_onebit_scaling``, ``seed``,
            ``dithering_partition``, ``dithering_normalize``, ``ef_type``, ``momentum_type``,
            ``momentum_mu``), string values are lower-cased, bools become ``"true"``/
            ``"false"`` (upstream: ``"True"``/``"False"``), other numbers ``str()``. With any,
            the name is declared compressed (see :func:`byteps.basics.declare`): it must come
            before the name's first push_pull, and every worker must declare the same.

    Raises:
        InvalidTypeError (a TypeError): ``name`` is not a string; a value that is not a str,
            bool, int or float (upstream: ValueError).
        InvalidArgumentError (a ValueError): ``name`` is empty; a key without a prefix token
            (upstream warned and ignored it); a compressor key or value the core does not know,
            a missing parameter, or other kwargs than the name was declared with.
        byteps.errors.NotInitializedError: before :func:`init`.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(
            f"byteps_declare_tensor: name must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError("byteps_declare_tensor: name must not be empty")
    args: Dict[str, str] = {}
    for key, value in kwargs.items():
        head, sep, rest = key.partition("_")
        if not sep or not head or not rest:
            raise InvalidArgumentError(
                f"byteps_declare_tensor({name!r}): keyword {key!r} has no prefix to drop "
                "(upstream's keys are byteps_<kwarg>, e.g. byteps_compressor_type)")
        if isinstance(value, str):
            args[rest] = value.lower()
        elif isinstance(value, (bool, np.bool_)):
            args[rest] = "true" if value else "false"
        elif isinstance(value, (int, float, np.integer, np.floating)):
            args[rest] = str(value)
        else:
            raise InvalidTypeError(
                f"byteps_declare_tensor({name!r}): {key}={value!r}: values must be str, bool, "
                f"int or float, got {type(value).__name__}")
    if args:
        return _b.declare(name, compression=args)
    return _b.declare(name)


def _dtype_name(tensor: mx.nd.NDArray, fn: str) -> str:
    try:
        return _DTYPE_NAMES[np.dtype(tensor.dtype).type]
    except (KeyError, TypeError):
        raise InvalidTypeError(
            f"{fn}: unsupported NDArray dtype {np.dtype(tensor.dtype).name}; supported dtypes: "
            f"{', '.join(SUPPORTED_DTYPES)}") from None


def check_tensor(tensor: Any, fn: str) -> str:
    """Validate ``tensor`` for the core; returns the core's dtype name.

    Raises:
        InvalidTypeError (a TypeError): not an ``mx.nd.NDArray``; a sparse (``row_sparse``/``csr``)
            NDArray; an NDArray on a GPU; an unsupported dtype (the message lists the supported
            ones).
    """
    if not isinstance(tensor, mx.nd.NDArray):
        raise InvalidTypeError(f"{fn}: expected an mxnet NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise InvalidTypeError(f"{fn}: sparse NDArrays ({tensor.stype}) are not supported; convert "
                               "with tensor.tostype('default')")
    if tensor.context.device_type not in ("cpu", "cpu_pinned", "cpu_shared", "gpu"):
        raise InvalidTypeError(f"{fn}: the NDArray is on {tensor.context}, which byteps.mxnet "
                               "does not know")
    return _dtype_name(tensor, fn)


def _on_device(tensor: mx.nd.NDArray) -> bool:
    """Whether ``tensor`` is in device memory (pushed through a host copy), not in host
    memory (``cpu``, ``cpu_pinned``, ``cpu_shared``: push_pulled in place)."""
    return tensor.context.device_type == "gpu"

_host_copies_lock = threading.Lock()
_host_copies: Dict[str, mx.nd.NDArray] = {}


def _host_copy(name: str, tensor: mx.nd.NDArray) -> mx.nd.NDArray:
    """The pinned CPU NDArray a device tensor named ``name`` is push_pulled through: made at
    the name's first use, and again only when its shape or dtype changes."""
    with _host_copies_lock:
        copy = _host_copies.get(name)
        if copy is None or copy.shape != tensor.shape or copy.dtype != tensor.dtype:
            copy = _host_copies[name] = mx.nd.empty(tensor.shape, ctx=mx.cpu_pinned(0),
                                                    dtype=tensor.dtype)
        return copy


def resolve_name(name: Optional[str], fn: str) -> str:
    """``name``, or a process-unique name for ``None``."""
    if name is None:
        return _b.unique_name("mxnet.noname")
    if not isinstance(name, str):
        raise InvalidTypeError(f"{fn}: name must be a str or None, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError(f"{fn}: name must not be empty (pass None for a unique name)")
    return name


def byteps_push_pull(tensor: mx.nd.NDArray, version: int = 0, priority: int = 0,
                     name: Optional[str] = None, is_average: bool = True) -> None:
    """Sum (or average) ``tensor`` across all workers, in place (upstream API).

    Asynchronous for Python: the call returns at once; MXNet's engine runs the operation after
    every earlier write of ``tensor`` and makes every later read wait for the result, so
    ``tensor.asnumpy()``, ``tensor.wait_to_read()`` or an optimizer update reading it see the
    sum. Operations on one name run one after the other.

    Args:
        tensor: a dense ``mx.nd.NDArray`` on the CPU or a GPU (through a pinned host copy:
            the module's docstring) of any shape (0-d and empty included) with dtype
            float16, float32, float64, uint8, int8, int32 or int64.
        version: accepted for upstream compatibility (upstream never read it).
        priority: 0 (default) lets the core schedule by declaration order (earlier-declared
            first); any other value is an explicit priority, larger first.
        name: the same name on every rank (declared on first use, in call order, which must
            agree across ranks). ``None`` generates a unique name (the same on every rank as
            long as all ranks make their unnamed calls in the same order).
        is_average: divide the sum by :func:`size` (floor division for integer dtypes).
            Default True.

    Raises:
        InvalidTypeError (a TypeError): not an NDArray, sparse, or an unsupported dtype (bool,
            int16...).
        InvalidArgumentError (a ValueError): an empty name.
        byteps.errors.NotInitializedError: before :func:`init`.
        byteps.errors.BytePSError subclasses: raised by MXNet at the next read of ``tensor``
            when the operation failed (a dead peer, ranks disagreeing on the name's dtype or
            shape, a timeout).
    """
    dtype = check_tensor(tensor, "byteps_push_pull")
    name = resolve_name(name, "byteps_push_pull")
    prio = resolve_priority(priority, "byteps_push_pull")
    _b.declare(name)  # here, in program order: keys must agree across ranks
    _reduce_in_place(tensor, name, prio, dtype, is_average, "sum")


def _reduce_in_place(tensor: mx.nd.NDArray, name: str, prio: int, dtype: str, is_average: bool,
                     op: str) -> None:
    """The engine operations of one in-place push_pull of a declared ``name`` (``op``: the
    core's, byteps.basics.REDUCE_OPS)."""
    if _on_device(tensor):
        _push_pull_through_host(tensor, name, prio, dtype, is_average, op)
    else:
        _push_engine_op(tensor, name, prio, dtype, is_average, op)


def _push_pull_through_host(tensor: mx.nd.NDArray, name: str, prio: int, dtype: str,
                            is_average: bool, op: str = "sum") -> None:
    """A device tensor's push_pull: three engine operations, ``tensor`` into its pinned host
    copy, the push_pull of the copy, the copy back into ``tensor``."""
    host = _host_copy(name, tensor)
    tensor.copyto(host)
    _push_engine_op(host, name, prio, dtype, is_average, op)
    host.copyto(tensor)


def _push_engine_op(tensor: mx.nd.NDArray, name: str, prio: int, dtype: str,
                    is_average: bool, op: str = "sum") -> None:
    """Pushes the push_pull of the host NDArray ``tensor`` (declared as ``name``) to MXNet's
    engine, writing ``tensor`` and the name's ordering variable."""
    shape = tuple(int(s) for s in tensor.shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(tensor.dtype).itemsize
    if nbytes:
        handle = _shallow_copy(tensor)
        try:
            record = _b.engine_op(name, nbytes, dtype, shape, bool(is_average), prio,
                                  ndarray=handle, mxnet_api=_MXNET_API, op=op)
        except BaseException:
            check_call(_LIB.MXNDArrayFree(ctypes.c_void_p(handle)))
            raise
    else:
        record = _b.engine_op(name, 0, dtype, shape, bool(is_average), prio, op=op)
    mutable = (ctypes.c_void_p * 2)(tensor.handle.value, _name_var(name).handle.value)
    push_pull_fn, op_delete_fn = _ENTRY_POINTS
    rc = _PUSH_ASYNC_ND(push_pull_fn, record, op_delete_fn, ctypes.addressof(_CPU_CONTEXT), None, 0,
                        mutable, 2, ctypes.addressof(_CPU_PRIORITIZED), 0, _OP_NAME, False)
    if rc != 0:
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(op_delete_fn)(record)
        check_call(rc)


_ENTRY_POINTS = _b.engine_entry_points()


def wait_all(tensors) -> None:
    """Wait until every NDArray in ``tensors`` can be read (raises an operation's error)."""
    for t in tensors:
        t.wait_to_read()
