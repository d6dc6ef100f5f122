"""Shared by the bad-argument tests of the core and of each adapter (tests/test_errors.py,
tests/adapter_*/test_*_errors.py): one assertion and one single-process job environment."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable

import pytest

from byteps.errors import BytePSError


def check_raises(fn: Callable[[], object], flavour: type) -> BaseException:
    """``fn()`` raises a BytePSError that is also a ``flavour`` (ValueError, TypeError...);
    returns the exception."""
    with pytest.raises(BytePSError) as info:
        fn()
    assert isinstance(info.value, flavour), (type(info.value).__mro__, str(info.value))
    return info.value


@contextmanager
def single_process_job(shutdown: Callable[[], None]):
    """A 1-worker job in this process: no BYTEPS_*/DMLC_* variable of the caller's environment
    (restored afterwards), and ``shutdown()`` before and after."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(("BYTEPS_", "DMLC_"))}
    for k in saved:
        del os.environ[k]
    shutdown()
    try:
        yield
    finally:
        shutdown()
        os.environ.update(saved)
