"""push_pull of any array with ``__dlpack__`` (docs/gpu.md "DLPack arrays"): NumPy, torch,
CuPy, JAX, ... without a framework adapter.

``byteps.push_pull(array)`` sums the array over every worker process (and averages it by
default) in place; host arrays take the host pipeline, CUDA arrays the device stages
(COPY_D2H ... COPY_H2D). The array is read through the DLPack protocol: a capsule from
``array.__dlpack__()`` (DLPack 1.0 with its read-only flag where the producer supports it),
kept alive until the operation is synchronized, so the memory stays valid; nothing is copied
on the host side.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any, Dict, Optional

from . import basics
from .errors import InvalidArgumentError, InvalidTypeError

# DLPack's ABI (dlpack.h, v0.8 and v1.0): the structs a capsule points to.
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                9: "vpi", 10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi"}
FLAG_READ_ONLY = 1
#: (type code, bits) -> byteps dtype name (lanes must be 1)
DTYPES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64",
          (0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64"}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):  # DLManagedTensor (capsule "dltensor")
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _Versioned(ctypes.Structure):  # DLManagedTensorVersioned (capsule "dltensor_versioned")
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class ArrayView:
    """What byteps needs of a DLPack array: address, bytes, dtype, shape, device, writability.
    ``capsule`` keeps the producer's memory alive (not consumed: its destructor releases it)."""

    def __init__(self, capsule, tensor: _Tensor, read_only: bool):
        self.capsule = capsule
        self.address = (tensor.data or 0) + tensor.byte_offset
        self.shape = [tensor.shape[i] for i in range(tensor.ndim)]
        self.strides = ([tensor.strides[i] for i in range(tensor.ndim)]
                        if tensor.strides else None)
        self.code_bits = (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
        self.device_type = tensor.device.device_type
        self.device_id = tensor.device.device_id
        self.read_only = read_only
        self.count = 1
        for d in self.shape:
            self.count *= d


def _export(obj, stream) -> Any:
    """``obj.__dlpack__`` asking for DLPack 1.0 (read-only flag) where the producer supports
    it; ``stream``: the consumer stream of a CUDA array (None for host arrays)."""
    kwargs = {} if stream is None else {"stream": stream}
    try:
        return obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer before DLPack 1.0: no max_version keyword
        return obj.__dlpack__(**kwargs)


def view(obj, fn: str = "push_pull") -> ArrayView:
    """The DLPack view of ``obj``, checked for what push_pull can reduce.

    Raises:
        byteps.errors.InvalidTypeError: no ``__dlpack__``; a device other than host or CUDA
            memory; an unsupported dtype (supported: :data:`DTYPES`' names).
        byteps.errors.InvalidArgumentError: not C-contiguous (strided views, e.g. a transpose).
    """
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise InvalidTypeError(f"{fn}: {type(obj).__name__} is not a DLPack array (no "
                               f"__dlpack__/__dlpack_device__)")
    device_type, device_id = (int(v) for v in obj.__dlpack_device__())
    if device_type not in (KDL_CPU, KDL_CUDA_HOST, KDL_CUDA, KDL_CUDA_MANAGED):
        raise InvalidTypeError(f"{fn}: arrays on {DEVICE_NAMES.get(device_type, device_type)} "
                               f"are not supported (host memory and CUDA devices are)")
    stream = None
    if device_type in (KDL_CUDA, KDL_CUDA_MANAGED):
        _require_cuda(fn)
        # The producer orders its pending work on the array before this stream, the one
        # COPY_D2H copies on (DLPack's stream argument): no device-wide synchronize.
        stream = basics.copy_stream("cuda", device_id)
    try:
        capsule = _export(obj, stream)
    except BufferError as err:  # e.g. NumPy refuses a read-only array without DLPack 1.0
        raise InvalidArgumentError(f"{fn}: the array cannot be exported: {err}") from None
    if _capsule_valid(capsule, b"dltensor_versioned"):
        managed = _Versioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned"))
        v = ArrayView(capsule, managed.dl_tensor, bool(managed.flags & FLAG_READ_ONLY))
    elif _capsule_valid(capsule, b"dltensor"):
        managed = _Managed.from_address(_capsule_pointer(capsule, b"dltensor"))
        v = ArrayView(capsule, managed.dl_tensor, False)
    else:
        raise InvalidTypeError(f"{fn}: {type(obj).__name__}.__dlpack__ returned no DLPack "
                               f"capsule (or one already consumed)")
    code, bits, lanes = v.code_bits
    if lanes != 1 or (code, bits) not in DTYPES:
        raise InvalidTypeError(f"{fn}: unsupported DLPack dtype (code {code}, {bits} bits, "
                               f"{lanes} lanes); supported: {', '.join(DTYPES.values())}")
    if v.strides is not None and v.count > 1:
        expect = 1
        for dim, stride in zip(reversed(v.shape), reversed(v.strides)):
            if dim != 1 and stride != expect:
                raise InvalidArgumentError(
                    f"{fn}: the array is not C-contiguous (shape {v.shape}, strides "
                    f"{v.strides} elements); pass a contiguous copy")
            expect *= dim
    return v


def _require_cuda(fn: str) -> None:
    from .cuda import cuda_status

    s = cuda_status()
    if not s["available"]:
        raise InvalidTypeError(f"{fn}: a CUDA array, but CUDA support is off: {s['reason']}")


_handles: Dict[int, tuple] = {}  # handle -> (result object, the views kept alive)
_handles_lock = threading.Lock()
_names = itertools.count()


def push_pull_async(obj, average: bool = True, name: Optional[str] = None,
                    priority: Optional[int] = None, out=None) -> int:
    """Start summing the DLPack array ``obj`` over every worker process (see
    :func:`push_pull`). Returns a handle for :func:`synchronize` / :func:`poll`; ``obj`` (and
    ``out``) must not be written or freed until then."""
    fn = "push_pull_async"
    src = view(obj, fn)
    dst = src if out is None else view(out, fn)
    if dst.read_only:
        raise InvalidArgumentError(
            f"{fn}: the {'array' if out is None else 'out array'} is read-only and push_pull "
            f"writes the result in place" + ("; pass a writable out= array" if out is None
                                             else ""))
    if out is not None and (dst.shape != src.shape or dst.code_bits != src.code_bits or
                            (dst.device_type, dst.device_id) != (src.device_type,
                                                                 src.device_id)):
        raise InvalidArgumentError(f"{fn}: out must have the array's shape, dtype and device "
                                   f"({src.shape} vs {dst.shape})")
    if name is None:
        name = f"dlpack.{next(_names)}"
    dtype = DTYPES[src.code_bits[:2]]
    on_cuda = src.device_type in (KDL_CUDA, KDL_CUDA_MANAGED)
    nbytes = src.count * src.code_bits[1] // 8
    # checks the name and priority, then BYTEPS_SYNC=auto's declaration (docs/schemes.md)
    handle = basics.push_pull_async(
        name, src.address, dst.address, nbytes, dtype, src.shape, bool(average), priority, 0,
        device="cuda" if on_cuda else "cpu", device_id=src.device_id if on_cuda else 0)
    with _handles_lock:
        _handles[handle] = (obj if out is None else out, src, dst)
    return handle


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (:func:`byteps.basics.poll`)."""
    return basics.poll(handle)


def synchronize(handle: int, timeout: Optional[float] = None):
    """Wait for :func:`push_pull_async`'s operation; returns its result array (the input, or
    ``out``), written. Raises the operation's error (a :mod:`byteps.errors` class)."""
    try:
        basics.wait(handle, timeout)
    finally:
        with _handles_lock:
            entry = _handles.pop(handle, None)
    return entry[0] if entry else None


