"""byteps.launch.contract: the DMLC_*/BYTEPS_* contract every launcher builds its processes from."""

from __future__ import annotations

import pytest

from byteps.launch.contract import (
    CONTRACT_VARS,
    ClusterSpec,
    ClusterSpecError,
    JobIdentity,
    role_env,
)

IDENT = JobIdentity("abc123", "s" * 64)


def spec(**kw) -> ClusterSpec:
    args = dict(num_workers=2, num_servers=3, local_size=2, scheduler_host="sched.local",
                scheduler_port=9000, identity=IDENT)
    return ClusterSpec(**{**args, **kw})


def test_worker_env_carries_the_whole_contract():
    env = role_env(spec(), "worker", worker_id=1, local_rank=1, interface="eth1",
                   base={"PATH": "/bin", "DMLC_WORKER_ID": "7", "BYTEPS_SECRET": "stale"})
    assert env == {
        "PATH": "/bin", "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "3",
        "DMLC_PS_ROOT_URI": "sched.local", "DMLC_PS_ROOT_PORT": "9000",
        "BYTEPS_JOB_ID": "abc123", "BYTEPS_SECRET": "s" * 64, "PYTHONUNBUFFERED": "1",
        "DMLC_INTERFACE": "eth1", "DMLC_WORKER_ID": "1", "BYTEPS_LOCAL_RANK": "1",
        "BYTEPS_LOCAL_SIZE": "2"}
    assert spec().rank(1, 1) == 3 and spec().size == 4


def test_stale_contract_variables_never_leak():
    base = {name: "stale" for name in CONTRACT_VARS}
    env = role_env(spec(), "server", base=base)
    assert "stale" not in env.values()
    assert "DMLC_WORKER_ID" not in env and "DMLC_NODE_HOST" not in env
    assert role_env(spec(), "scheduler", node_host="10.0.0.1")["DMLC_NODE_HOST"] == "10.0.0.1"


@pytest.mark.parametrize("kw, match", [
    (dict(num_workers=0), "worker machine"), (dict(num_servers=-1), "servers"),
    (dict(local_size=0), "local size"), (dict(scheduler_host=" "), "empty"),
    (dict(scheduler_port=70000), "port"),
])
def test_bad_specs_are_refused(kw, match):
    with pytest.raises(ClusterSpecError, match=match):
        spec(**kw)


@pytest.mark.parametrize("role, kw, match", [
    ("client", {}, "unknown role"), ("worker", {"worker_id": 0}, "needs"),
    ("worker", {"worker_id": 2, "local_rank": 0}, "worker_id 2"),
    ("worker", {"worker_id": 0, "local_rank": 2}, "local_rank 2"),
    ("server", {"worker_id": 0}, "has no"),
])
def test_bad_roles_are_refused(role, kw, match):
    with pytest.raises(ClusterSpecError, match=match):
        role_env(spec(), role, **kw)


def test_fresh_identities_differ():
    a, b = JobIdentity.fresh(), JobIdentity.fresh()
    assert a != b and len(a.job_id) == 12 and len(a.secret) == 64
