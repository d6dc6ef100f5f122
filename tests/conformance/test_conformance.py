"""Cross-framework conformance suite: the semantic cases of ``cases.py`` (written once)
against every framework adapter, through the per-framework shims of ``shims/``.

Each test launches one job on this host::

    python -m byteps.launch --workers W --servers S --env BYTEPS_TIMEOUT=T \\
        <python> tests/conformance/worker.py <framework> <group>

for W workers x S servers in (2 x 1, 3 x 2) with the default (TCP) van, and one configuration
(torch, 2 x 1) again with the UCX van over shared memory (``jobs.VANS["ucx-shm"]``: the
launcher's ``--env`` gives every process ``DMLC_ENABLE_RDMA=ucx UCX_TLS=sm,self``; skipped in a
build without UCX), and asserts that the job exited 0 and that every
rank printed ``CASE <name> OK`` for every case of the group (``CASE <name> SKIP`` only for
cases that need a capability the framework's shim declares missing) and ``ALL OK <n>``.
A failing case's traceback is in the job output shown by the assertion message.

Run one framework with ``-m torch`` / ``-m tensorflow`` / ``-m mxnet`` (each in an environment
that has it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jobs
import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"


def _load(name: str, path: Path, package: bool = False):
    """Import ``path`` under a unique module name (``cases``/``shims`` are generic names that
    other test directories might also put on ``sys.path``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(path.parent)] if package else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cases = _load("byteps_conformance_cases", HERE / "cases.py")
shims = _load("byteps_conformance_shims", HERE / "shims" / "__init__.py", package=True)

#: (workers, servers) of the launched jobs
CONFIGS = [(2, 1), (3, 2)]
#: framework -> (pytest mark, module to importorskip, BYTEPS_TIMEOUT of the error group)
FRAMEWORKS = {
    "torch": (pytest.mark.torch, "torch", 20),
    "tensorflow": (pytest.mark.tensorflow, "tensorflow", 45),
    "mxnet": (pytest.mark.mxnet, "mxnet", 20),
}
#: (framework, workers, servers, van) also run with a UCX van: one configuration, every group
UCX_CONFIGS = [("torch", 2, 1, "ucx-shm")]
#: the other synchronization schemes (docs/schemes.md): (framework, workers, servers, local
#: processes per machine, BYTEPS_SYNC, groups in the default run); every other group (but
#: compression, which needs sync=ps) is marked slow. HiPS has groups of 2: 2 first-level servers
#: and one on top; the tree of 3 machines has the default width 1.
SCHEME_CONFIGS = [
    ("torch", 2, 1, 2, "ring", ("collectives", "errors")),
    ("torch", 3, 1, 1, "tree", ("optimizer",)),
    ("torch", 3, 3, 1, "hips", ("collectives",)),
]
#: BYTEPS_TIMEOUT of the other groups (covers the rendezvous while framework imports finish)
DEFAULT_TIMEOUT = 60
#: wall-clock limit of one launch
JOB_TIMEOUT = 420
#: extra environment of a group's jobs: the compression group's tiny parameters are compressed,
#: the horovod group's tensors cross partition bounds (horovod_cases.PARTITION_BYTES)
GROUP_ENV = {"compression": ["BYTEPS_MIN_COMPRESS_BYTES=0"],
             "horovod": ["BYTEPS_PARTITION_BYTES=65536"]}


def _params():
    for fw, (mark, _, _) in FRAMEWORKS.items():
        for workers, servers in CONFIGS:
            for group in cases.GROUPS:
                yield pytest.param(fw, workers, servers, group, "tcp", marks=mark,
                                   id=f"{fw}-{workers}w{servers}s-{group}")
    for fw, workers, servers, van in UCX_CONFIGS:
        for group in cases.GROUPS:
            yield pytest.param(fw, workers, servers, group, van,
                               marks=[FRAMEWORKS[fw][0], jobs.skip_without_ucx()],
                               id=f"{fw}-{workers}w{servers}s-{group}-{van}")


def _scheme_params():
    for fw, workers, servers, local, sync, default in SCHEME_CONFIGS:
        for group in cases.GROUPS:
            if group == "compression":
                continue
            marks = [FRAMEWORKS[fw][0]] + ([] if group in default else [pytest.mark.slow])
            yield pytest.param(fw, workers, servers, local, sync, group, marks=marks,
                               id=f"{fw}-{workers}w{servers}s{local}l-{sync}-{group}")


