"""Moved to :mod:`byteps.sync.async_train` (asynchronous training's front).

This module re-exports its names for one release and goes after the next one: import
``byteps.sync.async_train``.
"""

from .sync.async_train import *  # noqa: F403
