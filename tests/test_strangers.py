"""Strangers cannot stall a job: processes that are not part of it connect to the listening
ports of a running job's scheduler and server and misbehave in every way a port scanner, a
confused client or an attacker would. The job must neither slow down nor change a result, and
what the strangers cost the scheduler and server (threads, descriptors, memory, the accept path)
stays bounded.

Also here: a hostile peer that knows the job secret cannot make a server allocate what its
headers claim, and a rank that stops making calls early makes the others fail at once instead
of waiting for BYTEPS_TIMEOUT (that desynchronisation, not the strangers, was what stalled the
scenario's jobs when it was first reported).
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from jobs import (
    Group,
    LiveJob,
    assert_ok,
    clean_job_env,
    free_port,
    rss_and_fds,
    run_job,
    worker_lines,
)
from test_security import FRAME_MAGIC, HEADER, handshake, handshake_on, listening_ports, recv_exact

LOOP_WORKER = str(Path(__file__).resolve().parent / "workers" / "loop_worker.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

REGISTER, ADDRESS_BOOK, HEARTBEAT, FINALIZE, FINALIZE_DONE = 1, 2, 5, 6, 7
HELLO, PUSH, PULL, PULL_RESPONSE, DATA_ERROR = 20, 21, 22, 23, 24
PUSH_ACK, PULL_WINDOW = 28, 34
FLOAT32 = 0
MAX_PENDING = 256  # comm/acceptor.h kMaxPending


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def _targets(job: LiveJob):
    """(secret, {role: (address, port)}, {role: pid}) of the job's scheduler and server."""
    sched, server = job.find("scheduler"), job.find("server")
    env = job.snapshot()[sched]
    addrs = {"scheduler": (env["DMLC_PS_ROOT_URI"], int(env["DMLC_PS_ROOT_PORT"])),
             "server": ("127.0.0.1", listening_ports(server)[0])}
    return env["BYTEPS_SECRET"].encode(), addrs, {"scheduler": sched, "server": server}


def _one_stranger(addr, payload: bytes) -> None:
    # The stranger's own CPU time is not what the test measures: on a 2-core machine it
    # would compete with the job's four processes. Lowest priority for this thread only.
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    try:
        with socket.create_connection(addr, timeout=5) as s:
            try:
                s.sendall(payload)
            except OSError:
                pass  # the peer dropped us on the first wrong byte: as it should
            time.sleep(0.2)
    except OSError:
        pass


