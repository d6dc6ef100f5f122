"""Scenarios of the UCX transport, one per run: ``python ucx_transport_worker.py SCENARIO``.

Run by tests/test_ucx_transport.py in a child process whose environment holds the UCX_TLS under
test (UCX reads its configuration when a context is created). Two ``UcxTestPeer``s (each a UCX
context with its own worker and progress thread) connect inside this process by exchanging
worker addresses; the ``crash`` scenario also starts a child that is killed. Each scenario
prints one line ``RESULT {json}`` with what it observed; the test asserts on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from byteps import _core, _core_testing
from byteps.errors import BytePSError

T = _core_testing
PUSH, PULL, HEARTBEAT = 21, 22, 5
SIZES = [0, 1, 4 << 10, 96 << 10, 1 << 20, 64 << 20]


def pattern(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def pair(name: str = "p", spin_s: float = 0.0, one_way: str = "auto"):
    a = T.UcxTestPeer(f"{name}-a", spin_s=spin_s, one_way=one_way)
    b = T.UcxTestPeer(f"{name}-b", spin_s=spin_s, one_way=one_way)
    la = a.connect(b.address, timeout=20, name=f"{name}-b")
    lb = b.accept(timeout=20)
    return a, b, la, lb


def sent_ok(peer, count=1, timeout=60.0):
    done = peer.wait_sent(count, timeout)
    return [(key, code) for key, code, _msg, _t0, _t1 in done]


def frames():
    """Every size into receiver-chosen buffers (registered or not, sender's memory registered or
    not), the receiver's own buffer, the other direction, and order under mixed protocols."""
    a, b, la, lb = pair("frames")
    out = {"config": a.config_summary, "peer_failure_detection": a.peer_failure_detection(la),
           "lanes": a.describe(la), "sizes": []}
    for i, size in enumerate(SIZES):
        data, key = pattern(size, i), 100 + i
        b.prepare(key, size + 7, register=(i % 2 == 0))
        rndv_before = b.stats(lb)["rndv_received"]
        a.send(la, key, PUSH, staged=a.stage(data, register=(i % 2 == 1)))
        status = sent_ok(a)
        rx = b.recv(60)
        buf = b.buffer(key)
        out["sizes"].append({
            "size": size, "sent": status, "key": rx and rx["key"],
            "payload_len": rx and rx["payload_len"], "in_buffer": rx and rx["in_prepared_buffer"],
            "exact": buf[:size] == data, "tail_untouched": buf[size:] == b"\xee" * 7,
            "rndv": b.stats(lb)["rndv_received"] - rndv_before})
    # The receiver's own buffer (policy "own"), and back from b to a.
    data = pattern(1 << 20, 7)
    a.send(la, 200, PUSH, payload=data)
    rx = b.recv(60)
    out["own_exact"] = rx is not None and rx["payload"] == data and rx["in_prepared_buffer"]
    back = pattern(4096, 8)
    b.send(lb, 300, PUSH, payload=back)
    rx = a.recv(60)
    out["reverse_exact"] = rx is not None and rx["payload"] == back
    # Order: small control frames (the link's own buffer) between large ones that may go by
    # rendezvous; every frame must arrive in send order, byte-exact.
    sent_keys, expect = [], {}
    for j in range(24):
        key = 400 + j
        big = j % 3 == 0
        data = pattern((2 << 20) if big else 100, 40 + j)
        if not big:
            b.set_policy(key, "scratch")
        a.send(la, key, PUSH if big else HEARTBEAT, payload=data)
        sent_keys.append(key)
        expect[key] = data
    got = [b.recv(60) for _ in sent_keys]
    out["order"] = [r and r["key"] for r in got] == sent_keys
    out["order_exact"] = all(r and r["payload"] == expect[r["key"]] for r in got)
    out["flush"] = a.flush(la, 10)
    out["stats_rx"] = b.stats(lb)
    out["stats_tx"] = a.stats(la)
    sent_ok(a, len(sent_keys) + 1, 30)
    # Connection::StreamPayload: the sink sees every chunk (128 KiB but the last) on its way.
    for key, size in ((600, 4096), (601, 8 << 20)):
        data = pattern(size, key)
        b.prepare(key, size)
        b.set_policy(key, "sink")
        a.send(la, key, PUSH, payload=data)
        rx = b.recv(60)
        plus_one = (np.frombuffer(data, np.uint8) + np.uint8(1)).tobytes()
        out[f"sink_{size}"] = {"exact": b.buffer(key) == plus_one, "chunks": rx["sink_chunks"],
                               "in_buffer": rx["in_prepared_buffer"]}
    # Frames that arrive before the receiver starts its connection wait for Start().
    b.set_autostart(False)
    c = T.UcxTestPeer("frames-c")
    lc = c.connect(b.address, timeout=20, name="frames-b")
    lbc = b.accept(20)
    early = [b"one", pattern(8 << 20, 9), b"three"]
    for j, data in enumerate(early):
        c.send(lc, 700 + j, PUSH, payload=data)
    # The two small frames leave eagerly; the 8 MiB one is a rendezvous, which completes only
    # once b's connection has started and fetches it.
    sent_ok(c, 2, 30)
    out["held_before_start"] = b.recv(0.5) is None
    b.start(lbc)
    got = [b.recv(30) for _ in early]
    out["after_start"] = [r and r["payload"] for r in got] == early
    out["held_max"] = b.stats(lbc)["held_max"]
    # Registration by start address: twice is refused, unregistering twice too; a frame into
    # the buffer after unregistering still arrives (UCX registers it itself then).
    registration = []
    for reg in (True, False, False):
        try:
            b.register_buffer(104, register=reg)
            registration.append("ok")
        except BytePSError as err:
            registration.append(type(err).__name__)
    a.send(la, 104, PUSH, payload=b"unregistered")
    rx = b.recv(30)
    out["registration"] = registration
    out["after_unregister"] = rx is not None and b.buffer(104)[:12] == b"unregistered"
    c.shutdown()
    a.shutdown()
    b.shutdown()
    return out


