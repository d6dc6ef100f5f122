"""CUDA support, loaded at run time (docs/gpu.md "One wheel").

The core is never linked against the CUDA runtime or NCCL: the first call of
:func:`cuda_available` / :func:`cuda_status` opens ``libcudart.so`` (one a framework already
loaded into this process, else the framework's or the ``nvidia-*`` wheels' copy, else the
system's) and asks it for devices. Importing byteps loads nothing and costs nothing: only these
functions do, once per process (the answer is kept).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import threading
from typing import Dict, List, Optional

from .launch.contract import is_true

_lock = threading.Lock()
_cuda: Optional[Dict] = None
_nccl: Optional[Dict] = None

#: Directories a CUDA toolkit installs its libraries to when ld.so.cache does not know them.
SYSTEM_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/lib")


def _package_dirs(name: str) -> List[str]:
    """Directories of the top-level package ``name`` (found, not imported: no import cost)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [str(p) for p in spec.submodule_search_locations]


def _version_key(path: str):
    """Sort key: versioned sonames first, higher versions first (libcudart.so.13 before .12,
    before a bare libcudart.so), then the path."""
    m = re.search(r"\.so((?:\.\d+)*)$", path)
    nums = [int(n) for n in m.group(1).split(".") if n] if m else []
    return (not nums, [-n for n in nums], path)


def library_candidates(stem: str) -> List[str]:
    """Files that may be ``stem`` (``"libcudart"`` or ``"libnccl"``), best first: torch's own
    ``lib/`` directory (its kernels were built for that runtime), the ``nvidia-*`` wheels'
    (``nvidia/<component>/lib/``, CUDA 12 and 13 layouts), then :data:`SYSTEM_DIRS`. The
    system's library path (ld.so.cache, ``LD_LIBRARY_PATH``) is tried after these by the core.
    """
    found: List[str] = []
    for torch_dir in _package_dirs("torch"):
        found += sorted(glob.glob(os.path.join(torch_dir, "lib", stem + ".so*")), key=_version_key)
    wheel_files: List[str] = []
    for nvidia_dir in _package_dirs("nvidia"):
        wheel_files += glob.glob(os.path.join(nvidia_dir, "*", "lib", stem + ".so*"))
    found += sorted(wheel_files, key=_version_key)
    for d in SYSTEM_DIRS:
        found += sorted(glob.glob(os.path.join(d, stem + ".so*")), key=_version_key)
    seen, out = set(), []
    for f in found:
        if f not in seen and os.path.isfile(f):
            seen.add(f)
            out.append(f)
    return out


def cuda_status() -> Dict:
    """Whether this process can reduce CUDA tensors, and why not.

    Returns:
        dict: ``available`` (bool); ``reason`` (str, why not, e.g. "libcudart.so (the CUDA
        runtime) not found in ..." or "no CUDA device (...): cudaGetDeviceCount failed: ...";
        None when available); ``library`` (what was loaded); ``runtime_version`` and
        ``driver_version`` (CUDA's integers, e.g. 13000); ``device_count``.
        The first call loads the runtime; the answer is kept for the process (a machine whose
        driver is missing does not grow one). With ``BYTEPS_NCCL=1`` it loads NCCL too
        (:func:`nccl_status`), which the NCCL stages then find loaded.
    """
    global _cuda
    from . import _core  # here, not at import: importing byteps loads no CUDA

    with _lock:
        first = _cuda is None
        if first:
            _cuda = dict(_core.device.cuda_status(library_candidates("libcudart")))
        status = dict(_cuda)
    if first and status["available"] and is_true(_core.knob_values(None)["BYTEPS_NCCL"]):
        nccl_status()
    return status


def cuda_available() -> bool:
    """True when CUDA tensors can be reduced in this process (a CUDA runtime loaded and at
    least one device); :func:`cuda_status` says why not."""
    return bool(cuda_status()["available"])


def nccl_status() -> Dict:
    """NCCL, loaded as :func:`cuda_status` loads the runtime: {available, reason, library,
    version (NCCL's integer, e.g. 22703), min_version (what the stages need: 21800),
    stages_supported (bool)}. NCCL is what the stages among the GPUs of one machine use
    (``BYTEPS_NCCL=1``, version 2.18 or later); loading it needs no GPU."""
    global _nccl
    from . import _core

    with _lock:
        if _nccl is None:
            _nccl = dict(_core.device.nccl_status(library_candidates("libnccl")))
        return dict(_nccl)


def describe(status: Optional[Dict] = None) -> str:
    """One line for ``python -m byteps.doctor``: CUDA on or off, and why (``status``: a
    :func:`cuda_status` answer; default: this process's)."""
    s = cuda_status() if status is None else status
    if s["available"]:
        return (f"CUDA: on, {s['device_count']} device(s), runtime {s['runtime_version']}, "
                f"driver {s['driver_version']} ({s['library']})")
    return f"CUDA: off: {s['reason']}"
