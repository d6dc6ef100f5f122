"""Moved to :mod:`byteps.launch.slurm_task` (one worker task of a Slurm job step).

This module re-exports its names, and a hand-written ``srun ... python -m byteps.slurm_task --
COMMAND`` still runs it, for one release: it goes after the next one. Use ``python -m
byteps.launch.slurm_task``.
"""

import sys

from .launch.slurm_task import *  # noqa: F403
from .launch.slurm_task import main

if __name__ == "__main__":
    sys.exit(main())
