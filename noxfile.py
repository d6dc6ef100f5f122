"""Test sessions of byteps (``python -m nox``; CI runs ``bash .ci/run``).

Sessions:
    lint   ruff over every Python tree.
    unit   the package + tests that need no framework (``-m "not slow and not <framework>..."``),
           and the files of the product wheel (no test hooks ship).
    torch  PyTorch 2.13 (CPU wheel from pip's local find-links) + the torch tests and examples.
    tensorflow  tensorflow-cpu 2.21 (Keras 3) + the TensorFlow/Keras tests and examples.
    mxnet  MXNet 1.9.1 with numpy 1.23.5 (pins only in this session's own venv) + the MXNet
           tests, the conformance suite for MXNet and the Gluon example.
    bench  the benchmark lab's tests (emulated cluster needs root) + python -m benchmarks --quick.
    engines  launching through the engines users run (ssh hosts, Slurm, Kubernetes manifests,
           torchrun environments, Ray): same install as torch plus the ``engines`` extra;
           the tests that need sshd/Slurm/root skip with the reason where those are missing.
    slow   same install as torch; the long-running suites (``pytest -m slow``); not run by CI.

The first session of a run builds the byteps test wheel (the C++ core through
scikit-build-core, about 75 s on a quiet 2-core machine) into
``.nox/_wheels/<digest of the sources>/test``; every session installs that wheel with its
extras. Pass extra pytest arguments after ``--``:
``python -m nox -s unit -- -k launcher``.

Two wheels per source state, because the test hooks must not ship: the sessions install the
*test* wheel, built with the CMake option ``BYTEPS_BUILD_TESTING=ON`` (it adds the extension
module ``byteps._core_testing``, the C++ core's test hooks that tests/testing_hooks.py hands
out; ``REQUIRE_CORE_TESTING=1`` makes a missing one an error, not a skip); the unit session
also builds the *product* wheel, option off, what a user's ``pip install .`` builds, and
tests/test_wheel_contents.py lists its files (``PRODUCT_WHEEL`` names it).

The second build costs little because both build in one CMake build folder of their own,
``build/nox-<wheel tag>`` (a user's ``pip install .`` keeps the default ``build/<wheel tag>``,
which never sees the option on), from one build environment of their own,
``.nox/_wheels/build-env`` (pyproject.toml's build requirements, cmake and ninja; made once),
without pip's build isolation: an isolated build runs scikit-build-core from a new temporary
environment each time, and scikit-build-core then clears the CMake cache and every object
file, so each wheel would compile the whole core again. Each build passes the option
explicitly (neither inherits the other's); the product build reconfigures and relinks only
what the option changes. Measured on 2 cores shared with other builds (load 12-15): the
test wheel from nothing 688 s, then the product wheel 3.9 s and the test wheel again 4.2 s;
with pip's build isolation (load 6-13) the second wheel compiled everything again: 381 s, then
514 s. A later source state recompiles only the files it changed.
"""

from __future__ import annotations

import glob
import hashlib
import os

import nox
import nox.project

