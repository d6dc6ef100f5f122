"""Moved to :mod:`byteps.sync.compression` (the adapters' compression settings turned into the core's compressor kwargs).

This module re-exports its names for one release and goes after the next one: import
``byteps.sync.compression``.
"""

from .sync.compression import *  # noqa: F403
from .sync.compression import COMPRESSIBLE_DTYPES  # noqa: F401  (public, not in __all__)