def _scenario_round(addrs, payloads, silent: list) -> None:
    """The reported scenario once against every address: one connection per payload (1 MiB of
    random bytes, 64 zero bytes, b"BYTEPS" + 58 random bytes, 8 x 0xff + 4 KiB random), each
    closed 0.2 s later, then one connection that never speaks (kept open in ``silent``)."""
    threads = [threading.Thread(target=_one_stranger, args=(a, p)) for a in addrs for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a in addrs:
        silent.append(socket.create_connection(a, timeout=5))


def _iteration_times(out: str, ranks: int):
    times = []
    for r in range(ranks):
        lines = [ln for ln in worker_lines(out, r) if ln.startswith("TIMES ")]
        assert lines, f"worker {r} printed no TIMES line"
        times.extend(json.loads(lines[-1][6:]))
    return times


def _stranger_scenario_ratio(tmp_path: Path) -> float:
    """One job, 20 stranger rounds with quiet phases between them; checks the job and its
    threads, returns median push_pull time during the rounds / between them."""
    stop = tmp_path / "stop"
    job = LiveJob(["--workers", "2", "--servers", "1"], "steady", str(stop), script=LOOP_WORKER)
    silent: list = []
    windows = []
    try:
        job.wait_for(r"^\[worker \d\] READY", count=2, timeout=120)
        _, addrs, pids = _targets(job)
        threads0 = {role: _threads(pid) for role, pid in pids.items()}
        payloads = [os.urandom(1 << 20), b"\0" * 64, b"BYTEPS" + os.urandom(58),
                    b"\xff" * 8 + os.urandom(4096)]
        for _ in range(20):
            t0 = time.time()
            _scenario_round(list(addrs.values()), payloads, silent)
            t1 = time.time()
            windows.append((t0, t1))
            time.sleep(t1 - t0)  # a quiet phase as long as the round
        threads1 = {role: _threads(pid) for role, pid in pids.items()}
        stop.touch()
        rc = job.wait(120)
    finally:
        for s in silent:
            s.close()
        job.kill()
    assert_ok(rc, job.output, 2)
    assert "not a byteps authentication handshake" in job.output
    assert threads1 == threads0, (threads0, threads1)  # strangers get no thread of their own
    times = _iteration_times(job.output, 2)
    during, quiet = [], []
    for start, took in times:
        if windows[0][0] <= start <= windows[-1][1] + (windows[-1][1] - windows[-1][0]):
            (during if any(a <= start <= b for a, b in windows) else quiet).append(took)
    assert len(during) >= 20 and len(quiet) >= 20, (len(during), len(quiet))
    ratio = statistics.median(during) / statistics.median(quiet)
    print(f"median push_pull during the strangers' rounds {statistics.median(during) * 1e3:.2f} ms "
          f"({len(during)}), between them {statistics.median(quiet) * 1e3:.2f} ms ({len(quiet)}): "
          f"ratio {ratio:.3f}")
    return ratio


def test_stranger_scenario_20_rounds_costs_the_job_nothing(tmp_path: Path):
    """The reported scenario, 20 rounds in a row against the scheduler and the server of a job
    whose 2 workers push_pull a 300 000-element float32 tensor in a loop (every result checked
    exactly by the workers). Rounds alternate with quiet phases of the same length; iterations
    that start during a round are not slower (median) than those in the quiet phases by more
    than 10 %.

    The ratio is a timing on a shared 2-core machine: a run above the bound is measured once more
    in a fresh job (a real cost of the strangers shows in both runs, a burst of other load on
    the machine in one); every run checks the job's results and threads."""
    ratios = []
    for attempt in range(2):
        run_dir = tmp_path / f"run{attempt}"
        run_dir.mkdir()
        ratios.append(_stranger_scenario_ratio(run_dir))
        if ratios[-1] <= 1.10:
            break
    assert min(ratios) <= 1.10, ratios


def _trickle(addr, seconds: float, result: dict) -> None:
    """Sends a valid-looking hello one byte per second; records when the peer dropped it."""
    t0 = time.monotonic()
    hello = b"BPSA\x01" + os.urandom(32)
    try:
        with socket.create_connection(addr, timeout=seconds + 5) as s:
            for b in hello:
                s.sendall(bytes([b]))
                time.sleep(1.0)
                if time.monotonic() - t0 > seconds:
                    break
            s.settimeout(seconds)
            result["eof"] = s.recv(100) == b""
    except OSError:
        result["eof"] = True
    result["after"] = time.monotonic() - t0


def test_floods_cost_no_threads_slots_or_accept_path(tmp_path: Path):
    """Against a running job: 600 half-open connections per port (more than the acceptor's
    256 pending handshakes), a peer that trickles one byte per second, a peer that sends the
    handshake's first message and stops, and a flood of 3 000 connect-and-close. Meanwhile a
    job member's handshake still gets through at once on both ports, the scheduler and server
    start no thread for the strangers, their descriptors and memory stay bounded, the trickling
    peer is dropped at the handshake deadline, and the job ends with every result right."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    stop = tmp_path / "stop"
    job = LiveJob(["--workers", "2", "--servers", "1"], "steady", str(stop), script=LOOP_WORKER)
    held: list = []
    try:
        job.wait_for(r"^\[worker \d\] READY", count=2, timeout=120)
        secret, addrs, pids = _targets(job)
        before = {role: (_threads(pid), *rss_and_fds(pid)) for role, pid in pids.items()}
        trickles = {role: {} for role in addrs}
        trickle_threads = [threading.Thread(target=_trickle, args=(a, 12.0, trickles[role]))
                           for role, a in addrs.items()]
        for t in trickle_threads:
            t.start()
        for addr in addrs.values():
            partial = socket.create_connection(addr, timeout=5)
            partial.sendall(b"BPSA\x01" + os.urandom(32))
            assert len(partial.recv(100)) > 0  # the reply; then it never sends its MAC
            held.append(partial)
            for _ in range(600):
                held.append(socket.create_connection(addr, timeout=5))
        for i in range(3000):
            addr = list(addrs.values())[i % 2]
            try:
                socket.create_connection(addr, timeout=5,
                                         source_address=(f"127.0.2.{1 + i % 200}", 0)).close()
            except OSError:
                pass
        # A job member's handshake gets through while all of that is pending.
        for role, addr in addrs.items():
            t0 = time.monotonic()
            verdict, server_ok, *_ = handshake(addr, secret)
            took = time.monotonic() - t0
            assert verdict == 1 and server_ok, role
            assert took < 2.0, (role, took)
        during = {role: (_threads(pid), *rss_and_fds(pid)) for role, pid in pids.items()}
        for t in trickle_threads:
            t.join(30)
        stop.touch()
        rc = job.wait(120)
    finally:
        for s in held:
            s.close()
        job.kill()
    assert_ok(rc, job.output, 2)
    for role in addrs:
        (th0, rss0, fd0), (th1, rss1, fd1) = before[role], during[role]
        print(f"{role}: threads {th0} -> {th1}, RSS {rss0} -> {rss1} KiB, descriptors {fd0} -> "
              f"{fd1}; trickling peer dropped after {trickles[role].get('after', 0):.1f} s")
        assert th1 <= th0 + 2, (role, th0, th1)  # +2: one job-member connection's threads
        assert fd1 <= fd0 + MAX_PENDING + 8, (role, fd0, fd1)
        assert rss1 - rss0 < 16 << 10, (role, rss0, rss1)
        assert trickles[role].get("eof"), (role, trickles[role])
        assert trickles[role]["after"] < 9.0, (role, trickles[role])  # 5 s deadline, 1 s steps


# ------------------------------------------------------- a hostile peer with the job secret --


def _frame(typ, payload=b"", *, dtype=0, sender=0, rnd=0, key=0, length=None, aux=0, flags=0,
           written=0):
    n = len(payload) if length is None else length
    return HEADER.pack(FRAME_MAGIC, typ, dtype, flags, sender, rnd, key, n, aux, written) + payload


def _recv_all(s: socket.socket, n: int) -> bytes:
    data = recv_exact(s, n)
    if len(data) < n:
        raise ConnectionError("closed by the peer")
    return data


def _read_frame(s: socket.socket):
    h = HEADER.unpack(_recv_all(s, HEADER.size))
    return h, _recv_all(s, h[7]) if h[7] else b""


def _closed_by_peer(s: socket.socket, timeout: float = 10.0) -> bool:
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _authenticated(addr, secret):
    s = socket.create_connection(addr, timeout=10)
    verdict, ok, *_ = handshake_on(s, secret)
    assert verdict == 1 and ok
    return s


def bare_job_env(extra=None):
    """A job of 1 worker machine and 1 server described by variables alone, with a free
    scheduler port and a fresh secret (``extra`` on top): (port, secret, environment)."""
    port = free_port()
    secret = os.urandom(16).hex()
    env = clean_job_env({"DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
                         "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                         "BYTEPS_SECRET": secret, "BYTEPS_TIMEOUT": "60", **(extra or {})})
    return port, secret, env


def wait_listening(port: int, timeout: float = 10.0) -> None:
    """Returns once something accepts connections on 127.0.0.1:port (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)


def _register_as_worker(addr, secret, bound: int):
    """Registers as worker 0 of a 1-worker job; returns (control socket, server port, the
    partition bound of the address book)."""
    s = _authenticated(addr, secret)
    host = b"127.0.0.1"
    reg = (struct.pack("<Bi", 0, 0) + struct.pack("<I", len(host)) + host +
           struct.pack("<IIIIQI", 0, 1, 1, 1, bound, os.getpid()) +
           struct.pack("<Bi", 0, -1))  # synchronous (BYTEPS_ENABLE_ASYNC=0), no bound
    s.sendall(_frame(REGISTER, reg))
    while True:
        h, p = _read_frame(s)
        if h[1] == ADDRESS_BOOK:
            break
    off = 8  # my_rank, number of servers (1)
    (hlen,) = struct.unpack_from("<I", p, off + 4)
    off += 4 + 4 + hlen
    (port,) = struct.unpack_from("<I", p, off)
    off += 4 + 1 + 8  # port, colocated, share: the partition bound follows the servers
    (book_bound,) = struct.unpack_from("<Q", p, off)
    return s, port, book_bound


def test_sizes_from_an_authenticated_peer_are_bounded_before_allocation():
    """A peer that knows the secret registers as the only worker and then lies about sizes:
    a push claiming 1 TiB, and one a page larger than the job's partitions, are dropped
    connections, and so is one announcing bytes written one-way without a window (the server
    allocates nothing for them and keeps serving); a window offered for its sums over TCP is
    refused with a warning, and the sums stay frames; a push of the wrong size for an
    existing key is read past and answered with DATA_ERROR; a control frame larger than any
    control message is a dropped connection at the scheduler. The real exchange still works
    afterwards and the job ends cleanly."""
    port, secret, env = bare_job_env()
    bound = 262144
    with Group() as group:  # stops (by PID) whatever still runs on the way out
        procs = {role: group.start([sys.executable, "-m", "byteps.server"],
                                   dict(env, DMLC_ROLE=role), label=role)
                 for role in ("scheduler", "server")}
        sched_addr = ("127.0.0.1", port)
        wait_listening(port)
        ctl, server_port, book_bound = _register_as_worker(sched_addr, secret.encode(), bound)
        assert book_bound == bound
        srv = ("127.0.0.1", server_port)
        rss0, _ = rss_and_fds(procs["server"].pid)

        def worker_conn():
            c = _authenticated(srv, secret.encode())
            c.sendall(_frame(HELLO, sender=0))
            return c

        for claimed in (1 << 40, bound + 4096):
            c = worker_conn()
            c.sendall(_frame(PUSH, key=7, length=claimed) + b"\0" * 4096)
            assert _closed_by_peer(c), claimed
            c.close()
        rss1, _ = rss_and_fds(procs["server"].pid)
        assert rss1 - rss0 < 32 << 10, (rss0, rss1)
        # A real push of key 1 (4 KiB), then one of the wrong size for it: DATA_ERROR, and the
        # connection goes on (the payload was read past, not buffered).
        c = worker_conn()
        # A window on where its sums should go, over TCP (no one-way writes): refused, logged,
        # and the sums stay frames.
        c.sendall(_frame(PULL_WINDOW, b"BPSW" + b"\0" * 60, key=1, aux=4096))
        data = struct.pack("<1024f", *([1.5] * 1024))
        # Every push is acknowledged on receipt (PUSH_ACK: key, aux = round), before its sum.
        c.sendall(_frame(PUSH, data, key=1, rnd=0, flags=1))
        h, p = _read_frame(c)
        assert (h[1], h[6], h[8], p) == (PUSH_ACK, 1, 0, b""), h
        h, p = _read_frame(c)
        assert h[1] == PULL_RESPONSE and p == data
        c.sendall(_frame(PUSH, b"\0" * 8192, key=1, rnd=1))
        h, p = _read_frame(c)
        assert h[1] == DATA_ERROR and b"holds 4096 bytes" in p, p
        h, p = _read_frame(c)
        assert h[1] == PUSH_ACK, h
        c.sendall(_frame(PUSH, data, key=1, rnd=1, flags=1))
        h, p = _read_frame(c)
        assert (h[1], h[6], h[8]) == (PUSH_ACK, 1, 1), h
        h, p = _read_frame(c)
        assert h[1] == PULL_RESPONSE and h[5] == 1 and p == data
        # A push claiming to have been written one-way into a window this TCP connection was
        # never given (PUSH_ACKs carried none): the connection is dropped.
        c.sendall(_frame(PUSH, key=1, rnd=2, flags=1, written=4096))
        assert _closed_by_peer(c)
        # Control plane: a frame larger than any control message drops that connection only.
        extra = _authenticated(sched_addr, secret.encode())
        extra.sendall(_frame(HEARTBEAT, length=64 << 20) + b"\0" * 4096)
        assert _closed_by_peer(extra)
        extra.close()
        c.close()
        ctl.sendall(_frame(FINALIZE))
        h, _ = _read_frame(ctl)
        assert h[1] == FINALIZE_DONE
        ctl.close()
        for p in procs.values():
            p.wait(60)
        outs = {role: p.output for role, p in procs.items()}
    assert procs["scheduler"].returncode == 0, outs["scheduler"]
    assert procs["server"].returncode == 0, outs["server"]
    assert re.search(r"larger than the job's partitions \(262144 bytes\)", outs["server"])
    assert "which has no window for it" in outs["server"], outs["server"]
    assert "sums to worker 0 stay frames: the connection to worker 0 has no one-way writes" in \
        outs["server"], outs["server"]
    assert "exceeds the limit" in outs["scheduler"]


# ------------------------------------------------- a rank that stops early fails the others --


@pytest.mark.parametrize("what", ["loop", "declare"])
def test_rank_that_shut_down_fails_the_others_at_once(what):
    """Ranks that make different numbers of calls (the reported scenario's own loops ended on
    each rank's clock): once a rank has shut down, a push_pull it never submitted can never
    finish. The rank left waiting gets PeerLostError ('loop': an operation in flight) or
    MismatchError ('declare': a tensor only it declared) naming the rank that left, within a
    few seconds instead of after BYTEPS_TIMEOUT (120 s here)."""
    rc, out, secs = run_job(["--workers", "2", "--servers", "1"], "uneven", 30, what,
                            env=["BYTEPS_TIMEOUT=120"], timeout=100, script=LOOP_WORKER)
    raised = [ln for ln in worker_lines(out, 1) if ln.startswith("RAISED ")]
    assert raised, out[-4000:]
    _, cls, took, message = raised[0].split(" ", 3)
    assert cls == ("PeerLostError" if what == "loop" else "MismatchError"), raised[0]
    assert float(took) < 10.0, raised[0]
    assert "rank 0" in message and "shut down" in message, message
    assert_ok(rc, out, 2)
