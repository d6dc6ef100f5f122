"""``byteps._core_testing``, the C++ core's test hooks, for the tests that use them.

The hooks are an extension module of their own, built only with the CMake option
``BYTEPS_BUILD_TESTING=ON`` (``pip install -C cmake.define.BYTEPS_BUILD_TESTING=ON .``): every
nox session installs such a build; the wheel a user's ``pip install .`` builds leaves it out.

* :func:`core_testing` returns the module, for a test (or, called at module level, a test
  module) that calls the hooks itself;
* :func:`skip_without_core_testing` is a skipif mark for a test whose worker processes call them.

Where the module is missing, both skip with :data:`MISSING`; under nox (``REQUIRE_CORE_TESTING=1``,
set by noxfile.py) they raise ImportError instead, so no session skips the hooks' tests.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest

#: Why a test that needs the hooks skipped.
MISSING = ("byteps._core_testing (the core's test hooks) is not installed: this byteps was built "
           "without the CMake option BYTEPS_BUILD_TESTING=ON "
           "(pip install -C cmake.define.BYTEPS_BUILD_TESTING=ON .; every nox session does)")


def _load() -> ModuleType | None:
    """The module, or None where it is not installed (ImportError under REQUIRE_CORE_TESTING=1)."""
    try:
        from byteps import _core_testing
    except ImportError as exc:
        if os.environ.get("REQUIRE_CORE_TESTING") == "1":
            raise ImportError(f"REQUIRE_CORE_TESTING=1 but {MISSING} ({exc})") from exc
        return None
    return _core_testing


def core_testing() -> ModuleType:
    """``byteps._core_testing``; skips the calling test (or test module) with :data:`MISSING`
    where it is not installed."""
    module = _load()
    if module is None:
        pytest.skip(MISSING, allow_module_level=True)
    return module


def skip_without_core_testing():
    """A skipif mark: skip, with :data:`MISSING`, where ``byteps._core_testing`` is missing."""
    return pytest.mark.skipif(_load() is None, reason=MISSING)
