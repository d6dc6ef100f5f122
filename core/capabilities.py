"""Horovod's build queries (``horovod.common.basics``: ``mpi_built``, ``nccl_built``, ...),
answered for byteps, which every adapter re-exports so that a Horovod script's checks run.

byteps has no MPI, Gloo, oneCCL, DDL or ROCm backend, so those answer False. It is one wheel
that loads CUDA and NCCL at run time (docs/gpu.md "One wheel"): ``cuda_built`` and
``nccl_built`` say whether this process can use them now (:mod:`byteps.cuda`), which is what a
script asking them wants to know. ``nccl_built`` returns NCCL's integer version when the core's
NCCL stages can use the library (2.18 or later), as Horovod returns its NCCL version, else 0.
"""

from __future__ import annotations

from .cuda import cuda_available, nccl_status


def mpi_built() -> bool:
    """False: byteps does not use MPI (the launcher starts the processes, docs/launching.md)."""
    return False


def mpi_enabled() -> bool:
    """False: no MPI (Horovod: MPI is built and chosen at run time)."""
    return False


def mpi_threads_supported() -> bool:
    """False: no MPI."""
    return False


def gloo_built() -> bool:
    """False: byteps's collectives go through its own summation service and schemes."""
    return False


def gloo_enabled() -> bool:
    """False: no Gloo."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return False


def rocm_built() -> bool:
    """False: no ROCm support."""
    return False


def cuda_built() -> bool:
    """True when this process can reduce CUDA tensors (a CUDA runtime loaded and a device:
    :func:`byteps.cuda_status` says why not)."""
    return cuda_available()


def nccl_built() -> int:
    """NCCL's integer version (e.g. 22703) when the core's NCCL stages can use the NCCL
    library this process loads, else 0 (Horovod returns its NCCL version, or 0)."""
    status = nccl_status()
    return int(status.get("version") or 0) if status.get("stages_supported") else 0


#: Every query: what ``from byteps.capabilities import *`` gives, as each adapter re-exports them.
__all__ = ["mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
           "ccl_built", "ddl_built", "rocm_built", "cuda_built", "nccl_built"]
