"""Typed exceptions raised by byteps (DESIGN.md §5).

Every error from the core reaches Python as a subclass of :class:`BytePSError`. Where a
standard exception fits, the class also derives from it, so ``except ValueError`` or
``except TimeoutError`` keeps working in user code.
"""


class BytePSError(RuntimeError):
    """Base class of every error raised by byteps."""


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


#: Core status code name -> exception class (used by the C++ exception translator).
STATUS_CLASSES = {
    "INVALID_ARGUMENT": ValueError,
    "CONFIG": ConfigError,
    "MISMATCH": MismatchError,
    "PEER_LOST": PeerLostError,
    "TIMEOUT": BytePSTimeoutError,
    "SHUTDOWN": NotInitializedError,
    "INTERNAL": InternalError,
}

__all__ = [
    "BytePSError",
    "ConfigError",
    "MismatchError",
    "PeerLostError",
    "BytePSTimeoutError",
    "NotInitializedError",
    "InternalError",
]
