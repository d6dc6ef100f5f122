"""Every exception byteps raises is a ``byteps.BytePSError`` subclass, and the standard base
(``ValueError``, ``TypeError``...) still catches it where one fits.

* the class hierarchy and what ``byteps`` exports;
* a static check of the sources: no module of the public API (core, adapters, server) raises a
  bare builtin exception, and the pybind11 bindings throw no ``py::value_error`` & co. (the
  framework adapters are checked here too, since TensorFlow/MXNet are not installed in every
  session; their live checks are in ``tests/adapter_*/test_*_errors.py``);
* a walk over ``byteps.basics`` and ``byteps._core`` with bad arguments through the real core
  (a single-process job in this process).
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import numpy as np
import pytest
from error_checks import check_raises, single_process_job

import byteps
import byteps.basics as basics
from byteps import _core, errors
from byteps.errors import (
    BytePSError,
    InvalidArgumentError,
    InvalidTypeError,
    NotInitializedError,
    UsageError,
)

ROOT = Path(__file__).resolve().parent.parent

# =============================================================================================
# hierarchy
# =============================================================================================


def test_every_class_is_exported_and_a_bytepserror():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, BytePSError), name
        assert getattr(byteps, name) is cls, f"byteps.{name} is not exported"


def test_standard_bases_kept():
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidTypeError, TypeError)
    assert not issubclass(InvalidTypeError, ValueError)
    assert not issubclass(InvalidArgumentError, TypeError)
    assert issubclass(UsageError, RuntimeError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.BytePSTimeoutError, TimeoutError)
    assert issubclass(errors.PeerLostError, ConnectionError)


def test_status_classes():
    """Every core status code maps to a BytePSError subclass (the C++ exception translator)."""
    assert errors.STATUS_CLASSES["INVALID_ARGUMENT"] is InvalidArgumentError
    for code, cls in errors.STATUS_CLASSES.items():
        assert issubclass(cls, BytePSError), code


# =============================================================================================
# static: no bare builtin exception raised by the public API
# =============================================================================================

#: Command-line tools: their usage errors are their own (``LaunchError``, argparse), not the API's
#: (paths under core/).
_CLI_MODULES = {"launch/cli.py", "launch/supervise.py", "knobs.py"}

_BUILTIN_EXCEPTIONS = {name for name, obj in vars(builtins).items()
                       if isinstance(obj, type) and issubclass(obj, BaseException)}


def _api_sources():
    files = [p for p in sorted((ROOT / "core").rglob("*.py")) if "cpp" not in p.parts
             and str(p.relative_to(ROOT / "core")) not in _CLI_MODULES]
    for sub in ("adapters", "server"):
        files += sorted((ROOT / sub).rglob("*.py"))
    return files


def _bare_raises(path: Path):
    """(line, exception name, why allowed or None) of every ``raise <builtin>`` in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node, scopes):
        for child in ast.iter_child_nodes(node):
            inner = scopes
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = scopes + [child]
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in _BUILTIN_EXCEPTIONS:
                    found.append((child.lineno, exc.id, _allowed(exc.id, scopes)))
            visit(child, inner)

    visit(tree, [])
    return found


def _allowed(name, scopes):
    functions = [s for s in scopes if not isinstance(s, ast.ClassDef)]
    classes = [s.name for s in scopes if isinstance(s, ast.ClassDef)]
    if name == "ImportError" and not functions:
        return "import-time framework check"
    if name == "NotImplementedError" and any(c.endswith("Compressor") for c in classes):
        return "abstract Compressor method"
    return None


def test_sources_found():
    names = {str(p.relative_to(ROOT)) for p in _api_sources()}
    for expected in ("core/basics.py", "core/naming.py", "adapters/torch/ops.py",
                     "adapters/tensorflow/ops.py", "adapters/tensorflow/_keras/__init__.py",
                     "adapters/mxnet/ops.py", "server/__init__.py"):
        assert expected in names


