"""The benchmarks per van (benchmarks.vans): each van's environment selects that van, the plans
include the UCX vans where byteps has UCX, and the reports render the per-van rows and targets
from synthetic results (no job is started; a few seconds)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import micro, report, table1, table1_vans, vans
from byteps import doctor

pytestmark = pytest.mark.bench

UCX = vans.ucx_built()
needs_ucx = pytest.mark.skipif(not UCX, reason="this byteps has no UCX van")


@pytest.mark.parametrize("name, selected", [
    ("tcp", "tcp"), ("ucx-shm", "ucx"), ("ucx-tcp", "ucx"), ("ucx", "ucx"), ("ipc", "tcp + ipc")])
def test_each_van_env_selects_its_van_whatever_the_shell_exported(name, selected):
    env = {"DMLC_ENABLE_RDMA": "ucx", "DMLC_ENABLE_UCX": "1", "BYTEPS_ENABLE_IPC": "1",
           **vans.job_env(name)}
    assert doctor.selected_van(env) == selected
    assert not doctor.environment_notices(env)["refused"]


def test_ucx_envs():
    assert vans.job_env("ucx-shm")["UCX_TLS"] == "sm,self"
    assert vans.job_env("ucx-tcp")["UCX_TLS"] == "tcp,self"
    assert "UCX_NET_DEVICES" not in vans.job_env("ucx-tcp")
    # in a namespace host UCX keeps to eth0, the shaped link
    assert vans.job_env("ucx-tcp", netns=True)["UCX_NET_DEVICES"] == "eth0"
    assert "UCX_NET_DEVICES" not in vans.job_env("tcp", netns=True)
    assert vans.describe("ucx-tcp", vans.job_env("ucx-tcp", netns=True)).endswith(
        "with `UCX_NET_DEVICES=eth0`")


def test_check():
    with pytest.raises(ValueError, match="unknown van 'rdma'"):
        vans.check(["rdma"])
    with pytest.raises(ValueError, match="bypass the emulated cluster"):
        vans.check(["tcp", "ucx-shm"], netns=True)
    if UCX:
        assert vans.check(["ucx-shm", "tcp", "ucx-shm"]) == ["tcp", "ucx-shm"]
    else:
        with pytest.raises(ValueError, match="built with UCX"):
            vans.check(["ucx-shm"])


def test_plans_include_the_ucx_vans_where_byteps_has_ucx():
    for quick in (True, False):
        plan = micro.settings(quick)
        assert plan["vans"] == (["tcp", "ucx-shm"] if UCX else ["tcp"])
        n_dist = len(plan["vans"])
        reps = plan["repeats"]
        assert micro.steps(plan) == reps * (1 + n_dist + 1) + 1  # local, dist per van, gloo; tcp
        assert micro.steps(plan, ["dist"]) == reps * n_dist
    assert micro.settings(True, vans=["tcp"])["vans"] == ["tcp"]
    quick, full = table1.bench_settings(True), table1.bench_settings(False)
    assert quick["vans"] == full["vans"] == (["tcp", "ucx-tcp"] if UCX else ["tcp"])
    assert quick["van_sizes"] == [16 << 20]
    assert full["van_sizes"] == [4 << 20, 64 << 20]  # not 256 MiB (time)
    if not quick["unavailable"]:
        per_size = 1 + len(quick["vans"])  # byteps default per van, gloo
        assert table1.bench_steps(quick) == 5 * (1 + per_size)
        # full: 4 and 64 MiB on every van, 256 MiB on TCP only
        v = len(full["vans"])
        assert table1.bench_steps(full) == 5 * (1 + 2 * (v + 1) + 2)
    # the TCP van is always measured: the table's main columns are its
    assert table1.bench_settings(True, vans=["ucx-tcp"] if UCX else [])["vans"][0] == "tcp"


def _micro_results() -> dict:
    def job(t4k, t64m, oat=1e-3):
        return {"latency": {"4096": t4k, str(64 << 20): t64m},
                "best": {"4096": t4k, str(64 << 20): t64m}, "iters": {"4096": 9, str(64 << 20): 3},
                "one_at_a_time": {"count": 10, "nbytes": 4096, "seq_s": 10 * oat,
                                  "batched_s": 5 * oat, "steady_per_op_s": oat / 2},
                "declare_per_call_s": 1e-6}
    jobs = {"local": job(1e-4, 0.02), "dist": job(2e-4, 0.104), "gloo": job(3e-4, 0.078),
            "dist:ucx-shm": job(1.6e-4, 0.052), "dist:ucx-tcp": job(4e-4, 0.13)}
    del jobs["gloo"]["declare_per_call_s"]
    jobs["tcp"] = {"bytes": 1 << 30, "chunk": 1 << 24, "single_Bps": 3e9, "dual_Bps": 4e9,
                   "repeats": 2}
    return {"plan": {"repeats": 1}, "world": 2, "jobs": jobs,
            "vans": {"tcp": "the TCP van", "ucx-shm": "UCX over shm", "ucx-tcp": "UCX over tcp"},
            "descriptions": {"local": "L", "dist": "D", "gloo": "G", "tcp": "T",
                             "dist:ucx-shm": "D on ucx-shm", "dist:ucx-tcp": "D on ucx-tcp"}}


def test_micro_report_per_van(tmp_path):
    res = json.loads(json.dumps(_micro_results()))  # string keys, as read back from JSON
    md, targets = report.micro_markdown(res, None)
    assert "### Forced-distributed push_pull per van" in md
    assert "| size | tcp ms | tcp GB/s | ucx-shm ms | ucx-shm GB/s | tcp / ucx-shm | ucx-tcp ms |" in md
    assert "| 64 MiB | 104 | 0.65 | 52.00 | 1.29 | 2.00× | 130 | 0.52 | 0.80× |" in md
    assert "- **dist:ucx-shm**: D on ucx-shm" in md
    assert "| dist:ucx-shm | 1,000 |" in md  # one-tensor-at-a-time row
    by_name = {t["name"]: t for t in targets}
    big = by_name["64 MiB forced-distributed push_pull, ucx-shm van vs TCP van (≥ 1.5× faster)"]
    assert big["ratio"] == pytest.approx(2.0) and big["threshold"] == 1.5 and big["met"]
    lat = by_name["4 KiB forced-distributed push_pull latency, ucx-shm van ≤ TCP van"]
    assert lat["ratio"] == pytest.approx(1.25) and lat["met"]
    info = by_name["64 MiB forced-distributed push_pull, ucx-tcp van vs TCP van (info)"]
    assert info["met"] is None and info["ratio"] == pytest.approx(0.8)
    assert not by_name["4 KiB forced-distributed push_pull latency, ucx-tcp van ≤ TCP van"]["met"]
    # results without other vans (older runs) render as before, without the section
    old = _micro_results()
    old.pop("vans")
    md, targets = report.micro_markdown(json.loads(json.dumps(old)), None)
    assert "per van" not in md and not [t for t in targets if "van" in t["name"]]


def _table1_results() -> dict:
    plan = table1.bench_settings(False, sizes=[4 << 20, 64 << 20], configs=[(2, 0), (4, 4)],
                                 vans=["tcp"])
    plan.update(vans=["tcp", "ucx-tcp"], van_sizes=[4 << 20, 64 << 20], unavailable=None)
    rows = []
    for n, k in plan["configs"]:
        for m, t_opt in ((4 << 20, 0.044), (64 << 20, 0.70)):
            slow = 1.5 if (n, k, m) == (4, 4, 4 << 20) else 1.0
            rows.append({"n": n, "k": k, "bytes": m, "goodput_Bps": 9.5e7, "t_opt_s": t_opt,
                         "t_ring_s": t_opt * (1.5 if k else 1.0),
                         "default": {"time_s": t_opt * 1.02 * slow, "cpu_busy": 0.5},
                         "default:ucx-tcp": {"time_s": t_opt * (1.08 if n == 4 else 1.03) * slow,
                                             "cpu_busy": 0.6},
                         "gloo": {"time_s": t_opt * (1.55 if k else 1.05)}})
    return {"plan": plan, "cores": 2, "rows": rows, "env_knobs": {},
            "vans": {"tcp": "the TCP van", "ucx-tcp": "UCX over TCP with `UCX_NET_DEVICES=eth0`"}}


def test_table1_report_per_van():
    res = json.loads(json.dumps(_table1_results()))
    md, targets = table1.bench_markdown(res, None)
    assert "### The byteps jobs per van" in md and "UCX over TCP with `UCX_NET_DEVICES=eth0`" in md
    for col in ("tcp (s)", "tcp / t_opt", "gloo / tcp", "ucx-tcp (s)", "ucx-tcp / t_opt",
                "tcp / ucx-tcp", "gloo / ucx-tcp", "targets"):
        assert f"| {col} |" in md, col
    assert "| 2 | 0 | 64 MiB | 0.700 | 0.714 | 1.02 | 1.03× | 0.721 | 1.03 | 0.99× |" in md
    assert md.count("| ucx-tcp ✗ |") == 1  # n=4,k=4 at 64 MiB: 6 % slower than TCP
    assert "| tcp ✗✓, ucx-tcp ✗✗ |" in md  # n=4,k=4 at 4 MiB: 1.5 x t_opt, gloo 1.5 x t_opt
    by_name = {t["name"]: t for t in targets}
    within = by_name["emulated cluster 64 MiB: ucx-tcp van within 5 % of the TCP van, every "
                     "(n,k) (default settings)"]
    assert within["ratio"] == pytest.approx(1.02 / 1.08) and within["met"] is False
    assert "worst n=4,k=4" in within["measured"]
    for van, ratio in (("tcp", 1 / (1.02 * 1.5)), ("ucx-tcp", 1 / (1.08 * 1.5))):
        t_opt = by_name[f"emulated cluster 4 MiB: push_pull ≤ 1.15 × t_opt, every (n,k) "
                        f"({van} van, default settings)"]
        assert t_opt["ratio"] == pytest.approx(ratio) and t_opt["met"] is False
        gloo = by_name[f"emulated cluster 4 MiB: push_pull no slower than gloo, every (n,k) "
                       f"({van} van, default settings)"]
        assert gloo["met"] is (van == "tcp") and math.isfinite(gloo["ratio"])
    # a failed UCX job is a missed target, not an exception
    res["rows"][1]["default:ucx-tcp"] = {"error": "boom"}
    targets = table1_vans.van_targets(res)
    assert [t["ratio"] for t in targets if "within 5 %" in t["name"]] == [0.0]


def test_table1_report_tcp_only_has_no_van_section():
    res = json.loads(json.dumps(_table1_results()))
    res["plan"]["vans"] = ["tcp"]
    md, targets = table1.bench_markdown(res, None)
    assert "per van" not in md and not [t for t in targets if "ucx" in t["name"]]
    # the small-tensor targets of the TCP van remain
    assert [t for t in targets if "(tcp van, default settings)" in t["name"]]
