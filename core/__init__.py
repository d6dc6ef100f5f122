"""byteps: data-parallel training through a parameter-server summation service.

Use a framework adapter: ``import byteps.torch as bps``. This package holds what all adapters
share: the basics (:mod:`byteps.basics`), the errors (:mod:`byteps.errors`) and the launcher
(``bpslaunch``).
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

__version__ = "0.3.0"