@pytest.mark.parametrize("path", _api_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bare_builtin_raise(path):
    bad = [(line, name) for line, name, why in _bare_raises(path) if why is None]
    assert not bad, (f"{path.relative_to(ROOT)} raises builtin exceptions (use a "
                     f"byteps.errors class): {bad}")


def test_static_check_sees_a_bare_raise(tmp_path):
    """The check is not vacuous: it finds what it is looking for."""
    p = tmp_path / "m.py"
    p.write_text("import x\n"
                 "if x:\n    raise ImportError('old')\n"
                 "def f(a):\n    if a:\n        raise ValueError('bad')\n"
                 "    raise KeyError\n"
                 "class Compressor:\n    def compress(self):\n        raise NotImplementedError\n")
    got = [(name, why is None) for _, name, why in _bare_raises(p)]
    assert got == [("ImportError", False), ("ValueError", True), ("KeyError", True),
                   ("NotImplementedError", False)]


def test_bindings_throw_no_bare_python_exceptions():
    pattern = re.compile(r"throw\s+(py::(?!error_already_set)\w+|std::\w+)")
    hits = []
    for path in sorted((ROOT / "core" / "cpp" / "python").glob("*.cc")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.name}:{i}: {line.strip()}")
    assert not hits, "use ThrowInvalidArgument / ThrowInvalidType / ThrowStatus:\n" + \
        "\n".join(hits)


# =============================================================================================
# live: basics and _core with bad arguments
# =============================================================================================


_check = check_raises


@pytest.fixture(scope="module")
def job():
    """A 1-worker job in this process with a clean BYTEPS_*/DMLC_* environment."""
    with single_process_job(basics.shutdown):
        yield


def test_before_init(job):
    basics.shutdown()
    for fn in (basics.size, basics.rank, basics.local_size, basics.local_rank,
               lambda: basics.declare("x"),
               lambda: basics.push_pull_async("x", 0, 0, 0, "float32", [0], False),
               lambda: basics.poll(1), lambda: basics.wait(1)):
        err = _check(fn, RuntimeError)
        assert isinstance(err, NotInitializedError)


_BUF = np.zeros(4, dtype=np.float32)
_P = _BUF.ctypes.data

BASICS_CASES = [
    ("dtype-int16", lambda: basics.push_pull_async("e.a", _P, _P, 16, "int16", [4], False),
     TypeError),
    ("dtype-None", lambda: basics.push_pull_async("e.a", _P, _P, 16, None, [4], False),
     TypeError),
    ("name-int", lambda: basics.push_pull_async(5, _P, _P, 16, "float32", [4], False),
     TypeError),
    ("name-empty", lambda: basics.push_pull_async("", _P, _P, 16, "float32", [4], False),
     ValueError),
    ("ptr-str", lambda: basics.push_pull_async("e.a", "0x1", _P, 16, "float32", [4], False),
     TypeError),
    ("ptr-float", lambda: basics.push_pull_async("e.a", float(_P), _P, 16, "float32", [4],
                                                 False), TypeError),
    ("ptr-null", lambda: basics.push_pull_async("e.b", 0, 0, 16, "float32", [4], False),
     ValueError),
    ("nbytes-negative", lambda: basics.push_pull_async("e.a", _P, _P, -16, "float32", [4],
                                                       False), ValueError),
    ("nbytes-vs-shape", lambda: basics.push_pull_async("e.c", _P, _P, 12, "float32", [4],
                                                       False), ValueError),
    ("shape-None", lambda: basics.push_pull_async("e.a", _P, _P, 16, "float32", None, False),
     TypeError),
    ("shape-float", lambda: basics.push_pull_async("e.a", _P, _P, 16, "float32", [4.0],
                                                   False), TypeError),
    ("shape-negative", lambda: basics.push_pull_async("e.a", _P, _P, 16, "float32", [-4],
                                                      False), ValueError),
    ("priority-str", lambda: basics.push_pull_async("e.a", _P, _P, 16, "float32", [4], False,
                                                    priority="high"), TypeError),
    ("priority-huge", lambda: basics.push_pull_async("e.a", _P, _P, 16, "float32", [4], False,
                                                     priority=1 << 70), ValueError),
    ("version-str", lambda: basics.push_pull_async("e.a", _P, _P, 16, "float32", [4], False,
                                                   version="1"), TypeError),
    ("declare-int", lambda: basics.declare(5), TypeError),
    ("declare-empty", lambda: basics.declare(""), ValueError),
    ("poll-str", lambda: basics.poll("1"), TypeError),
    ("poll-unknown", lambda: basics.poll(987654), ValueError),
    ("wait-unknown", lambda: basics.wait(987654), ValueError),
    ("wait-timeout-str", lambda: basics.wait(987654, timeout="1s"), TypeError),
    ("resume-str", lambda: basics.resume("2", 1, 0), TypeError),
    ("resume-no-workers", lambda: basics.resume(0, 1, 0), ValueError),
    ("resume-rank", lambda: basics.resume(1, 0, 3), ValueError),
    ("core-priority-float", lambda: _core.push_pull_async("e.a", _P, _P, 16, "float32", [4],
                                                          False, 1.5), TypeError),
    ("core-dtype", lambda: _core.push_pull_async("e.a", _P, _P, 16, "int16", [4], False),
     TypeError),
]


@pytest.mark.parametrize("case", BASICS_CASES, ids=[c[0] for c in BASICS_CASES])
def test_basics_bad_arguments(job, case):
    _, fn, flavour = case
    basics.init()
    _check(fn, flavour)
    assert basics.is_initialized()  # a bad argument leaves the job usable


def test_changed_shape(job):
    """A name first used with one shape and then another: the core's INVALID_ARGUMENT status
    arrives as InvalidArgumentError."""
    basics.init()
    a = np.ones(4, dtype=np.float32)
    p = a.ctypes.data
    basics.wait(basics.push_pull_async("e.shape", p, p, a.nbytes, "float32", a.shape, False))
    err = _check(lambda: basics.push_pull_async("e.shape", p, p, 8, "float32", [2], False),
                 ValueError)
    assert isinstance(err, InvalidArgumentError) and "e.shape" in str(err)


_F32 = np.zeros(4, dtype=np.float32)

CORE_CASES = [
    ("log-level", lambda: _core.set_log_level("LOUD"), ValueError),
    ("sum-list", lambda: _core.reduce.sum_into([1.0], [2.0]), TypeError),
    ("sum-dtype-mismatch", lambda: _core.reduce.sum_into(np.zeros(4, np.float32),
                                                         np.zeros(4, np.float64)), TypeError),
    ("sum-int16", lambda: _core.reduce.sum_into(np.zeros(4, np.int16), np.zeros(4, np.int16)),
     TypeError),
    ("sum-dtype-name", lambda: _core.reduce.sum_into(_F32.copy(), _F32, dtype="int16"),
     TypeError),
    ("sum-dtype-int", lambda: _core.reduce.sum_into(_F32.copy(), _F32, dtype=4), TypeError),
    ("sum-size", lambda: _core.reduce.sum_into(np.zeros(4, np.float32), np.zeros(3, np.float32)),
     ValueError),
    ("sum-not-contiguous", lambda: _core.reduce.sum_into(np.zeros(8, np.float32)[::2], _F32),
     ValueError),
    ("sum-read-only", lambda: _core.reduce.sum_into(np.broadcast_to(_F32, (4,)), _F32),
     ValueError),
    ("sum3-list", lambda: _core.reduce.sum3(_F32.copy(), _F32, [0.0] * 4), TypeError),
    ("divide-zero", lambda: _core.reduce.divide(np.ones(4, np.int32), 0), ValueError),
    ("divide-str", lambda: _core.reduce.divide(np.ones(4, np.int32), "2"), TypeError),
    ("copy-size", lambda: _core.reduce.copy_streaming(np.zeros(4, np.uint8), np.zeros(5, np.uint8)),
     ValueError),
    ("force-isa", lambda: _core.reduce.force_isa("sse9"), ValueError),
]


@pytest.mark.parametrize("case", CORE_CASES, ids=[c[0] for c in CORE_CASES])
def test_core_bad_arguments(case):
    _, fn, flavour = case
    _check(fn, flavour)
