"""byteps.ray's placement plan (``byteps.launch.ray.placement``): pure functions, no Ray needed.

Worker machines from the nodes the worker actors landed on, the servers' nodes, the bundles
requested (GPU included: there is no GPU here, so only the request is tested), the argument
checks.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from byteps.errors import InvalidArgumentError
from byteps.launch.ray.placement import (
    MachinePlan,
    check_options,
    is_distributed,
    place_servers,
    plan_machines,
    worker_bundles,
)


def test_uniform_nodes_group_into_machines():
    # node a hosts actors 0, 1, 4 and node b actors 2, 3, 5: 3 each
    plan = plan_machines(["a", "a", "b", "b", "a", "b"])
    assert plan.local_size == 3 and plan.num_machines == 2
    assert plan.slots == ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2))
    assert [plan.rank(i) for i in range(6)] == [0, 1, 3, 4, 2, 5]
    assert plan.nodes == ("a", "b") == plan.worker_nodes


def test_uneven_nodes_make_one_machine_per_worker():
    plan = plan_machines(["a", "a", "b"])
    assert plan.local_size == 1 and plan.num_machines == 3
    assert plan.slots == ((0, 0), (1, 0), (2, 0))
    assert [plan.rank(i) for i in range(3)] == [0, 1, 2]
    assert plan.nodes == ("a", "a", "b") and plan.worker_nodes == ("a", "b")


def test_one_node_is_one_machine():
    plan = plan_machines(["n"] * 4)
    assert (plan.local_size, plan.num_machines) == (4, 1)
    assert not is_distributed(plan, {})
    assert is_distributed(plan, {"BYTEPS_FORCE_DISTRIBUTED": " On "})
    assert not is_distributed(plan, {"BYTEPS_FORCE_DISTRIBUTED": "0"})
    assert is_distributed(plan_machines(["a", "b"]), {})


def test_one_worker_per_node_spread():
    plan = plan_machines(["x", "y", "z"])
    assert (plan.local_size, plan.num_machines) == (1, 3)
    assert plan.nodes == ("x", "y", "z")


def test_plan_needs_workers():
    with pytest.raises(InvalidArgumentError, match="no worker actors"):
        plan_machines([])


def test_servers_default_one_per_worker_node_else_round_robin():
    assert place_servers(None, ("a", "b")) == ["a", "b"]
    assert place_servers(1, ("a", "b")) == ["a"]
    assert place_servers(5, ("a", "b")) == ["a", "b", "a", "b", "a"]


def test_bundles():
    assert worker_bundles(2) == [{"CPU": 1}, {"CPU": 1}]
    assert worker_bundles(1, cpus_per_worker=2.5) == [{"CPU": 2.5}]
    assert worker_bundles(2, use_gpu=True) == [{"CPU": 1, "GPU": 1}] * 2
    assert worker_bundles(1, 4, use_gpu=True, gpus_per_worker=2) == [{"CPU": 4, "GPU": 2}]
    bundles = worker_bundles(2)
    bundles[0]["CPU"] = 9
    assert bundles[1]["CPU"] == 1  # independent dicts


@pytest.mark.parametrize("args, match", [
    ((0, None, 1, False, None, "PACK"), "num_workers must be a positive integer, got 0"),
    ((2.0, None, 1, False, None, "PACK"), "num_workers"),
    ((True, None, 1, False, None, "PACK"), "num_workers"),
    ((2, 0, 1, False, None, "PACK"), "num_servers"),
    ((2, None, 0, False, None, "PACK"), "cpus_per_worker must be a positive number"),
    ((2, None, "1", False, None, "PACK"), "cpus_per_worker"),
    ((2, None, 1, False, 1, "PACK"), "gpus_per_worker is set but use_gpu is False"),
    ((2, None, 1, True, -1, "PACK"), "gpus_per_worker"),
    ((2, None, 1, False, None, "pack"), "placement_strategy must be one of PACK, SPREAD"),
    ((2, None, 1, False, None, "PACK", 0), "timeout_s must be a positive number"),
])
def test_bad_options(args, match):
    with pytest.raises(InvalidArgumentError, match=match):
        check_options(*args)


def test_good_options():
    check_options(3, 2, 0.5, True, 0.5, "STRICT_SPREAD")
    check_options(1, None, 1, False, None, "SPREAD")
    assert isinstance(plan_machines(["a"]), MachinePlan)


def test_without_ray_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" raises ImportError
    monkeypatch.delitem(sys.modules, "byteps.ray", raising=False)
    with pytest.raises(ImportError, match=r"needs Ray.*pip install 'byteps\[engines\]'"):
        importlib.import_module("byteps.ray")


def test_a_shadowing_ray_module_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # no ray.remote
    monkeypatch.delitem(sys.modules, "byteps.ray", raising=False)
    with pytest.raises(ImportError, match="is not the Ray package"):
        importlib.import_module("byteps.ray")
