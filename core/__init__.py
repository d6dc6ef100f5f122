"""byteps: data-parallel training through a parameter-server summation service.

Use a framework adapter: ``import byteps.torch as bps``, or, for any array with ``__dlpack__``
(NumPy, CuPy, JAX, torch), ``byteps.push_pull(array)`` after ``byteps.basics.init()``. This
package holds what all adapters share: the runtime API at the top (:mod:`byteps.basics`,
:mod:`byteps.errors`, :mod:`byteps.knobs`, :mod:`byteps.naming`, :mod:`byteps.telemetry`,
:mod:`byteps.dlpack`, :mod:`byteps.cuda`: CUDA support loaded at run time,
``byteps.cuda_available()``; :mod:`byteps.p2p`, :mod:`byteps.doctor`), the synchronisation
schemes, the cost model that picks one per tensor size (``byteps.cost_model()``,
docs/schemes.md), compression and asynchronous training (:mod:`byteps.sync`), the launchers
(:mod:`byteps.launch`: ``bpslaunch``, ``byteps.ray.RayExecutor``) and the what-if simulator
(:mod:`byteps.sim`).
"""

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
from .sync import cost_model as _cost_model

__version__ = "0.3.0"


def cost_model(refresh: bool = False) -> _cost_model.CostModel:
    """The job's cost model (docs/schemes.md "The cost model"): :func:`byteps.sync.cost_model.get`.

    Collective when it measures (the first call after ``init()``, or ``refresh=True``): call it
    on every rank at the same point. This function also carries the cost model's API as
    attributes: ``byteps.cost_model.get(refresh=False)``, ``.measure(env=None, ...)``,
    ``.choose(nbytes)``, ``.CostModel``, ``.Interval``, ``.CANDIDATES``, ``.MAX_BYTES``,
    ``.VARIABLES``, ``.feasible_schemes`` (:mod:`byteps.sync.cost_model`, where they are
    defined).

    Args:
        refresh (bool): measure again even if this job's model exists. Default False.

    Returns:
        byteps.sync.cost_model.CostModel: the parameters and the choice per tensor size.

    Raises:
        as :func:`byteps.sync.cost_model.measure` (``NotInitializedError`` before ``init()``
        when something must be measured, ``ConfigError`` for a malformed ``BYTEPS_COST_*``).
    """
    return _cost_model.get(refresh)


cost_model.get = _cost_model.get
cost_model.measure = _cost_model.measure
cost_model.choose = _cost_model.choose
cost_model.CostModel = _cost_model.CostModel
cost_model.Interval = _cost_model.Interval
cost_model.CANDIDATES = _cost_model.CANDIDATES
cost_model.MAX_BYTES = _cost_model.MAX_BYTES
cost_model.VARIABLES = _cost_model.VARIABLES
cost_model.feasible_schemes = _cost_model.feasible_schemes


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
