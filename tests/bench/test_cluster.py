"""The emulated cluster (benchmarks.cluster): namespaces, shaping, isolation, real jobs,
cleanup. Needs root and iproute2 (skipped otherwise); about 30 s."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cluster as bc
from benchmarks import kernel

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(bc.netns_unavailable() is not None,
                       reason=f"emulated cluster unavailable: {bc.netns_unavailable()}"),
]

HERE = Path(__file__).resolve().parent
_count = itertools.count()


def _prefix() -> str:
    return f"bpt{os.getpid() % 10000}{next(_count)}"


def _ours(prefix: str) -> list[str]:
    return [ns for ns in bc.list_netns() if ns.startswith(prefix + "-")]


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20).stdout


def _pid_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_create_and_teardown_leave_nothing():
    prefix = _prefix()
    root_links = _ip("-o", "link", "show")
    with bc.EmulatedCluster(2, 1, 200e6, prefix=prefix) as c:
        assert sorted(_ours(prefix)) == sorted(c.namespaces)
        assert [h.role for h in c.hosts] == ["worker", "worker", "server"]
        assert len({h.address for h in c.hosts}) == 3
        assert all(h.address.startswith("10.77.") for h in c.hosts)
        for h in c.hosts:
            links = _ip("-n", h.netns, "-o", "link", "show")
            assert "lo: <LOOPBACK,UP" in links and "eth0@" in links
            qdiscs = subprocess.run(["tc", "-n", h.netns, "qdisc", "show", "dev", "eth0"],
                                    capture_output=True, text=True, timeout=20).stdout
            assert c.shaper in kernel.SHAPERS and c.shaper in qdiscs
            assert _host_cc(h.netns) == c.congestion_control
        bridge_links = _ip("-n", c.bridge_netns, "-o", "link", "show")
        assert all(f"{h.name}@" in bridge_links for h in c.hosts)
        # nothing of ours appears in the root namespace
        assert _ip("-o", "link", "show").count("veth") == root_links.count("veth")
        proc = c.spawn("w0", ["sleep", "30"])
    assert proc.poll() is not None  # stopped by close()
    assert _ours(prefix) == []
    c.close()  # idempotent
    assert _ours(prefix) == []


def _host_cc(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "cat", kernel.CC_SYSCTL],
                          capture_output=True, text=True, timeout=20).stdout.strip()


def test_congestion_control_cubic_where_allowed_else_the_namespace_default():
    support = kernel.probe_kernel()
    allowed = support.cc_allowed or ()
    want = "cubic" if "cubic" in allowed else support.cc_default
    with bc.EmulatedCluster(2, 0, 200e6, prefix=_prefix()) as c:
        assert c.congestion_control == want
        assert c.congestion_control_requested == "cubic"
        assert [_host_cc(h.netns) for h in c.hosts] == [want, want]
        info = c.network_info()
        assert info["congestion_control"] == want and info["shaper"] == c.shaper
    # an algorithm the namespaces may select (reno always is) is used, a refused one is not
    other = next((a for a in allowed if a != support.cc_default), support.cc_default)
    for ask, got in ((other, other), ("no_such_algorithm", support.cc_default)):
        with bc.EmulatedCluster(1, 0, 0, prefix=_prefix(), congestion_control=ask) as c:
            assert c.congestion_control == got == _host_cc(c.hosts[0].netns), ask
    with bc.EmulatedCluster(1, 0, 0, prefix=_prefix(), congestion_control=None) as c:
        assert c.congestion_control == support.cc_default


def test_htb_shapes_where_tbf_is_missing(monkeypatch):
    support = kernel.probe_kernel()
    if "htb" not in support.shapers:
        pytest.skip(f"this kernel has no htb qdisc (shapers: {support.shapers})")
    from dataclasses import replace

    from benchmarks import netns

    monkeypatch.setattr(netns, "probe_kernel", lambda: replace(support, shaper="htb"))
    rate = 200e6
    with bc.EmulatedCluster(1, 1, rate, prefix=_prefix()) as c:
        assert c.shaper == "htb"
        qdiscs = subprocess.run(["tc", "-n", c.hosts[0].netns, "qdisc", "show", "dev", "eth0"],
                                capture_output=True, text=True, timeout=20).stdout
        assert "htb" in qdiscs and "tbf" not in qdiscs
        got = bc.measure_link(c, "w0", "s0", seconds=2.0)
    assert 0.85 <= got * 8 / rate <= 1.02, f"{got * 8 / 1e6:.1f} Mbit/s at 200 Mbit/s set"


def test_latency_works_or_fails_cleanly():
    prefix = _prefix()
    try:
        with bc.EmulatedCluster(1, 1, 200e6, latency_ms=2.0, prefix=prefix) as c:
            qdiscs = subprocess.run(["tc", "-n", c.hosts[0].netns, "qdisc", "show"],
                                    capture_output=True, text=True, timeout=20).stdout
            assert "netem" in qdiscs and c.shaper in qdiscs
    except RuntimeError as exc:
        assert "netem" in str(exc)
    assert _ours(prefix) == []


def test_shaped_link_measures_the_set_rate():
    rate = 200e6
    with bc.EmulatedCluster(1, 1, rate, prefix=_prefix()) as c:
        up = bc.measure_link(c, "w0", "s0", seconds=2.0)
        down = bc.measure_link(c, "s0", "w0", seconds=2.0)
    for got in (up, down):
        assert 0.85 <= got * 8 / rate <= 1.02, f"{got * 8 / 1e6:.1f} Mbit/s at 200 Mbit/s set"


def test_hosts_reach_each_other_and_nothing_else():
    # A listener on the root namespace's loopback: a host must not reach it.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    probe = ("import socket,sys\n"
             "try:\n"
             "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close()\n"
             "    print('CONNECTED')\n"
             "except OSError as e:\n"
             "    print('REFUSED', e)\n")
    try:
        with bc.EmulatedCluster(2, 0, 200e6, prefix=_prefix()) as c:
            w0, w1 = c.workers
            got = bc.measure_link(c, w0, w1, seconds=0.5, nbytes=1 << 20)
            assert got > 0
            for h in c.hosts:
                routes = _ip("-n", h.netns, "route", "show").strip().splitlines()
                assert len(routes) == 1 and routes[0].startswith("10.77.0.0/24 dev eth0")
                # route lookups only (no packet is sent): no way out of the cluster network
                out = subprocess.run(["ip", "-n", h.netns, "route", "get", "192.0.2.1"],
                                     capture_output=True, text=True, timeout=20)
                assert out.returncode != 0 and "unreachable" in out.stderr.lower()
                names = [ln.split(":")[1].strip().split("@")[0] for ln in
                         _ip("-n", h.netns, "-o", "link", "show").splitlines()]
                assert sorted(names) == ["eth0", "lo"]
            p = c.spawn(w0, [sys.executable, "-c", probe, str(port)],
                        stdout=subprocess.PIPE, text=True)
            out = p.communicate(timeout=20)[0]
            assert out.startswith("REFUSED"), out
    finally:
        lsock.close()


def test_tiny_byteps_job_exact_sum():
    with bc.EmulatedCluster(2, 1, 200e6, prefix=_prefix()) as c:
        res = bc.run_byteps_job(c, bc.pushpull_worker_argv(64 * 1024 + 12, 2), timeout=90)
        assert res.ok, res.output
        for i in range(2):
            assert any(ln.startswith("RESULT ") for ln in res.lines(f"worker {i}")), res.output
        assert c.namespaces  # still usable after the job
        assert not any(p.poll() is None for p in c._procs)


def test_colocated_servers_k0():
    with bc.EmulatedCluster(2, 0, 400e6, prefix=_prefix()) as c:
        reports = []
        stats = bc.run_pushpull(c, 1 << 20, iters=3, reports=reports)
        idle = bc.idle_before_iteration(c)
    assert stats.seconds > 0
    # every link idles until its shaper's bucket is full again before each timed iteration:
    # twice the 4 ms the bucket (4 ms of the rate) takes to refill
    assert idle == pytest.approx(2 * bc.tbf_params(400e6)[0] * 8 / 400e6) == \
        pytest.approx(0.008)
    for r in reports:
        assert r["t_end"] - r["t_start"] - sum(r["times"]) >= 3 * idle, r


def test_unshaped_links_need_no_idle_time():
    with bc.EmulatedCluster(2, 0, 0, prefix=_prefix()) as c:
        assert c.shaper is None and bc.idle_before_iteration(c) == 0


@pytest.mark.parametrize("mode,sig", [("with", signal.SIGINT), ("handler", signal.SIGINT),
                                      ("handler", signal.SIGTERM)])
def test_signal_cleans_up(mode, sig):
    prefix = _prefix()
    proc = subprocess.Popen([sys.executable, str(HERE / "hold_cluster.py"), prefix, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() else "")
        child = int(line.split()[1])
        assert len(_ours(prefix)) == 4
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"hold_cluster.py ({mode}) did not exit 30 s after signal {sig}; its "
                        f"stderr (stack dumps from faulthandler after 20 s):\n{err[-6000:]}")
        assert proc.returncode != 3
        assert _ours(prefix) == []
        assert _pid_gone(child)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for ns in _ours(prefix):  # only ours, and only if the test failed
            subprocess.run(["ip", "netns", "del", ns], timeout=20, check=False)