def bounds():
    """Scratch bound, kDiscard (eager and rendezvous), the handler refusing a frame, headers
    the receiver must reject."""
    out = {}
    a, b, la, lb = pair("bounds")
    data = pattern(4 << 20, 1)
    b.set_policy(1, "scratch")
    a.send(la, 1, PUSH, payload=data)
    rx = b.recv(60)
    out["scratch_4mib_exact"] = rx is not None and rx["payload"] == data
    for key, size in ((2, 100), (3, 8 << 20)):
        b.set_policy(key, "discard")
        a.send(la, key, PUSH, payload=pattern(size, key))
        rx = b.recv(60)
        out[f"discard_{size}"] = rx is not None and rx["payload_is_null"] and rx["key"] == key
    a.send(la, 4, PUSH, payload=b"after")
    rx = b.recv(60)
    out["usable_after_discard"] = rx is not None and rx["payload"] == b"after"
    out["sent_before_bound"] = sent_ok(a, 4, 20)
    b.set_policy(5, "scratch")
    a.send(la, 5, PUSH, payload=pattern((4 << 20) + 1, 5))
    out["scratch_over_bound_receiver"] = b.wait_closed(lb, 20)
    out["scratch_over_bound_sender"] = a.wait_closed(la, 20)
    a.send(la, 6, PUSH, payload=b"x")
    out["sent_after_bound"] = sent_ok(a, 2, 10)
    out["nothing_delivered"] = b.recv(0.5) is None
    a.shutdown()
    b.shutdown()
    for name, (key, typ, payload, policy) in {
            "rejected_by_handler": (7, PUSH, b"abc", "reject"),
            "unknown_type": (8, 99, b"abc", None),
            "pull_with_payload": (9, PULL, b"abc", None),
            "control_over_4mib": (10, HEARTBEAT, pattern((4 << 20) + 8, 10), None)}.items():
        a, b, la, lb = pair(name)
        if policy:
            b.set_policy(key, policy)
        a.send(la, key, typ, payload=payload)
        out[name] = {"receiver": b.wait_closed(lb, 20), "sender": a.wait_closed(la, 20),
                     "delivered": b.recv(0.2) is not None}
        a.shutdown()
        b.shutdown()
    return out


