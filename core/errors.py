"""Typed exceptions raised by byteps (docs/architecture.md §8).

Every exception byteps raises -- from the core, the Python layer and the framework adapters,
invalid arguments included -- is a subclass of :class:`BytePSError`, so one
``except byteps.BytePSError`` catches them all. Where a standard exception fits, the class also
derives from it, so ``except ValueError``, ``except TypeError`` or ``except TimeoutError`` keeps
working in user code.

Exceptions: ``ImportError`` when a framework adapter cannot be imported (missing or too old
framework), ``NotImplementedError`` from the abstract ``Compressor`` methods (for subclasses to
override), and the command line tools' own usage errors (``bpslaunch``: ``LaunchError``).
"""

from typing import Optional


class BytePSError(RuntimeError):
    """Base class of every error raised by byteps."""


class InvalidArgumentError(BytePSError, ValueError):
    """An argument has the right type but a value the API does not accept.

    E.g. an empty tensor name, ``root_rank`` out of ``[0, size())``, an unknown or already
    synchronised handle, a second operation on a name that is still in flight, a tensor whose
    elements share memory for an in-place operation. The message names the function and the
    argument.
    """


class InvalidTypeError(BytePSError, TypeError):
    """An argument has a type the API does not accept.

    E.g. not a tensor, a tensor dtype the summation service does not support (bool, int16,
    complex...; the message lists the supported ones), a GPU or sparse tensor (this build
    reduces dense CPU tensors only), a name that is not a ``str``.
    """


class UsageError(BytePSError):
    """A call the API does not allow at this point of the program.

    E.g. ``optimizer.zero_grad()`` between ``loss.backward()`` and ``optimizer.step()`` while
    the gradients are still being reduced, or more backward passes than
    ``backward_passes_per_step`` before a step. The message says what to change.
    """


class ConfigError(BytePSError, ValueError):
    """A BYTEPS_* / DMLC_* variable is missing, malformed or out of range.

    Raised by ``init()`` before any thread or socket starts; the message names the variable,
    the value and what is accepted.
    """


class MismatchError(BytePSError, ValueError):
    """Tensors with one name disagree across ranks (name, dtype, shape or size).

    Raised on every rank that takes part in the operation.
    """


class PeerLostError(BytePSError, ConnectionError):
    """A peer (worker, server or scheduler) died or its connection broke.

    The message names the peer's role, rank and address, and the operation that failed.
    """


class BytePSTimeoutError(BytePSError, TimeoutError):
    """An operation or rendezvous did not finish within ``BYTEPS_TIMEOUT`` seconds."""


class NotInitializedError(BytePSError):
    """The API was called before ``init()`` or after ``shutdown()``."""


class InternalError(BytePSError):
    """An OS error or a bug in byteps; the message says which."""


class JobFailedError(BytePSError):
    """A process of a job that byteps started through an engine (:mod:`byteps.ray`) failed.

    A worker died (its Ray actor was killed or its process exited) or the function it ran
    raised, or a server or the scheduler exited with a non-zero status. The message names the
    role, the rank (a worker's global rank, a server's index), the node's address and what
    happened.

    Attributes:
        role (str | None): ``"worker"``, ``"server"`` or ``"scheduler"``.
        rank (int | None): the worker's global rank or the server's index (``None`` for the
            scheduler).
        cause (BaseException | None): the exception the worker's function raised (also the
            ``__cause__``); ``None`` when the process died or exited.
    """

    def __init__(self, message: str, role: Optional[str] = None, rank: Optional[int] = None,
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.role = role
        self.rank = rank
        self.cause = cause


#: Core status code name -> exception class (used by the C++ exception translator).
STATUS_CLASSES = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "CONFIG": ConfigError,
    "MISMATCH": MismatchError,
    "PEER_LOST": PeerLostError,
    "TIMEOUT": BytePSTimeoutError,
    "SHUTDOWN": NotInitializedError,
    "INTERNAL": InternalError,
}

__all__ = [
    "BytePSError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "UsageError",
    "ConfigError",
    "MismatchError",
    "PeerLostError",
    "BytePSTimeoutError",
    "NotInitializedError",
    "InternalError",
    "JobFailedError",
]
