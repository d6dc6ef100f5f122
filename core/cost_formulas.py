"""Moved to :mod:`byteps.sync.cost_formulas` (each scheme's closed-form α-β-γ cost).

This module re-exports its names for one release and goes after the next one: import
``byteps.sync.cost_formulas``.
"""

from .sync.cost_formulas import *  # noqa: F403
