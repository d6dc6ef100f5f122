"""Moved to :mod:`byteps.sync.schemes` (the synchronization schemes and BYTEPS_SYNC).

This module re-exports its names for one release and goes after the next one: import
``byteps.sync.schemes``.
"""

from .sync.schemes import *  # noqa: F403
