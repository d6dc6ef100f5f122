"""Moved to :mod:`byteps.launch.contract` (the environment of each role of a job).

This module re-exports its names for one release and goes after the next one: import
``byteps.launch.contract``.
"""

from .launch.contract import *  # noqa: F403
