"""The synchronization schemes of a tensor (docs/schemes.md) as the Python layer sees them.

A tensor is summed across worker machines by one scheme, part of its declaration
(:func:`byteps.basics.declare`'s ``sync``; the same on every rank, checked by the scheduler):

* ``"ps"``: the summation service (servers sum every worker's push; the default);
* ``"ring"``: ring all-reduce among the worker machines' local roots (no server);
* ``"tree"``: FlexTree-style tree all-reduce of width ``BYTEPS_TREE_WIDTH``;
* ``"hips"``: hierarchical summation servers.

``BYTEPS_SYNC`` gives the scheme of every tensor not declared with one. ``BYTEPS_SYNC=auto``
chooses per tensor, at its first push_pull, through the cost model's
``byteps.cost_model.choose(nbytes) -> scheme name`` (:func:`auto_choice`); without a cost model
``init()`` fails with :class:`byteps.errors.ConfigError` rather than guess.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

from ..errors import ConfigError, InvalidArgumentError, InvalidTypeError

#: the schemes a tensor may be declared with
SCHEMES = ("ps", "ring", "tree", "hips")
#: BYTEPS_SYNC's values: the schemes and ``auto``
SYNC_VALUES = SCHEMES + ("auto",)


def check_scheme(value, fn: str) -> str:
    """``value`` as a scheme name (one of :data:`SCHEMES`).

    Raises:
        byteps.errors.InvalidTypeError: not a str.
        byteps.errors.InvalidArgumentError: not one of :data:`SCHEMES`.
    """
    if not isinstance(value, str):
        raise InvalidTypeError(f"{fn}: sync must be a str, got {type(value).__name__}")
    if value not in SCHEMES:
        raise InvalidArgumentError(f"{fn}: sync={value!r} is not a scheme; expected one of "
                                   f"{', '.join(SCHEMES)}")
    return value


def auto_chooser(module: str = "byteps.sync.cost_model") -> Callable[[int], str]:
    """The cost model's ``choose(nbytes) -> scheme name``, for ``BYTEPS_SYNC=auto``.

    Raises:
        byteps.errors.ConfigError: ``module`` cannot be imported or has no callable ``choose``.
    """
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"BYTEPS_SYNC=auto chooses each tensor's scheme with the cost model "
                          f"({module}.choose), which this installation lacks ({exc}); set "
                          f"BYTEPS_SYNC to one of {', '.join(SCHEMES)}") from None
    choose = getattr(mod, "choose", None)
    if not callable(choose):
        raise ConfigError(f"BYTEPS_SYNC=auto: {module} has no choose(nbytes) function; set "
                          f"BYTEPS_SYNC to one of {', '.join(SCHEMES)}")
    return choose


def auto_choice(choose: Callable[[int], str], name: str, nbytes: int) -> str:
    """The scheme ``choose`` gives a tensor of ``nbytes`` bytes, checked.

    Raises:
        byteps.errors.ConfigError: ``choose`` returned something that is not a scheme.
    """
    scheme = choose(int(nbytes))
    if scheme not in SCHEMES:
        raise ConfigError(f"BYTEPS_SYNC=auto: the cost model chose {scheme!r} for tensor "
                          f"{name!r} ({nbytes} bytes), which is not one of "
                          f"{', '.join(SCHEMES)}")
    return scheme


def sync_setting(knob_values: dict) -> Optional[str]:
    """``BYTEPS_SYNC`` from the core's knob values (validated by the registry)."""
    return knob_values.get("BYTEPS_SYNC")
