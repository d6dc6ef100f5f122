"""``python -m byteps.doctor`` / ``bpslaunch --doctor``: the report says what this build and
host really have, and turns the misconfigurations a user hits into a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jobs import clean_job_env, skip_without_ucx
from testing_hooks import core_testing

from byteps import _core, doctor


def test_report_matches_the_build_and_host():
    T = core_testing()
    report = doctor.gather(clean_job_env())
    assert report["vans"] == (["tcp", "ucx"] if T.ucx_available else ["tcp"])
    assert _core.doctor.ucx_linked() == T.ucx_available
    if T.ucx_available:
        ucx = report["ucx"]
        assert ucx["version"] and ucx["error"] is None
        assert any(r.startswith("tcp/") for r in ucx["resources"]), ucx
    else:
        assert report["ucx"] is None
    assert report["summation"]["active_isa"] == _core.reduce.active_isa()
    assert report["summation"]["active_isa"] in report["summation"]["available_isas"]
    assert report["frameworks"]["numpy"] == np.__version__
    assert ["lo", "127.0.0.1"] in report["network"]["interfaces"]
    assert report["problems"] == []
    text = doctor.render(report)
    assert "vans in this build: tcp" in text and "no problem found" in text


def test_nccl_line_says_whether_its_stages_can_run():
    report = doctor.gather(clean_job_env())
    assert report["nccl"]["min_version"] == 21800
    base = {"available": True, "reason": None, "library": "/x/libnccl.so.2", "min_version": 21800}
    report["nccl"] = dict(base, version=21703, stages_supported=False)
    assert "NCCL: 21703 (/x/libnccl.so.2); older than 2.18: no NCCL stages" in doctor.render(report)
    report["nccl"] = dict(base, version=22703, stages_supported=True)
    assert "22703 (/x/libnccl.so.2); its stages among the machine's GPUs can run" in (
        doctor.render(report))


def test_advertised_address_follows_the_core_s_choice():
    adv = doctor.advertised_address
    assert adv({"DMLC_NODE_HOST": "10.9.8.7", "DMLC_INTERFACE": "lo"})["address"] == "10.9.8.7"
    assert adv({"DMLC_INTERFACE": "lo", "DMLC_PS_ROOT_URI": "10.0.0.1"})["address"] == "127.0.0.1"
    bad = adv({"DMLC_INTERFACE": "no-such-if0"})
    assert bad["address"] is None and "no IPv4 address" in bad["problem"]
    routed = adv({"DMLC_PS_ROOT_URI": "localhost", "DMLC_PS_ROOT_PORT": "9000"})
    assert routed["address"] == "127.0.0.1" and routed["problem"] is None
    unknown = adv({"DMLC_PS_ROOT_URI": "no-such-host.invalid"})
    assert unknown["address"] is None and "cannot resolve" in unknown["problem"]
    sched = adv({"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "127.0.0.1"})
    assert sched["address"] == "127.0.0.1"
    single = adv({})
    assert single["address"] is None and single["problem"] is None


def test_rdma_devices_read_from_sysfs(tmp_path: Path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("Ethernet\n")
    (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
    assert doctor.rdma_devices(str(tmp_path)) == [
        {"device": "mlx5_0", "port": "1", "state": "4: ACTIVE", "link_layer": "Ethernet",
         "rate": "100 Gb/sec (4X EDR)"}]
    assert doctor.rdma_devices(str(tmp_path / "absent")) == []


def _run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                          env=clean_job_env(env), check=False)


def test_cli_json_and_exit_status():
    ok = _run(["-m", "byteps.doctor", "--json"])
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["problems"] == []
    bad = _run(["-m", "byteps.doctor"], DMLC_INTERFACE="no-such-if0",
               BYTEPS_PARTITION_BYTE="4096")
    assert bad.returncode == 1
    assert "PROBLEM: DMLC_INTERFACE=no-such-if0 has no IPv4 address" in bad.stdout
    assert "did you mean BYTEPS_PARTITION_BYTES?" in bad.stdout


def test_bpslaunch_doctor_uses_the_job_environment():
    out = _run(["-m", "byteps.launch", "--doctor", "--env", "DMLC_NODE_HOST=10.1.2.3"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "this node would advertise: 10.1.2.3 (DMLC_NODE_HOST)" in out.stdout
    assert "summation kernels: " + _core.reduce.active_isa() in out.stdout


@skip_without_ucx()
@pytest.mark.parametrize("value, expected", [
    (None, "RDMA links (BYTEPS_UCX_ONE_WAY=auto)"), ("0", "none (BYTEPS_UCX_ONE_WAY=0)"),
    ("1", "RDMA and shared-memory links")])
def test_report_says_which_links_push_one_way(value, expected):
    env = clean_job_env({"BYTEPS_UCX_ONE_WAY": value} if value else {})
    report = doctor.gather(env)
    assert report["one_way"].startswith(expected), report["one_way"]
    rdma = report["ucx"]["rdma_resources"]
    assert set(rdma) <= set(report["ucx"]["resources"])
    if value is None and not rdma:
        assert report["one_way"].endswith("UCX has no RDMA transport here, so none")
    if value is None and rdma:
        assert report["one_way"].endswith(", ".join(rdma))
    assert f"one-way writes (pushes, sums) over: {report['one_way']}" in doctor.render(report)


@pytest.mark.parametrize("env,van", [
    ({}, "tcp"), ({"DMLC_ENABLE_RDMA": "ucx"}, "ucx"), ({"DMLC_ENABLE_UCX": "1"}, "ucx"),
    ({"DMLC_ENABLE_RDMA": "ibverbs"}, "ucx (rdma required)"),
    ({"DMLC_ENABLE_RDMA": "1"}, "ucx (rdma required)"), ({"BYTEPS_ENABLE_IPC": "1"}, "tcp + ipc"),
    ({"DMLC_ENABLE_RDMA": "fabric"}, "none: "),
])
def test_report_names_the_van_the_environment_selects(env, van):
    report = doctor.gather(clean_job_env(env))
    assert report["van"].startswith(van), report["van"]
    if van == "none: ":
        assert "DMLC_ENABLE_RDMA" in report["van"] and "ucx" in report["van"]
    assert f"selected by this environment: {report['van']}" in doctor.render(report)


@skip_without_ucx()
@pytest.mark.parametrize("resource, rdma", [
    ("rc_mlx5/mlx5_0:1", True), ("rc_verbs/mlx5_0:1", True), ("dc_mlx5/mlx5_0:1", True),
    ("ud_verbs/mlx5_0:1", True), ("ib/mlx5_0:1", True), ("tcp/eth0", False),
    ("posix/memory", False), ("cma/memory", False), ("self/memory", False), ("sysv/memory", False),
])
def test_rdma_transports_are_told_apart(resource, rdma):
    assert _core.doctor.is_rdma_transport(resource) is rdma