def peer_lost():
    """A closed link, a shut-down context, an abrupt one (no CLOSE sent), a refused connect."""
    out = {}
    a, b, la, lb = pair("close")
    a.close(la)
    out["close_remote"] = b.wait_closed(lb, 10)
    out["close_local_no_callback"] = a.wait_closed(la, 0.5) is None
    out["joined"] = a.join(la, 5)
    b.send(lb, 1, PUSH, payload=b"late")
    out["send_on_closed"] = sent_ok(b, 1, 5)
    a.shutdown()
    b.shutdown()

    a, b, la, lb = pair("shutdown")
    t0 = time.monotonic()
    a.shutdown()
    out["shutdown_remote"] = b.wait_closed(lb, 10)
    out["shutdown_detect_s"] = time.monotonic() - t0
    b.shutdown()

    a, b, la, lb = pair("abrupt")
    out["abrupt_detectable"] = b.peer_failure_detection(lb)
    if out["abrupt_detectable"]:
        t0 = time.monotonic()
        a.shutdown(abrupt=True)
        out["abrupt_remote"] = b.wait_closed(lb, 60)
        out["abrupt_detect_s"] = time.monotonic() - t0
    a.shutdown()
    b.shutdown()

    a, b = T.UcxTestPeer("refuser-a"), T.UcxTestPeer("refuser-b")
    b.set_refuse(True)
    try:
        a.connect(b.address, timeout=10, name="refuser")
        out["refused"] = None
    except BytePSError as err:
        out["refused"] = [type(err).__name__, str(err)]
    gone = b.address
    b.shutdown()
    t0 = time.monotonic()
    try:
        a.connect(gone, timeout=5, name="gone")
        out["connect_gone"] = None
    except BytePSError as err:
        out["connect_gone"] = [type(err).__name__, str(err)]
    out["connect_gone_s"] = time.monotonic() - t0
    a.shutdown()
    return out


CHILD = """
import sys, time
from byteps import _core_testing
p = _core_testing.UcxTestPeer("crash-child")
link = p.connect(bytes.fromhex(sys.stdin.readline().strip()), timeout=20, name="parent")
p.send(link, 1, 21, payload=b"alive")
p.wait_sent(1, 20)
print("SENT", flush=True)
time.sleep(600)
"""


def crash():
    """A peer process killed with SIGKILL: the survivor's link reports PeerLost."""
    b = T.UcxTestPeer("crash-parent")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdin.write(b.address.hex() + "\n")
        child.stdin.flush()
        lb = b.accept(30)
        rx = b.recv(30)
        out = {"detection": b.peer_failure_detection(lb),
               "received": rx is not None and rx["payload"] == b"alive",
               "child_said": child.stdout.readline().strip()}
        t0 = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        out["closed"] = b.wait_closed(lb, 60)
        out["detect_s"] = time.monotonic() - t0
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
    b.shutdown()
    return out


CHILD_RNDV = """
import sys, time
from byteps import _core_testing
p = _core_testing.UcxTestPeer("crash-child")
link = p.connect(bytes.fromhex(sys.stdin.readline().strip()), timeout=20, name="parent")
p.send(link, 1, 21, payload=bytes(8 << 20))
print("SENT", flush=True)
time.sleep(600)
"""


