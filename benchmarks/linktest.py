"""Link measurements of the emulated cluster: the paper's optimum ``t_opt`` and the TCP bulk
throughput between two hosts (:func:`measure_link`), which the benchmarks use as B.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading

from .netns import EmulatedCluster, Host

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------- theory --


def t_opt(n: int, k: int, model_bytes: float, bandwidth_Bps: float) -> float:
    """The paper's optimal communication time per iteration, in seconds.

    ``t_opt = 2n(n-1)M / ((n^2 + kn - 2k) B)`` for n worker machines, k CPU-only servers, a
    model of ``model_bytes`` M and NIC bandwidth ``bandwidth_Bps`` B in bytes/s.
    """
    if n < 2:
        return 0.0
    return 2 * n * (n - 1) * model_bytes / ((n * n + k * n - 2 * k) * bandwidth_Bps)


# ---------------------------------------------------------------------------- link test --

_RECEIVER = r"""
import json, socket, sys, time
addr, timeout, warmup = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, 0)); s.listen(1); s.settimeout(timeout)
print("PORT", s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(timeout)
buf = bytearray(1 << 20); total = 0; t0 = tw = None; bw = 0; t_last = None
while True:
    n = c.recv_into(buf)
    if not n:
        break
    now = time.monotonic()
    if t0 is None:
        t0 = now
    elif tw is None and now - t0 >= warmup:
        tw, bw = now, total
    total += n; t_last = now
c.close(); s.close()
print(json.dumps({"bytes": total, "t0": t0, "tw": tw, "bw": bw, "t_last": t_last}), flush=True)
"""

_SENDER = r"""
import socket, sys, time
addr, port, seconds, nbytes, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
c = socket.create_connection((addr, port), timeout=timeout)
chunk = memoryview(bytearray(1 << 20)); sent = 0; end = time.monotonic() + seconds
while (nbytes > 0 and sent < nbytes) or (nbytes <= 0 and time.monotonic() < end):
    m = chunk if nbytes <= 0 else chunk[: min(len(chunk), nbytes - sent)]
    c.sendall(m); sent += len(m)
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""


def measure_link(
    cluster: EmulatedCluster,
    src_host: Host | str,
    dst_host: Host | str,
    seconds: float = 2.0,
    nbytes: int | None = None,
    warmup: float | None = None,
) -> float:
    """Steady-state TCP goodput from ``src_host`` to ``dst_host``, in bytes/s.

    A Python receiver (in ``dst_host``'s namespace) and sender (in ``src_host``'s) move one
    bulk TCP stream for ``seconds`` seconds, or ``nbytes`` bytes when given. The rate is taken
    at the receiver over the time after the first ``warmup`` seconds (default
    ``min(0.25, seconds / 4)``; excludes slow start). Goodput excludes TCP/IP/Ethernet headers,
    so on a shaped link it is about 0.96 of the set rate (1448 payload bytes per 1514-byte frame).

    Raises:
        RuntimeError: a side failed or did not finish within ``seconds + 30`` s.
    """
    src, dst = cluster.host(src_host), cluster.host(dst_host)
    if warmup is None:
        warmup = min(0.25, seconds / 4.0)
    limit = seconds + 30.0
    py = [sys.executable, "-c"]
    recv = cluster.spawn(dst, py + [_RECEIVER, dst.address, str(limit), str(warmup)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    send = None
    try:
        line = _readline(recv, 15.0)
        if not line.startswith("PORT "):
            raise RuntimeError(f"link receiver on {dst.name} did not start: {line!r} "
                               f"{_drain_err(recv)}")
        port = int(line.split()[1])
        send = cluster.spawn(src, py + [_SENDER, dst.address, str(port), str(seconds),
                                        str(nbytes or 0), str(limit)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        out, err = recv.communicate(timeout=limit)
        send_err = send.communicate(timeout=10.0)[1]
        if recv.returncode != 0 or send.returncode != 0:
            raise RuntimeError(f"link test {src.name}->{dst.name} failed: receiver "
                               f"{recv.returncode} {err.strip()} sender {send.returncode} "
                               f"{send_err.strip()}")
        res = json.loads(out.strip().splitlines()[-1])
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"link test {src.name}->{dst.name} timed out") from exc
    finally:
        for p in (recv, send):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5.0)
    if res["tw"] is not None and res["t_last"] > res["tw"]:
        rate = (res["bytes"] - res["bw"]) / (res["t_last"] - res["tw"])
    elif res["t0"] is not None and res["t_last"] > res["t0"]:
        rate = res["bytes"] / (res["t_last"] - res["t0"])
    else:
        raise RuntimeError(f"link test {src.name}->{dst.name}: too little data ({res})")
    log.info("link %s->%s: %.1f Mbit/s goodput", src.name, dst.name, rate * 8 / 1e6)
    return rate



#: Probes of the link that :func:`table_goodput` takes the best of.
GOODPUT_PROBES = 2


def table_goodput(cluster: EmulatedCluster, seconds: float) -> float:
    """The goodput (bytes/s) that ``t_opt`` of an (n, k) cluster is computed with: one link,
    w0 -> s0 (w0 -> w1 without CPU-server hosts), by :func:`measure_link`, the best of
    :data:`GOODPUT_PROBES` probes of ``seconds`` each (the shaper fixes what the link carries;
    a probe reads less only when its Python ends lacked CPU, as one in the recorded run of
    2026-11-28 06:07 did: 725 Mbit/s where every other cluster's link read 764-765, which
    flattered that cluster's time / t_opt by 5 %); if that fails (logged), the payload share of
    the cluster's set rate (1448 of every 1514 bytes)."""
    dst = cluster.servers[0] if cluster.servers else cluster.workers[1 % len(cluster.workers)]
    try:
        return max(measure_link(cluster, cluster.workers[0], dst, seconds=seconds)
                   for _ in range(GOODPUT_PROBES))
    except RuntimeError as exc:
        log.warning("link measurement in %s (n=%d, k=%d) failed: %s", cluster.prefix,
                    cluster.num_workers, cluster.num_servers, exc)
        return cluster.bandwidth_bps / 8 * 1448 / 1514

def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """First stdout line of ``proc`` within ``timeout`` seconds ('' on EOF or timeout)."""
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0].strip() if box else ""


def _drain_err(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        return ""
    return (proc.stderr.read() or "").strip() if proc.stderr else ""
