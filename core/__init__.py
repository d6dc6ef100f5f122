"""byteps: data-parallel training through a parameter-server summation service.

Use a framework adapter: ``import byteps.torch as bps``, or, for any array with ``__dlpack__``
(NumPy, CuPy, JAX, torch), ``byteps.push_pull(array)`` after ``byteps.basics.init()``. This
package holds what all adapters share: the basics (:mod:`byteps.basics`), the errors
(:mod:`byteps.errors`), CUDA support loaded at run time (``byteps.cuda_available()``), the
cost model that picks a synchronisation scheme per tensor size (``byteps.cost_model()``,
docs/schemes.md) and the launcher (``bpslaunch``).
"""

from . import cost_model  # noqa: F401  (callable: byteps.cost_model() is cost_model.get)
from .errors import (  # noqa: F401
    BytePSError,
    BytePSTimeoutError,
    ConfigError,
    InternalError,
    InvalidArgumentError,
    InvalidTypeError,
    JobFailedError,
    MismatchError,
    NotInitializedError,
    PeerLostError,
    UsageError,
)

__version__ = "0.3.0"


# The DLPack front and CUDA support are imported at first use: importing byteps stays cheap
# and loads no CUDA.


def push_pull(obj, average=True, name=None, priority=None, out=None):
    """Sum a DLPack array (NumPy, torch, CuPy, JAX ...) over every worker, in place:
    :func:`byteps.dlpack.push_pull`."""
    from .dlpack import push_pull as impl

    return impl(obj, average, name, priority, out)


def push_pull_async(obj, average=True, name=None, priority=None, out=None):
    """Start :func:`push_pull`; returns a handle (:func:`byteps.dlpack.push_pull_async`)."""
    from .dlpack import push_pull_async as impl

    return impl(obj, average, name, priority, out)


def synchronize(handle, timeout=None):
    """Wait for :func:`push_pull_async`; returns the array written
    (:func:`byteps.dlpack.synchronize`)."""
    from .dlpack import synchronize as impl

    return impl(handle, timeout)


def poll(handle):
    """True when :func:`push_pull_async`'s operation finished (:func:`byteps.dlpack.poll`)."""
    from .dlpack import poll as impl

    return impl(handle)


def cuda_available():
    """True when CUDA tensors can be reduced here (:func:`byteps.cuda.cuda_available`)."""
    from .cuda import cuda_available as impl

    return impl()


def cuda_status():
    """Whether CUDA support is on, and why not (:func:`byteps.cuda.cuda_status`)."""
    from .cuda import cuda_status as impl

    return impl()