nox.options.sessions = ["lint", "unit", "torch", "tensorflow", "mxnet", "bench", "engines"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
# stdlib venv + pip: torch must come from pip's configured find-links (never uv).
nox.options.default_venv_backend = "venv"

RUFF = "ruff==0.17.5"
TORCH = "torch==2.13.0"
# tensorflow-cpu, not tensorflow (the full wheel); plain `tf-keras` would pull the latter in.
TENSORFLOW = "tensorflow-cpu==2.21.0"
# MXNet 1.9 uses np.bool (gone in NumPy 1.24): both pins live only in the mxnet session's venv.
MXNET = ["mxnet==1.9.1", "numpy==1.23.5"]
LINT_PATHS = ["core", "adapters", "server", "tests", "examples", "benchmarks", "noxfile.py"]
# pytest exit code 5 = no tests collected: not a failure for a marker-selected session.
PYTEST_OK = [0, 5]


def _build_env(session: nox.Session) -> None:
    """Environment for building the C++ core inside the session."""
    session.env["CMAKE_BUILD_PARALLEL_LEVEL"] = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")


#: What the wheel is built from: a change here builds a new one.
WHEEL_SOURCES = ("core", "adapters", "server", "CMakeLists.txt", "pyproject.toml")


def _source_digest() -> str:
    h = hashlib.sha256()
    for top in WHEEL_SOURCES:
        paths = [top] if os.path.isfile(top) else sorted(
            os.path.join(d, f) for d, dirs, files in os.walk(top) for f in files
            if "__pycache__" not in d)
        for path in paths:
            h.update(path.encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


#: Where every wheel is built (see the module docstring): the build environment, made once.
BUILD_ENV = os.path.join(".nox", "_wheels", "build-env")
#: What the build environment holds besides pyproject.toml's build requirements.
BUILD_TOOLS = ["cmake>=3.18", "ninja"]


def _build_python(session: nox.Session) -> str:
    """The Python of :data:`BUILD_ENV`, made (again) where it is missing or its requirements
    (pyproject.toml's ``[build-system] requires`` plus :data:`BUILD_TOOLS`) changed."""
    wanted = nox.project.load_toml("pyproject.toml")["build-system"]["requires"] + BUILD_TOOLS
    python = os.path.abspath(os.path.join(BUILD_ENV, "bin", "python"))
    stamp = os.path.join(BUILD_ENV, "byteps-build-requires.txt")
    try:
        with open(stamp) as f:
            current = f.read().split("\n")
    except FileNotFoundError:
        current = None
    if current != wanted or not os.path.exists(python):
        session.run("python", "-m", "venv", "--clear", BUILD_ENV)
        session.run(python, "-m", "pip", "install", *wanted, external=True)
        with open(stamp, "w") as f:
            f.write("\n".join(wanted))
    return python


def _wheel(session: nox.Session, kind: str) -> str:
    """The byteps wheel of this source state, built once (in ``.nox/_wheels/<digest>/<kind>``)
    and shared by every session: ``kind`` "test" (``BYTEPS_BUILD_TESTING=ON``: with the test
    hooks) or "product" (option off: what ``pip install .`` ships). Both build from
    :data:`BUILD_ENV` in ``build/nox-<wheel tag>``, so the second reuses the first's objects."""
    _build_env(session)
    out = os.path.join(".nox", "_wheels", _source_digest(), kind)
    wheels = glob.glob(os.path.join(out, "byteps-*.whl"))
    if not wheels:
        testing = "ON" if kind == "test" else "OFF"
        session.run(_build_python(session), "-m", "pip", "wheel", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", out,
                    "-C", "build-dir=build/nox-{wheel_tag}",
                    "-C", f"cmake.define.BYTEPS_BUILD_TESTING={testing}", ".", external=True)
        wheels = glob.glob(os.path.join(out, "byteps-*.whl"))
    return os.path.abspath(wheels[0])


def _install_byteps(session: nox.Session, extras: str) -> None:
    """Install byteps with ``extras`` from the test wheel of this source state (built once per
    run, not once per session: pip builds each install in a fresh isolated environment)."""
    wheel = _wheel(session, "test")
    session.install(f"{wheel}[{extras}]")
    # A reused venv may hold an earlier build of the same version: replace it.
    session.install("--force-reinstall", "--no-deps", wheel)
    # tests/testing_hooks.py: a missing byteps._core_testing fails the tests, never skips them
    session.env["REQUIRE_CORE_TESTING"] = "1"


def _install_torch(session: nox.Session) -> None:
    _build_env(session)
    session.install(TORCH)  # first, so the project's torch extra is already satisfied
    _install_byteps(session, "torch,examples,test")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check over core, adapters, server, tests, examples, benchmarks, noxfile.py."""
    session.install(RUFF)
    session.run("ruff", "check", *LINT_PATHS, *session.posargs)


@nox.session
def unit(session: nox.Session) -> None:
    """Build and install byteps, run the tests that need no framework."""
    _build_env(session)
    _install_byteps(session, "test")
    # tests/test_wheel_contents.py lists what a user's `pip install .` would ship
    session.env["PRODUCT_WHEEL"] = _wheel(session, "product")
    session.run("pytest", "-m",
                "not slow and not torch and not tensorflow and not mxnet and not bench "
                "and not engines",
                "tests", *session.posargs,
                success_codes=PYTEST_OK)


@nox.session
def torch(session: nox.Session) -> None:
    """PyTorch adapter tests and the example smoke runs (CPU)."""
    _install_torch(session)
    session.run("pytest", "-m", "torch and not slow and not bench", "tests", *session.posargs,
                success_codes=PYTEST_OK)


@nox.session
def tensorflow(session: nox.Session) -> None:
    """TensorFlow / Keras 3 adapter tests, the conformance suite and the example runs (CPU)."""
    _build_env(session)
    session.install(TENSORFLOW)
    _install_byteps(session, "tensorflow,examples,test")
    session.run("pytest", "-m", "tensorflow and not slow", "tests", *session.posargs,
                success_codes=PYTEST_OK)


@nox.session
def mxnet(session: nox.Session) -> None:
    """MXNet 1.9 adapter tests, the conformance suite for MXNet and the Gluon example (CPU)."""
    _build_env(session)
    session.install(*MXNET)
    # The extra repeats the pins, so the resolver picks example/test packages that work with
    # numpy 1.23.5 (e.g. a scikit-learn that still supports it).
    _install_byteps(session, "mxnet,examples,test")
    session.run("pytest", "-m", "mxnet and not slow", "tests", *session.posargs,
                success_codes=PYTEST_OK)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark lab (benchmarks/, not installed): its tests, then
    `python -m benchmarks --quick` (report to a temp dir).

    nox runs in the repository root, so `python -m benchmarks` finds the package there (and
    hands the root on to its workers through PYTHONPATH); pytest gets it from conftest.py.
    """
    _build_env(session)
    session.install(TORCH)
    # examples: the compression benchmark trains examples/torch/train_digits.py (scikit-learn)
    _install_byteps(session, "torch,bench,test,examples")
    session.run("pytest", "-m", "bench", "tests", *session.posargs, success_codes=PYTEST_OK)
    out = session.create_tmp()
    session.run("python", "-m", "benchmarks", "--quick", "--out",
                os.path.join(out, "performance.md"), "--img-dir", os.path.join(out, "img"))


@nox.session
def engines(session: nox.Session) -> None:
    """Launching on ssh hosts, Slurm, Kubernetes (manifests and their contract), torchrun-style
    environments and Ray (``pytest -m engines``)."""
    _build_env(session)
    session.install(TORCH)
    _install_byteps(session, "torch,examples,test,engines")
    session.run("pytest", "-m", "engines and not slow", "tests", *session.posargs,
                success_codes=PYTEST_OK)


@nox.session
def slow(session: nox.Session) -> None:
    """Long-running suites (not part of CI's default sessions)."""
    _install_torch(session)
    session.run("pytest", "-m", "slow", "tests", *session.posargs, success_codes=PYTEST_OK)
