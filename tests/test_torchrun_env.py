"""byteps.launch.torchrun_env: torchrun's variables mapped onto a byteps placement (pure functions over
an environment dict, no torch and no core needed), and the plan byteps.launch.torchrun derives
from it (the worker's variables and which children a process starts)."""

from __future__ import annotations

import pytest

from byteps.errors import ConfigError
from byteps.launch.contract import JobIdentity
from byteps.launch.torchrun_env import (
    TorchrunEnvError,
    derive_job_id,
    is_torchrun_env,
    placement_from_env,
)


def trun(**kw) -> dict[str, str]:
    """The environment torchrun gives rank ``RANK`` of ``--nnodes 2 --nproc-per-node 2``."""
    rank = kw.get("RANK", 3)
    rank = int(rank) if str(rank).lstrip("-").isdigit() else 3  # the others stay rank 3's
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": str(rank),
           "WORLD_SIZE": "4", "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": str(rank // 2), "TORCHELASTIC_RUN_ID": "none",
           "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    env.update({k: str(v) for k, v in kw.items()})
    return {k: v for k, v in env.items() if v != "DEL"}


@pytest.mark.parametrize("rank", range(4))
def test_every_rank_of_two_nodes_of_two(rank):
    p = placement_from_env(trun(RANK=rank))
    assert (p.rank, p.world_size, p.local_rank, p.local_size) == (rank, 4, rank % 2, 2)
    assert (p.num_machines, p.worker_id, p.num_servers, p.distributed) == (2, rank // 2, 2, True)
    assert (p.master_addr, p.master_port, p.scheduler_port) == ("10.0.0.1", 29500, 29501)
    assert p.starts_scheduler == (rank == 0)
    assert p.starts_server == (rank % 2 == 0)


def test_without_group_rank_the_node_is_rank_over_local_size():
    assert placement_from_env(trun(RANK=2, GROUP_RANK="DEL")).worker_id == 1
    assert placement_from_env(trun(RANK=2, GROUP_RANK="DEL", NODE_RANK=1)).worker_id == 1


def test_one_process_per_node_without_local_variables():
    env = trun(RANK=2, WORLD_SIZE=3, LOCAL_RANK="DEL", LOCAL_WORLD_SIZE="DEL", GROUP_RANK="DEL")
    p = placement_from_env(env)
    assert (p.local_rank, p.local_size, p.num_machines, p.worker_id) == (0, 1, 3, 2)


def test_one_machine_has_no_servers_and_needs_no_master():
    p = placement_from_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert (p.distributed, p.num_servers, p.scheduler_port, p.num_machines) == (False, 0, None, 1)
    assert not p.starts_scheduler and not p.starts_server
    p = placement_from_env(trun(RANK=1, WORLD_SIZE=2, GROUP_RANK=0))
    assert (p.distributed, p.num_servers, p.local_size) == (False, 0, 2)
    forced = placement_from_env(trun(RANK=0, WORLD_SIZE=2, GROUP_RANK=0,
                                     BYTEPS_FORCE_DISTRIBUTED=1))
    assert (forced.distributed, forced.num_servers, forced.starts_scheduler) == (True, 1, True)


def test_explicit_scheduler_port_wins():
    assert placement_from_env(trun(DMLC_PS_ROOT_PORT=7000)).scheduler_port == 7000
    p = placement_from_env(trun(MASTER_PORT=65535, DMLC_PS_ROOT_PORT=7000))
    assert p.scheduler_port == 7000


def test_detection():
    assert is_torchrun_env(trun())
    assert is_torchrun_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert not is_torchrun_env({"LOCAL_RANK": "0"})  # e.g. a lone LOCAL_RANK: not a job
    assert not is_torchrun_env({})
    for name in ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_WORKER_ID",
                 "DMLC_PS_ROOT_URI"):
        assert not is_torchrun_env(trun(**{name: "1"})), name  # a DMLC_* description wins
    # Tunables are not a job description.
    assert is_torchrun_env(trun(DMLC_INTERFACE="eth0", DMLC_PS_ROOT_PORT=7000,
                                DMLC_ENABLE_RDMA=0))


@pytest.mark.parametrize("change, match", [
    (dict(RANK="DEL"), r"RANK is not set"),
    (dict(WORLD_SIZE="DEL"), r"WORLD_SIZE is not set"),
    (dict(RANK="x"), r"RANK='x' is not an integer"),
    (dict(WORLD_SIZE=0), r"WORLD_SIZE='0' is out of range \(must be >= 1\)"),
    (dict(RANK=4), r"RANK='4' is out of range \(must be in 0..3\)"),
    (dict(RANK=-1), r"RANK='-1' is out of range"),
    (dict(LOCAL_WORLD_SIZE="DEL"), r"LOCAL_WORLD_SIZE is not set but LOCAL_RANK is"),
    (dict(LOCAL_RANK="DEL"), r"LOCAL_RANK is not set but LOCAL_WORLD_SIZE is"),
    (dict(LOCAL_WORLD_SIZE=0), r"LOCAL_WORLD_SIZE='0' is out of range"),
    (dict(LOCAL_RANK=2), r"LOCAL_RANK='2' is out of range \(must be in 0..1\)"),
    (dict(WORLD_SIZE=5, LOCAL_WORLD_SIZE=2), r"WORLD_SIZE=5 is not a multiple of "
                                             r"LOCAL_WORLD_SIZE=2"),
    (dict(GROUP_RANK=2), r"GROUP_RANK='2' is out of range \(must be in 0..1\)"),
    (dict(GROUP_RANK="DEL", NODE_RANK="n"), r"NODE_RANK='n' is not an integer"),
    (dict(GROUP_RANK=0), r"RANK=3 is not worker_id \* local_size \+ local_rank = 0 \* 2 \+ 1 "
                         r"= 1"),
    (dict(LOCAL_RANK=0), r"RANK=3 is not .* = 2"),
    (dict(MASTER_ADDR="DEL"), r"MASTER_ADDR is not set: a distributed job \(2 machines\)"),
    (dict(MASTER_ADDR=" "), r"MASTER_ADDR is empty"),
    (dict(MASTER_PORT="DEL"), r"MASTER_PORT is not set"),
    (dict(MASTER_PORT="p"), r"MASTER_PORT='p' is not an integer"),
    (dict(MASTER_PORT=70000), r"MASTER_PORT='70000' is out of range \(must be in 1..65535\)"),
    (dict(MASTER_PORT=65535), r"MASTER_PORT \+ 1 is above 65535"),
    (dict(DMLC_PS_ROOT_PORT=0), r"DMLC_PS_ROOT_PORT='0' is out of range"),
    (dict(BYTEPS_LOCAL_SIZE=4), r"BYTEPS_LOCAL_SIZE='4' contradicts the torchrun variables"),
    (dict(BYTEPS_LOCAL_RANK=0), r"BYTEPS_LOCAL_RANK='0' contradicts"),
    (dict(BYTEPS_GLOBAL_RANK=1), r"BYTEPS_GLOBAL_RANK='1' contradicts RANK=3"),
    (dict(TORCHELASTIC_RESTART_COUNT=-1), r"TORCHELASTIC_RESTART_COUNT='-1' is out of range"),
])
def test_every_bad_environment_is_a_typed_error_naming_the_variable(change, match):
    with pytest.raises(TorchrunEnvError, match=match) as info:
        placement_from_env(trun(**change))
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    assert str(info.value).startswith("torchrun-style environment of ")


def test_all_problems_in_one_message_with_the_rank():
    with pytest.raises(TorchrunEnvError) as info:
        placement_from_env(trun(MASTER_ADDR="DEL", MASTER_PORT="DEL", BYTEPS_LOCAL_SIZE=3))
    text = str(info.value)
    assert text.startswith("torchrun-style environment of rank 3: ")
    assert "MASTER_ADDR" in text and "MASTER_PORT" in text and "BYTEPS_LOCAL_SIZE" in text


def test_consistent_byteps_variables_are_accepted():
    p = placement_from_env(trun(BYTEPS_LOCAL_SIZE=2, BYTEPS_LOCAL_RANK=1, BYTEPS_GLOBAL_RANK=-1))
    assert p.rank == 3


def test_job_id_agrees_on_a_node_and_differs_between_jobs():
    ids = {derive_job_id(placement_from_env(trun(RANK=r))) for r in (2, 3)}
    assert len(ids) == 1
    (same,) = ids
    assert same.startswith("torchrun-") and len(same) <= 27  # torchrun's default run id "none"
    assert derive_job_id(placement_from_env(trun(MASTER_PORT=29600))) != same
    assert derive_job_id(placement_from_env(trun(TORCHELASTIC_RESTART_COUNT=1))) != same
    named = derive_job_id(placement_from_env(trun(TORCHELASTIC_RUN_ID="my-job/42")))
    assert named.startswith("myjob42-")
    bare = placement_from_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert derive_job_id(bare, "p1") != derive_job_id(bare, "p2")


def test_plan_worker_variables_and_children():
    from byteps.launch.torchrun import plan  # no torch, no core needed

    ident = JobIdentity("jid", "sec")
    base = {"PATH": "/bin", "DMLC_INTERFACE": "eth1", "RANK": "0"}
    worker, children = plan(placement_from_env(trun(RANK=0)), ident, base, ["srv"])
    assert worker == {
        "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "2",
        "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "29501", "BYTEPS_JOB_ID": "jid",
        "BYTEPS_SECRET": "sec", "PYTHONUNBUFFERED": "1", "DMLC_INTERFACE": "eth1",
        "DMLC_WORKER_ID": "0", "BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "2"}
    assert [c.label for c in children] == ["scheduler", "server of node 0"]
    assert children[0].env["DMLC_ROLE"] == "scheduler" and children[0].argv == ["srv"]
    assert children[1].env["DMLC_ROLE"] == "server" and children[1].env["PATH"] == "/bin"
    assert children[1].env["BYTEPS_SECRET"] == "sec"
    assert [c.label for c in plan(placement_from_env(trun(RANK=2)), ident, base)[1]] == [
        "server of node 1"]
    assert plan(placement_from_env(trun(RANK=3)), ident, base)[1] == []
    one, none = plan(placement_from_env({"RANK": "0", "WORLD_SIZE": "1"}), ident, {})
    assert none == [] and "DMLC_PS_ROOT_URI" not in one and one["DMLC_NUM_SERVER"] == "0"


def test_secret_sources():
    from byteps.launch.torchrun import resolve_secret

    dist = placement_from_env(trun(RANK=1))
    assert resolve_secret(dist, trun(BYTEPS_SECRET="abc"), 1) == "abc"
    single = placement_from_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert resolve_secret(single, {}, 1) == ""
    no_store = trun(TORCHELASTIC_USE_AGENT_STORE="DEL")
    assert resolve_secret(dist, {**no_store, "BYTEPS_ALLOW_UNAUTHENTICATED": "1"}, 1) == ""
    with pytest.raises(TorchrunEnvError, match=r"rank 1: BYTEPS_SECRET is not set .* export the "
                                               r"same BYTEPS_SECRET on every node"):
        resolve_secret(dist, no_store, 1)
