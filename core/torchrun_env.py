"""Moved to :mod:`byteps.launch.torchrun_env` (a torchrun-style environment mapped onto byteps'
contract; ``TorchrunEnvError``).

This module re-exports its names for one release and goes after the next one: import
``byteps.launch.torchrun_env``.
"""

from .launch.torchrun_env import *  # noqa: F403
