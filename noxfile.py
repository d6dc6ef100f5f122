"""Test sessions of byteps (``python -m nox``; CI runs ``bash .ci/run``).

Sessions:
    lint   ruff over every Python tree.
    unit   the package + tests that need no framework (``-m "not slow and not <framework>..."``).
    torch  PyTorch 2.13 (CPU wheel from pip's local find-links) + the torch tests and examples.
    tensorflow  tensorflow-cpu 2.21 (Keras 3) + the TensorFlow/Keras tests and examples.
    mxnet  MXNet 1.9.1 with numpy 1.23.5 (pins only in this session's own venv) + the MXNet
           tests, the conformance suite for MXNet and the Gluon example.
    bench  the benchmark lab's tests (emulated cluster needs root) + python -m benchmarks --quick.
    engines  launching through the engines users run (ssh hosts, Slurm, Kubernetes manifests,
           torchrun environments, Ray): same install as torch plus the ``engines`` extra;
           the tests that need sshd/Slurm/root skip with the reason where those are missing.
    slow   same install as torch; the long-running suites (``pytest -m slow``); not run by CI.

The first session of a run builds one byteps wheel (the C++ core through scikit-build-core,
about 75 s on 2 cores) into ``.nox/_wheels/<digest of the sources>``; every session installs
that wheel with its extras. Pass extra pytest arguments after ``--``:
``python -m nox -s unit -- -k launcher``.
"""

from __future__ import annotations

import glob
import hashlib
import os

import nox

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


def _install_byteps(session: nox.Session, extras: str) -> None:
    """Install byteps with ``extras`` from one wheel built per source state (in
    ``.nox/_wheels/<digest>``) and shared by every session: building the C++ core (about
    75 s on 2 cores) once per run instead of once per session (pip builds each install in a
    fresh isolated environment, which invalidates CMake's cache)."""
    _build_env(session)
    out = os.path.join(".nox", "_wheels", _source_digest())
    wheels = glob.glob(os.path.join(out, "byteps-*.whl"))
    if not wheels:
        session.run("python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", out, ".")
        wheels = glob.glob(os.path.join(out, "byteps-*.whl"))
    wheel = os.path.abspath(wheels[0])
    session.install(f"{wheel}[{extras}]")
    # A reused venv may hold an earlier build of the same version: replace it.
    session.install("--force-reinstall", "--no-deps", wheel)


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