def crash_rendezvous():
    """A peer killed after announcing an 8 MiB frame the survivor has not fetched yet (its
    connection not started): fetching it then fails; the link reports PeerLost, nothing aborts,
    also where UCX runs the endpoint in error mode NONE (shared memory alone)."""
    b = T.UcxTestPeer("crash-parent")
    b.set_autostart(False)
    child = subprocess.Popen([sys.executable, "-c", CHILD_RNDV], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdin.write(b.address.hex() + "\n")
        child.stdin.flush()
        lb = b.accept(30)
        out = {"child_said": child.stdout.readline().strip()}
        deadline = time.monotonic() + 20
        while b.stats(lb)["held_max"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the announcement has arrived (held: not started)
        out["announced"] = b.stats(lb)["held_max"] == 1
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        b.start(lb)
        out["delivered"] = b.recv(5) is not None
        out["closed"] = b.wait_closed(lb, 30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
    b.shutdown()
    return out


def idle_cpu():
    """Two connected peers, idle for 2 s: CPU time of the whole process."""
    a, b, la, lb = pair("idle")
    a.send(la, 1, PUSH, payload=b"warm")
    b.recv(10)
    time.sleep(0.2)
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(2.0)
    out = {"wall_s": time.monotonic() - t0, "cpu_s": time.process_time() - c0}
    a.shutdown()
    b.shutdown()
    return out


def direct():
    """Frames sent while the sender's progress thread sleeps go to UCX from the sending thread:
    paced frames (the progress thread sleeps between them), then 4 threads sending on 2 links
    at once (racing the progress thread's own rounds). Order per thread and link, bytes,
    completions, and how many frames each way took."""
    a, b, la, lb = pair("direct")
    n = 100
    for i in range(n):
        a.send(la, i, PUSH, payload=pattern(256, i))
        time.sleep(0.002)
    sent = sent_ok(a, n)
    got = [b.recv(10) for _ in range(n)]
    out = {"paced": {
        "completed": sorted(map(list, sent)) == [[i, "OK"] for i in range(n)],
        "order": [g and g["key"] for g in got] == list(range(n)),
        "exact": all(g and g["payload"] == pattern(256, g["key"]) for g in got),
        "direct": a.stats(la)["direct_sent"]}}
    la2 = a.connect(b.address, timeout=20, name="direct-b2")
    lb2 = b.accept(timeout=20)
    per_thread = 300
    errors = []

    def sender(link, base):
        try:
            for j in range(per_thread):
                a.send(link, base + j, PUSH, payload=pattern(64 + j % 3000, base + j))
        except BaseException as exc:  # reported to the test
            errors.append(repr(exc))

    # Two threads per link: their frames interleave, each thread's own keys stay in order.
    threads = [threading.Thread(target=sender, args=(link, base))
               for link, base in ((la, 10_000), (la, 20_000), (la2, 30_000), (la2, 40_000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = sent_ok(a, 4 * per_thread)
    got = [b.recv(30) for _ in range(4 * per_thread)]
    seen = {}
    ok_bytes = True
    for g in got:
        if g is None:
            ok_bytes = False
            continue
        seen.setdefault((g["link"], g["key"] // 10_000), []).append(g["key"])
        ok_bytes &= g["payload"] == pattern(64 + g["key"] % 10_000 % 3000, g["key"])
    out["concurrent"] = {
        "errors": errors, "completed": len(sent) == 4 * per_thread and
        all(code == "OK" for _, code in sent),
        "received": sum(g is not None for g in got), "exact": ok_bytes,
        "streams": len(seen),
        "in_order": all(keys == sorted(keys) and len(keys) == per_thread
                        for keys in seen.values()),
        "links": sorted({link for link, _ in seen}) == sorted({lb, lb2}),
        "direct": a.stats(la)["direct_sent"] + a.stats(la2)["direct_sent"] - out["paced"]["direct"]}
    a.shutdown()
    b.shutdown()
    return out


def spin_cpu():
    """Two peers whose progress threads poll 0.4 s after their last work
    (BYTEPS_UCX_SPIN_US=400000): CPU time of the process in the 0.3 s after a frame, and in
    the 1.5 s after that."""
    a, b, la, lb = pair("spin", spin_s=0.4)
    a.send(la, 1, PUSH, payload=b"warm")
    b.recv(10)
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(0.3)
    t1, c1 = time.monotonic(), time.process_time()
    time.sleep(1.5)
    out = {"polling": {"wall_s": t1 - t0, "cpu_s": c1 - c0},
           "after": {"wall_s": time.monotonic() - t1, "cpu_s": time.process_time() - c1}}
    a.shutdown()
    b.shutdown()
    return out


def windows():
    """One-way writes: b exports windows (a slab's slot, and registered heap memory) to a, which
    writes frames through them (at their start, and at an offset); mixed with plain frames on
    the same link; the refusals."""
    out = {}
    for mode in ("1", "auto", "0"):
        a, b, la, lb = pair(f"win{mode}", one_way=mode)
        st = a.stats(la)
        out[mode] = {"one_way": st["one_way"], "why": st["one_way_why"], "min": st["one_way_min"]}
        b.prepare_shared(1, 4 << 20)
        try:
            blob = b.export_window(lb, 1)
        except BytePSError as err:
            out[mode]["export_error"] = [type(err).__name__, str(err)]
            a.shutdown()
            b.shutdown()
            continue
        w_shared = a.open_window(la, blob)
        b.prepare(2, 1 << 20, register=True)
        w_heap = a.open_window(la, b.export_window(lb, 2))
        big, small, heap = pattern(3 << 20, 1), pattern(2048, 2), pattern(1 << 20, 3)
        # in order: a written frame, a small one through the window (sent as a frame: under the
        # one-way minimum), a plain frame, a write into registered heap memory
        a.send(la, 1, PUSH, staged=a.stage(big), window=w_shared)
        a.send(la, 3, PUSH, payload=small, window=w_shared)
        a.send(la, 4, PUSH, payload=b"plain")
        a.send(la, 2, PUSH, staged=a.stage(heap), window=w_heap)
        sent = sent_ok(a, 4)
        rx = [b.recv(30) for _ in range(4)]
        out[mode].update({
            "sent": sent,
            "rx": [[r["key"], r["payload_len"], r["written"]] for r in rx],
            "small_exact": rx[1]["payload"] == small,
            "big_exact": b.buffer(1)[:len(big)] == big,
            "tail_untouched": b.buffer(1)[len(big):] == b"\xee" * ((4 << 20) - len(big)),
            "heap_exact": b.buffer(2) == heap,
            "stats_tx": a.stats(la), "stats_rx": b.stats(lb)})
        # 512 KiB written 256 KiB into the heap window: only those bytes change
        mid = pattern(512 << 10, 6)
        a.send(la, 7, PUSH, staged=a.stage(mid), window=w_heap, offset=256 << 10)
        sent_ok(a, 1)
        r = b.recv(30)
        out[mode]["offset_rx"] = [r["key"], r["payload_len"], r["written"]]
        out[mode]["offset_exact"] = b.buffer(2) == heap[:256 << 10] + mid + heap[768 << 10:]
        # a frame larger than its window, a window that does not exist, a write running past
        # the window's end from its offset, a malformed blob
        a.send(la, 5, PUSH, staged=a.stage(pattern(5 << 20, 4)), window=w_shared)
        a.send(la, 6, PUSH, staged=a.stage(pattern(1 << 20, 5)), window=99)
        a.send(la, 8, PUSH, staged=a.stage(mid), window=w_heap, offset=768 << 10)
        out[mode]["bad_sends"] = [[k, code] for k, code, _m, _t0, _t1 in a.wait_sent(3, 30)]
        try:
            a.open_window(la, b"BPSW" + b"\0" * 10)
            out[mode]["bad_blob"] = None
        except BytePSError as err:
            out[mode]["bad_blob"] = type(err).__name__
        out[mode]["link_alive"] = b.wait_closed(lb, 0.5) is None
        a.shutdown()
        b.shutdown()
    return out


def init_failure():
    """UCX_TLS naming nothing UCX has."""
    try:
        T.UcxTestPeer("nothing")
        return {"error": None}
    except BytePSError as err:
        return {"error": [type(err).__name__, str(err)], "doctor": _core.doctor.ucx_info()}


if __name__ == "__main__":
    result = globals()[sys.argv[1]]()
    print("RESULT " + json.dumps(result), flush=True)