def push_pull(obj, average: bool = True, name: Optional[str] = None,
              priority: Optional[int] = None, out=None):
    """Sum a DLPack array over every worker process, in place.

    Args:
        obj: any object with ``__dlpack__`` and ``__dlpack_device__`` (NumPy, torch, CuPy, JAX
            ...): C-contiguous, in host memory or on a CUDA device, of a dtype of
            :data:`byteps.basics.SUPPORTED_DTYPES`.
        average: divide the sum by the number of worker processes (floor division for
            integers). Default True.
        name: the tensor's name, the same on every rank; default: ``dlpack.<n>`` in call order
            (so every rank must make the same calls in the same order).
        priority: larger runs first; None: by first use.
        out: a writable array of the same shape, dtype and device to write the result to
            (needed for a read-only ``obj``, e.g. a JAX array); default: ``obj`` itself.

    Returns:
        the array written (``obj`` or ``out``), once every worker's contribution is in.

    Raises:
        byteps.errors.InvalidTypeError: not a DLPack array; unsupported dtype or device; a CUDA
            array while CUDA support is off (:func:`byteps.cuda_status` says why).
        byteps.errors.InvalidArgumentError: not C-contiguous; read-only without ``out``; an
            ``out`` of another shape, dtype or device; a name first used otherwise.
        byteps.errors.NotInitializedError: before ``init()``; and the operation's errors.
    """
    return synchronize(push_pull_async(obj, average, name, priority, out))