def run_job(framework: str, workers: int, servers: int, group: str, timeout_s: float,
            van: str = "tcp", local_size=None, sync_env=()):
    return jobs.launch_job(jobs.launch_config(workers, servers, local_size),
                           [jobs.PY, WORKER, framework, group],
                           env=[f"BYTEPS_TIMEOUT={timeout_s:g}", *jobs.VANS[van],
                                *GROUP_ENV.get(group, []), *sync_env],
                           timeout=JOB_TIMEOUT, job_env=jobs.framework_env())


def _failure_excerpt(output: str, limit: int = 12000) -> str:
    """The job output, trimmed from the front, with scheduler/server chatter dropped."""
    keep = [ln for ln in output.splitlines() if not ln.startswith(("[scheduler]", "[server"))]
    text = "\n".join(keep)
    return text[-limit:]


def test_case_registry():
    """Every group has cases; names are unique; required capabilities exist."""
    names = [c.name for c in cases.all_cases()]
    assert len(names) == len(set(names)), names
    for group, members in cases.GROUPS.items():
        assert members, f"group {group} is empty"
    for c in cases.all_cases():
        assert set(c.requires) <= shims.CAPABILITIES, (c.name, c.requires)
        assert c.doc, f"case {c.name} has no docstring"
    for fw in shims.SHIMS:
        shim = shims.get_shim(fw)
        assert set(shim.dtypes) <= set(shims.ALL_DTYPES), (fw, shim.dtypes)
        assert shim.capabilities <= shims.CAPABILITIES, (fw, shim.capabilities)
        for cap in shims.CAPABILITIES - shim.capabilities:
            assert cap in shim.missing_reasons, f"{fw}: no reason given for missing {cap}"


@pytest.mark.parametrize("framework,workers,servers,group,van", list(_params()))
def test_conformance(framework, workers, servers, group, van):
    _check_job(framework, workers, servers, group, van)


@pytest.mark.parametrize("framework,workers,servers,local_size,sync,group",
                         list(_scheme_params()))
def test_conformance_schemes(framework, workers, servers, local_size, sync, group):
    """The same cases with every rank's tensors summed by ring, tree or HiPS."""
    _check_job(framework, workers, servers, group, "tcp", local_size,
               [f"BYTEPS_SYNC={sync}", "BYTEPS_HIPS_GROUP=2"], f" sync {sync}")


def _check_job(framework, workers, servers, group, van, local_size=None, sync_env=(),
               what=""):
    _, module, error_timeout = FRAMEWORKS[framework]
    pytest.importorskip(module)
    pytest.importorskip("byteps._core", reason="the byteps core is not built")
    shim = shims.get_shim(framework)
    timeout_s = error_timeout if group == "errors" else DEFAULT_TIMEOUT
    rc, out, secs = run_job(framework, workers, servers, group, timeout_s, van, local_size,
                            sync_env)
    excerpt = _failure_excerpt(out)
    per_rank = jobs.rank_lines(out, workers * (local_size or 1))
    expected_ok = [c.name for c in cases.GROUPS[group] if not c.missing(shim)]
    expected_skip = [c.name for c in cases.GROUPS[group] if c.missing(shim)]
    problems = []
    for rank, lines in per_rank.items():
        for name in expected_ok:
            if not any(ln.startswith(f"CASE {name} OK") for ln in lines):
                failed = any(ln.startswith(f"CASE {name} FAIL") for ln in lines)
                problems.append(f"worker {rank}: case {name} "
                                f"{'FAILED' if failed else 'did not report OK'}")
        for name in expected_skip:
            if not any(ln.startswith(f"CASE {name} SKIP") for ln in lines):
                problems.append(f"worker {rank}: case {name} should be skipped (missing "
                                f"capability) but did not report SKIP")
        if not any(ln.startswith(f"ALL OK {len(expected_ok)}") for ln in lines):
            problems.append(f"worker {rank}: no 'ALL OK {len(expected_ok)}' line")
    if rc != 0:
        problems.insert(0, f"launcher exit status {rc}")
    assert not problems, (
        f"{framework} {workers}w{servers}s {group} van {van}{what} ({secs:.1f} s):\n  "
        + "\n  ".join(problems) + "\n--- job output (tail) ---\n" + excerpt)
