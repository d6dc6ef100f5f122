"""The UCX transport (core/cpp/comm/ucx) on its own, before a van uses it: two UCX contexts in
one process connect by exchanging worker addresses (no socket of ours) and exchange frames of
0 B to 64 MiB into buffers the receiver chooses; sizes from a peer are bounded as on TCP; a
closed, shut-down, refused or killed peer is reported as PeerLost; an idle process sleeps.

Each scenario runs in a child (tests/workers/ucx_transport_worker.py) whose environment sets
UCX_TLS: ``tcp``, and ``shm`` (posix/sysv shared memory with cma, whatever UCX finds here).
UCX reads its configuration itself when a context is created; nothing overrides it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from jobs import TESTS, clean_job_env
from testing_hooks import core_testing

pytestmark = pytest.mark.skipif(
    not core_testing().ucx_available,
    reason="this build has no UCX transport (pkg-config found no ucx at build time)")

WORKER = str(TESTS / "workers" / "ucx_transport_worker.py")
TLS = ["tcp", "shm"]


def run(scenario: str, tls: str, timeout: float = 240, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, WORKER, scenario],
                          env=clean_job_env({"UCX_TLS": tls, **(env or {})}),
                          capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"{scenario} with UCX_TLS={tls}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n"
        f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def test_a_users_rendezvous_threshold_is_honoured():
    # UCX_RNDV_THRESH set: no frame is forced eager, UCX applies the threshold (8 KiB: the
    # 96 KiB and 1 MiB frames go by rendezvous, 4 KiB eager), and every frame is still exact
    r = run("frames", "shm", env={"UCX_RNDV_THRESH": "8k"})
    rndv = {s["size"]: s["rndv"] for s in r["sizes"]}
    assert rndv[4096] == 0 and rndv[96 << 10] == 1 and rndv[1 << 20] == 1, rndv
    assert all(s["exact"] and s["tail_untouched"] for s in r["sizes"]), r["sizes"]


@pytest.mark.parametrize("tls", TLS)
def test_frames_arrive_byte_exact_in_order(tls):
    r = run("frames", tls)
    assert f"UCX_TLS={tls}" in r["config"]
    for i, s in enumerate(r["sizes"]):
        assert s["sent"] == [[100 + i, "OK"]], s
        assert s["payload_len"] == s["size"] and s["in_buffer"], s
        assert s["exact"] and s["tail_untouched"], s
    assert r["own_exact"] and r["reverse_exact"]
    assert r["order"] and r["order_exact"] and r["flush"]
    rx = r["stats_rx"]
    # Shared memory fetches the large frames by rendezvous, straight into place (64 MiB, 1 MiB,
    # the 2 MiB frames of the order test); over TCP, where UCX's rendezvous has no zero copy
    # and only adds a round trip, frames up to 4 MiB go eager and only the 64 MiB one is fetched.
    assert rx["rndv_received"] == 1 if tls == "tcp" else rx["rndv_received"] >= 1 + 8, rx
    # Up to 128 KiB shared memory sends eager too (a 96 KiB frame: UCX's own threshold would
    # fetch it by rendezvous, a round trip more); 1 MiB and up by rendezvous.
    rndv = {s["size"]: s["rndv"] for s in r["sizes"]}
    assert rndv[96 << 10] == 0 and rndv[4096] == 0, rndv
    assert rndv[64 << 20] == 1 and rndv[1 << 20] == (0 if tls == "tcp" else 1), rndv
    assert rx["frames_received"] == len(r["sizes"]) + 1 + 24
    assert r["stats_tx"]["frames_sent"] == len(r["sizes"]) + 1 + 24
    for size in (4096, 8 << 20):
        sink = r[f"sink_{size}"]
        assert sink["exact"] and sink["in_buffer"], sink
        full, last = divmod(size, 128 << 10)
        assert sink["chunks"] == [128 << 10] * full + ([last] if last else []), sink
    assert r["held_before_start"] and r["after_start"] and r["held_max"] == 3
    # key 104's buffer was registered by prepare(): again is refused, then unregistered once.
    assert r["registration"] == ["InvalidArgumentError", "ok", "InvalidArgumentError"]
    assert r["after_unregister"]
    # tcp reports a failed peer; UCX 1.13's shared memory alone cannot (error mode none).
    assert r["peer_failure_detection"] == (tls == "tcp")


@pytest.mark.parametrize("tls", TLS)
def test_sizes_from_a_peer_are_bounded(tls):
    r = run("bounds", tls)
    assert r["scratch_4mib_exact"]
    assert r["discard_100"] and r["discard_8388608"] and r["usable_after_discard"]
    assert [code for _k, code in r["sent_before_bound"]] == ["OK"] * 4
    code, msg = r["scratch_over_bound_receiver"]
    assert code == "INVALID_ARGUMENT" and "nothing expects" in msg, msg
    assert r["scratch_over_bound_sender"][0] == "PEER_LOST"
    assert r["sent_after_bound"][1] == [6, "PEER_LOST"]
    assert r["nothing_delivered"]
    for name in ("rejected_by_handler", "unknown_type", "pull_with_payload", "control_over_4mib"):
        case = r[name]
        assert case["receiver"][0] == "INVALID_ARGUMENT", (name, case)
        assert case["sender"][0] == "PEER_LOST", (name, case)
        assert not case["delivered"], (name, case)
    assert "rejects key 7" in r["rejected_by_handler"]["receiver"][1]
    assert "unknown message type 99" in r["unknown_type"]["receiver"][1]


@pytest.mark.parametrize("tls", TLS)
def test_lost_peers_are_reported(tls):
    r = run("peer_lost", tls)
    assert r["close_remote"][0] == "PEER_LOST" and "closed the link" in r["close_remote"][1]
    assert r["close_local_no_callback"] and r["joined"]
    assert r["send_on_closed"] == [[1, "PEER_LOST"]]
    assert r["shutdown_remote"][0] == "PEER_LOST" and r["shutdown_detect_s"] < 5
    if tls == "tcp":
        assert r["abrupt_detectable"]
        code, msg = r["abrupt_remote"]
        assert code == "PEER_LOST" and "UCX endpoint" in msg, msg
        assert r["abrupt_detect_s"] < 30
    assert r["refused"][0] == "PeerLostError" and "refused" in r["refused"][1]
    assert r["connect_gone"][0] in ("PeerLostError", "BytePSTimeoutError", "ConfigError")
    assert r["connect_gone_s"] < 10


def test_a_killed_peer_process_is_reported():
    r = run("crash", "tcp")
    assert r["detection"] and r["received"] and r["child_said"] == "SENT"
    code, msg = r["closed"]
    assert code == "PEER_LOST" and "UCX" in msg, msg
    assert r["detect_s"] < 30
    print(f"\nUCX tcp: SIGKILLed peer reported after {r['detect_s']:.3f} s: {msg}")


@pytest.mark.parametrize("tls", TLS)
def test_a_killed_peer_s_unfetched_rendezvous_fails_the_link(tls):
    r = run("crash_rendezvous", tls)
    assert r["child_said"] == "SENT" and r["announced"] and not r["delivered"]
    assert r["closed"][0] == "PEER_LOST", r


@pytest.mark.parametrize("tls", TLS)
def test_idle_links_cost_no_cpu(tls):
    r = run("idle_cpu", tls)
    # Two progress threads spinning would use ~4 s of CPU in 2 s.
    assert r["cpu_s"] < 0.2 * r["wall_s"], r


@pytest.mark.parametrize("tls", TLS)
def test_senders_hand_frames_to_ucx_while_the_progress_thread_sleeps(tls):
    r = run("direct", tls)
    p, c = r["paced"], r["concurrent"]
    assert p["completed"] and p["order"] and p["exact"], p
    # Paced 2 ms apart, nearly every frame finds the progress thread asleep.
    assert p["direct"] >= 50, p
    assert not c["errors"] and c["completed"] and c["received"] == 1200 and c["exact"], c
    assert c["streams"] == 4 and c["in_order"] and c["links"], c
    print(f"\nUCX {tls}: {p['direct']} of 100 paced frames and {c['direct']} of 1200 "
          "concurrent ones sent by their own thread")


@pytest.mark.parametrize("tls", TLS)
def test_progress_threads_poll_for_the_spin_time_then_sleep(tls):
    r = run("spin_cpu", tls)
    # Two threads polling take most of a core each (at least one core's worth over 2 cores
    # shared with the rest of the machine); once 0.4 s have passed they sleep again.
    assert r["polling"]["cpu_s"] > 0.5 * r["polling"]["wall_s"], r
    assert r["after"]["cpu_s"] < 0.5 * r["after"]["wall_s"], r


def test_frames_go_one_way_through_a_peer_s_window():
    """Over shared memory with one-way writes on (BYTEPS_UCX_ONE_WAY=1): frames through a window
    land byte-exact in the receiver's memory (a slab slot of UcxContext::AllocateShared, and
    registered heap memory; at the window's start or an offset into it) and arrive as headers
    alone, announcing the bytes written, in order with the link's other frames; a frame under
    the one-way minimum is sent as a frame; a frame larger than its window, through no window or
    running past the window's end from its offset fails alone (InvalidArgument), a malformed
    blob is refused, the link stays up. auto: shared memory offers no windows, 0: none at all."""
    r = run("windows", "shm")
    on = r["1"]
    assert on["one_way"] and on["min"] > 96 << 10, on
    assert on["sent"] == [[1, "OK"], [3, "OK"], [4, "OK"], [2, "OK"]], on["sent"]
    assert on["rx"] == [[1, 0, 3 << 20], [3, 2048, 0], [4, 5, 0], [2, 0, 1 << 20]], on["rx"]
    assert on["big_exact"] and on["tail_untouched"] and on["heap_exact"] and on["small_exact"]
    assert on["stats_tx"]["one_way_sent"] == 2 and on["stats_rx"]["one_way_received"] == 2
    assert on["offset_rx"] == [7, 0, 512 << 10] and on["offset_exact"], on
    assert on["bad_sends"] == [[5, "INVALID_ARGUMENT"], [6, "INVALID_ARGUMENT"],
                               [8, "INVALID_ARGUMENT"]], on
    assert on["bad_blob"] == "InvalidArgumentError" and on["link_alive"]
    for mode, why in (("auto", "BYTEPS_UCX_ONE_WAY=1"), ("0", "BYTEPS_UCX_ONE_WAY=0")):
        assert not r[mode]["one_way"] and why in r[mode]["why"], r[mode]
        assert r[mode]["export_error"][0] == "InvalidArgumentError", r[mode]
        assert why in r[mode]["export_error"][1], r[mode]


def test_no_windows_over_ucx_tcp():
    """Over UCX's TCP transport a write costs more than an eager frame: no windows, whatever
    BYTEPS_UCX_ONE_WAY says, and the refusal says why."""
    r = run("windows", "tcp")
    for mode in ("1", "auto"):
        assert not r[mode]["one_way"] and "tcp" in r[mode]["why"], r[mode]
        assert r[mode]["export_error"][0] == "InvalidArgumentError", r[mode]


def test_ucx_start_failure_names_ucx_and_the_transports():
    r = run("init_failure", "nonsense")
    cls, msg = r["error"]
    assert cls == "ConfigError" and "UCX" in msg and "UCX_TLS=nonsense" in msg, msg
    assert r["doctor"]["tls"] == "nonsense" and "UCX_TLS=nonsense" in r["doctor"]["error"]


@pytest.mark.parametrize("user_tls, expected", [(None, "sm,self"), ("tcp", "tcp")])
def test_default_transports_apply_only_where_ucx_tls_is_not_chosen(user_tls, expected):
    """A context's default transport list (the colocated van's "sm,self") replaces UCX's own
    default, and never a UCX_TLS the user set."""
    env = clean_job_env()
    env.pop("UCX_TLS", None)
    if user_tls is not None:
        env["UCX_TLS"] = user_tls
    code = ("from byteps import _core_testing\n"
            "p = _core_testing.UcxTestPeer('tls', default_tls='sm,self')\n"
            "print(p.config_summary)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"UCX_TLS={expected}," in proc.stdout, proc.stdout
