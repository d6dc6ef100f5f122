"""The module paths that moved into ``byteps.launch`` and ``byteps.sync`` keep working for one
release (docs/architecture.md §2): each old module re-exports the new module's public names as
the same objects, says in its docstring where they moved and that it goes after the next
release, and ``python -m`` of an old path that was a command still runs it.

No framework and no core needed (none of these modules loads ``byteps._core`` at import).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

#: old module -> {new module: the public names it defined on main that now live there}
MOVED = {
    "byteps.launcher": {
        "byteps.launch.cli": ["main"],
        "byteps.launch.common": ["ChildSpec", "DEFAULT_GRACE", "LOCAL_MODE_VARS", "LaunchError",
                                 "check_job_shape", "cleanup_shm", "default_server_argv",
                                 "find_free_port", "parse_env_pairs"],
        "byteps.launch.contract": ["ROLES"],
        "byteps.launch.local": ["build_local_plan"],
        "byteps.launch.upstream": ["build_upstream_plan", "upstream_is_distributed",
                                   "validate_upstream_env"],
    },
    "byteps.cluster_env": {"byteps.launch.contract": [
        "CONTRACT_VARS", "ClusterSpec", "ClusterSpecError", "JobIdentity", "ROLES", "env_int",
        "is_true", "role_env"]},
    "byteps.torchrun_env": {"byteps.launch.torchrun_env": [
        "DMLC_DESCRIPTION_VARS", "SCHEDULER_PORT_OFFSET", "TORCH_VARS", "TorchrunEnvError",
        "TorchrunPlacement", "derive_job_id", "is_torchrun_env", "placement_from_env"]},
    "byteps.slurm_task": {"byteps.launch.slurm_task": ["SlurmTaskError", "main", "task_env"]},
    "byteps.compression": {"byteps.sync.compression": [
        "COMPRESSIBLE_DTYPES", "COMPRESSORS", "NesterovMomentum", "compression_kwargs",
        "core_compresses", "declare", "min_compress_bytes", "nesterov_mu", "wants_fp16"]},
    "byteps.schemes": {"byteps.sync.schemes": [
        "SCHEMES", "SYNC_VALUES", "auto_choice", "auto_chooser", "check_scheme",
        "sync_setting"]},
    "byteps.cost_formulas": {"byteps.sync.cost_formulas": [
        "SCHEMES", "SchemeCost", "default_tree_width", "hips", "hips_group", "hips_placed",
        "hips_servers", "ps", "ps_shares", "ring", "scheme_cost", "t_opt", "tree",
        "tree_degree", "tree_depth", "tree_pass", "tree_width"]},
    "byteps.async_train": {"byteps.sync.async_train": [
        "PREFIX", "contributes_initial_value", "enabled", "max_staleness",
        "pushes_initial_value", "require", "wire_name"]},
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_re_exports_the_new_names(old):
    module = importlib.import_module(old)
    doc = " ".join((module.__doc__ or "").split())
    assert doc.startswith("Moved"), doc
    assert "goes after the next" in doc, doc
    for new, names in MOVED[old].items():
        target = importlib.import_module(new)
        assert new in doc or new.rsplit(".", 1)[0] in doc, (old, new, doc)
        for name in names:
            assert getattr(module, name) is getattr(target, name), (old, new, name)


def _run_module(module, *args, env=None):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_python_m_byteps_launcher_still_runs_bpslaunch():
    new, old = _run_module("byteps.launch", "--help"), _run_module("byteps.launcher", "--help")
    assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
    assert "--workers" in old.stdout and old.stdout == new.stdout


def test_python_m_byteps_slurm_task_still_runs_the_task_end():
    """Outside a Slurm step both paths refuse with status 2 and the same message."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "DMLC_", "BYTEPS_"))}
    new = _run_module("byteps.launch.slurm_task", "--", "true", env=env)
    old = _run_module("byteps.slurm_task", "--", "true", env=env)
    assert new.returncode == old.returncode == 2, (new.stderr, old.stderr)
    assert old.stderr == new.stderr, (old.stderr, new.stderr)
    assert "SLURM_NODEID is not set" in old.stderr, old.stderr


def test_cost_model_is_a_plain_function_with_the_api():
    """``byteps.cost_model()`` (docs/schemes.md) is a function, no module class swap; it
    carries the cost model's API as attributes."""
    import types

    import byteps
    from byteps.sync import cost_model

    assert isinstance(byteps.cost_model, types.FunctionType)
    assert type(sys.modules["byteps"]) is types.ModuleType
    for name in ("get", "measure", "choose", "CostModel", "Interval", "CANDIDATES",
                 "MAX_BYTES", "VARIABLES", "feasible_schemes"):
        assert getattr(byteps.cost_model, name) is getattr(cost_model, name), name
