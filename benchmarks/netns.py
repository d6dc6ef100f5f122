"""An emulated cluster on one machine: Linux network namespaces, veth pairs, a bridge, ``tc``.

Topology (all of it created by :class:`EmulatedCluster`, all of it removed by ``close()``)::

    <prefix>-w0 (10.77.0.11) eth0 ==veth== w0 ─┐
    <prefix>-w1 (10.77.0.12) eth0 ==veth== w1 ─┤ br0   in namespace <prefix>-br
    <prefix>-s0 (10.77.0.101) eth0 ==veth== s0 ┘

Every host is its own namespace (``lo`` up, one interface ``eth0`` on 10.77.0.0/24, no default
route), so a host reaches the other hosts of its cluster and nothing else. The veth pairs are
created directly inside the namespaces (never in the root namespace), so deleting the
namespaces deletes them. Each host's link is shaped to ``bandwidth_bps`` in both directions:
a ``tbf`` on the host's ``eth0`` (upload) and one on its bridge port (download, i.e. the switch
port's egress), which models a non-blocking switch with one NIC of bandwidth B per host -- the
paper's model. A kernel without ``tbf`` gets an ``htb`` class of the same rate instead
(:attr:`EmulatedCluster.shaper` says which). ``latency_ms`` adds a ``netem`` delay of
``latency_ms / 2`` on each of the two egresses a packet crosses, so the one-way host-to-host
delay is ``latency_ms``.

Every host asks for the TCP congestion control ``congestion_control`` (default ``cubic``, Linux's
own default, as on the data-centre hosts the paper models; with ``bbr`` several flows sharing a
shaped link left the n = 4 jobs 5-6 % slower, byteps and gloo alike). A network namespace may
only select an algorithm of ``net.ipv4.tcp_allowed_congestion_control``; where the kernel does
not allow it the hosts keep the namespace's default, and
:attr:`EmulatedCluster.congestion_control` records what they really use (see :mod:`.kernel`).

Needs root, ``ip``/``tc`` (iproute2), veth, bridge and ``tbf`` or ``htb``;
:func:`netns_unavailable` says why not.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from byteps.launch.supervise import make_preexec

from .kernel import list_netns, probe_kernel, set_congestion, unknown_qdisc
from .kernel import run_cmd as _run

log = logging.getLogger(__name__)

#: Subnet of every emulated cluster (each cluster lives in its own namespaces, so clusters
#: running side by side never see each other's addresses).
SUBNET = "10.77.0"
_WORKER_BASE = 11  # worker i -> 10.77.0.(11 + i)
_SERVER_BASE = 101  # server j -> 10.77.0.(101 + j)
MAX_WORKERS = _SERVER_BASE - _WORKER_BASE
MAX_SERVERS = 254 - _SERVER_BASE + 1

_counter = itertools.count()
_live: set[EmulatedCluster] = set()  # open clusters (strong refs: closed at exit at the latest)
_live_lock = threading.RLock()


def netns_unavailable() -> str | None:
    """Why an emulated cluster cannot be built here (a reason for ``pytest.skip``), or None.

    Checks Linux, root and iproute2, then (once per process, in a scratch namespace; see
    :func:`.kernel.probe_kernel`) that the kernel gives namespaces, veth, bridge and a
    rate-limiting qdisc. The congestion-control policy and ``netem`` are not requirements.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (euid != 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    return probe_kernel().problem


def own_prefix() -> str:
    """The start of the name of every network namespace this process's clusters create."""
    return f"bps{os.getpid() % 10000}"


def own_netns_left(before: set) -> list[str]:
    """Namespaces of this process's clusters that exist now and were not in ``before`` (a set
    of :func:`list_netns` taken earlier): what a closed cluster must not leave behind."""
    return [ns for ns in set(list_netns()) - before if ns.startswith(own_prefix())]


def tbf_params(rate_bps: float) -> tuple[int, int]:
    """``(burst, limit)`` in bytes of the ``tbf`` that shapes a link to ``rate_bps`` bits/s.

    burst: 4 ms at line rate but at least 128 KiB, so a 64 KiB GSO packet always passes whole
    (a smaller bucket makes tbf segment or stall it) and the timer granularity does not cost
    rate. limit (queue): 50 ms at line rate but at least 512 KiB, enough to absorb the incast of
    several senders into one port without drops that would keep TCP below the rate.
    """
    rate_Bps = rate_bps / 8.0
    burst = max(int(rate_Bps * 0.004), 128 * 1024)
    limit = max(int(rate_Bps * 0.050), 512 * 1024) + burst
    return burst, limit


@dataclass(frozen=True)
class Host:
    """One emulated machine.

    Attributes:
        name (str): short name, ``w<i>`` or ``s<j>``.
        netns (str): its network namespace.
        address (str): its IPv4 address on the cluster network.
        role (str): ``"worker"`` or ``"server"`` (a CPU-only server machine).
        index (int): worker id or server index.
    """

    name: str
    netns: str
    address: str
    role: str
    index: int


class EmulatedCluster:
    """``num_workers`` worker hosts and ``num_servers`` CPU-server hosts behind a shaped switch.

    Use as a context manager (or call :meth:`close`). Namespaces are named
    ``<prefix>-br``, ``<prefix>-w<i>``, ``<prefix>-s<j>``; the default prefix is
    ``bps<pid % 10000><n>``, bumped until no namespace of that name exists. Only what this
    object created is removed, idempotently, also from an ``atexit`` hook and on
    SIGINT/SIGTERM (see :func:`install_signal_cleanup`).

    Args:
        num_workers (int): n >= 1 worker hosts (``w0``...).
        num_servers (int): k >= 0 CPU-only server hosts (``s0``...); k = 0 means the servers
            are colocated on the worker hosts (see ``run_byteps_job``).
        bandwidth_bps (float): each host's link rate in bits/s, both directions; <= 0 or
            ``inf`` leaves the links unshaped.
        latency_ms (float): added one-way host-to-host delay in milliseconds (needs
            ``sch_netem``; without it a ``RuntimeError`` says so and nothing is left behind).
        prefix (str | None): namespace name prefix (must be unique on this machine).
        congestion_control (str | None): TCP congestion control to select in every host
            namespace (default ``"cubic"``) where the kernel allows it; otherwise, and for
            ``None``, the hosts keep what a new namespace inherits. Never an error.

    Attributes:
        congestion_control (str | None): what the hosts really use (read back from their
            namespaces; None if unknown, several joined by ``","`` if they differ).
        congestion_control_requested (str | None): the ``congestion_control`` argument.
        shaper (str | None): the qdisc that shapes the links (``"tbf"``, ``"htb"``; None when
            they are unshaped).
    """

    def __init__(
        self,
        num_workers: int,
        num_servers: int,
        bandwidth_bps: float,
        latency_ms: float = 0.0,
        prefix: str | None = None,
        congestion_control: str | None = "cubic",
    ) -> None:
        if not 1 <= num_workers <= MAX_WORKERS:
            raise ValueError(f"num_workers must be in [1, {MAX_WORKERS}], got {num_workers}")
        if not 0 <= num_servers <= MAX_SERVERS:
            raise ValueError(f"num_servers must be in [0, {MAX_SERVERS}], got {num_servers}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {latency_ms}")
        reason = netns_unavailable()
        if reason:
            raise RuntimeError(reason)
        self.num_workers, self.num_servers = num_workers, num_servers
        self.bandwidth_bps = float(bandwidth_bps)
        self.latency_ms = float(latency_ms)
        if congestion_control is not None and not re.fullmatch(r"[a-z0-9_]+", congestion_control):
            raise ValueError(f"congestion_control must be an algorithm name, got "
                             f"{congestion_control!r}")
        self.congestion_control_requested = congestion_control
        self.congestion_control: str | None = None
        shaped = 0 < self.bandwidth_bps < float("inf")
        support = probe_kernel()
        self.shaper = support.shaper if shaped else None
        #: Seconds an idle link takes to refill its shaper's bucket (``tbf_params``' burst at
        #: the link rate; 0 when unshaped): a link idle for less starts its next transfer with
        #: fewer bytes it may send above the rate.
        self.bucket_refill_s = tbf_params(self.bandwidth_bps)[0] * 8 / self.bandwidth_bps \
            if shaped else 0.0
        if latency_ms > 0 and not support.netem:
            raise RuntimeError("latency_ms > 0 needs tc's netem (kernel module sch_netem), "
                               "which this kernel lacks")
        self._host_cc: dict[str, str | None] = {}
        self._namespaces: list[str] = []  # created by us, in creation order
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.RLock()
        self._closed = False
        existing = set(list_netns())
        if prefix is None:
            while True:
                prefix = f"{own_prefix()}{next(_counter)}"
                if not any(ns.startswith(prefix + "-") for ns in existing):
                    break
        self.prefix = prefix
        self.bridge_netns = f"{prefix}-br"
        hosts = [Host(f"w{i}", f"{prefix}-w{i}", f"{SUBNET}.{_WORKER_BASE + i}", "worker", i)
                 for i in range(num_workers)]
        hosts += [Host(f"s{j}", f"{prefix}-s{j}", f"{SUBNET}.{_SERVER_BASE + j}", "server", j)
                  for j in range(num_servers)]
        self._hosts = hosts
        for ns in [self.bridge_netns] + [h.netns for h in hosts]:
            if ns in existing:
                raise RuntimeError(f"network namespace {ns} already exists; choose another prefix")
        with _live_lock:
            _live.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------ building

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _shape(self, netns: str, dev: str) -> None:
        delay_ms = self.latency_ms / 2.0
        tc = ["tc", "-n", netns, "qdisc", "add", "dev", dev]
        parent = ["root"]
        if delay_ms > 0:
            try:
                _run(tc + ["root", "handle", "1:", "netem", "delay", f"{delay_ms:.3f}ms",
                           "limit", "1000000"])
            except RuntimeError as exc:
                if unknown_qdisc(exc):
                    raise RuntimeError("latency_ms > 0 needs tc's netem (kernel module "
                                       "sch_netem), which this kernel lacks") from exc
                raise
            parent = ["parent", "1:1"]
        if self.shaper is None:
            return
        rate = f"{int(self.bandwidth_bps)}bit"
        burst, limit = tbf_params(self.bandwidth_bps)
        if self.shaper == "tbf":
            _run(tc + parent + ["handle", "10:", "tbf", "rate", rate, "burst", str(burst),
                                "limit", str(limit)])
            return
        # htb: one class of the rate (the same bucket as tbf's), its queue a byte FIFO of
        # tbf's limit (pfifo/bfifo are built into every kernel with qdiscs).
        _run(tc + parent + ["handle", "10:", "htb", "default", "1"])
        _run(["tc", "-n", netns, "class", "add", "dev", dev, "parent", "10:", "classid", "10:1",
              "htb", "rate", rate, "ceil", rate, "burst", str(burst), "cburst", str(burst)])
        _run(tc + ["parent", "10:1", "handle", "11:", "bfifo", "limit", str(limit)])

    def _build(self) -> None:
        br = self.bridge_netns
        self._add_netns(br)
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        for h in self._hosts:
            self._add_netns(h.netns)
            # Created inside the bridge namespace with its peer moved straight into the host's:
            # nothing ever appears in the root namespace.
            _run(["ip", "-n", br, "link", "add", h.name, "type", "veth",
                  "peer", "name", "eth0", "netns", h.netns])
            _run(["ip", "-n", br, "link", "set", h.name, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", h.name, "up"])
            _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0"])
            _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
            self._shape(h.netns, "eth0")  # upload
            self._shape(br, h.name)  # download (switch port egress)
            self._host_cc[h.name] = set_congestion(h.netns, self.congestion_control_requested)
        used = sorted({cc or "unknown" for cc in self._host_cc.values()})
        self.congestion_control = None if used == ["unknown"] else ",".join(used)
        wanted = self.congestion_control_requested
        if wanted and wanted not in used:
            allowed = probe_kernel().cc_allowed
            log.info("TCP congestion control %s is not allowed in a network namespace on this "
                     "kernel (net.ipv4.tcp_allowed_congestion_control: %s): the hosts of %s "
                     "keep the default, %s", wanted, " ".join(allowed or ["unknown"]),
                     self.prefix, self.congestion_control)
        log.info("emulated cluster %s: %d worker + %d server hosts, %.0f Mbit/s (%s), %.2f ms, "
                 "congestion control %s", self.prefix, self.num_workers, self.num_servers,
                 self.bandwidth_bps / 1e6, self.shaper or "unshaped", self.latency_ms,
                 self.congestion_control)

    # ------------------------------------------------------------------------------ queries

    @property
    def hosts(self) -> list[Host]:
        """All hosts: workers ``w0..w{n-1}`` then CPU servers ``s0..s{k-1}``."""
        return list(self._hosts)

    @property
    def workers(self) -> list[Host]:
        """The worker hosts."""
        return [h for h in self._hosts if h.role == "worker"]

    @property
    def servers(self) -> list[Host]:
        """The CPU-only server hosts (empty when k = 0)."""
        return [h for h in self._hosts if h.role == "server"]

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this cluster created (bridge first) and has not removed yet."""
        return list(self._namespaces)

    def network_info(self) -> dict:
        """How the links of this cluster are built, JSON-able (for the benchmark reports).

        Keys: ``bandwidth_bps`` (float), ``latency_ms`` (float), ``shaper`` (qdisc or None),
        ``congestion_control`` (what the hosts use; None if unknown),
        ``congestion_control_requested``, ``congestion_control_allowed`` (list of what a
        namespace may select here; None if unknown).
        """
        allowed = probe_kernel().cc_allowed
        return {"bandwidth_bps": self.bandwidth_bps, "latency_ms": self.latency_ms,
                "shaper": self.shaper, "congestion_control": self.congestion_control,
                "congestion_control_requested": self.congestion_control_requested,
                "congestion_control_allowed": None if allowed is None else list(allowed)}

    def processes(self) -> list[subprocess.Popen]:
        """The processes started by :meth:`spawn` and not yet reaped by :meth:`stop_all`
        (``ip netns exec`` execs the command: each one's pid is the command's)."""
        with self._lock:
            return list(self._procs)

    def host(self, host: Host | str) -> Host:
        """Look a host up by :class:`Host`, name (``"w0"``) or namespace name."""
        if isinstance(host, Host):
            return host
        for h in self._hosts:
            if host in (h.name, h.netns, h.address):
                return h
        raise KeyError(f"no host {host!r} in cluster {self.prefix}")

    # ------------------------------------------------------------------------------ processes

    def spawn(
        self,
        host: Host | str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **popen_kwargs,
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s namespace (``ip netns exec``, which execs it).

        The child leads a new session (its own process group, which :meth:`stop_all` signals)
        and is killed if this process dies (``PR_SET_PDEATHSIG``). ``env`` replaces the
        environment (default: a copy of ``os.environ``); other keyword arguments go to
        :class:`subprocess.Popen`.
        """
        if self._closed or not self._namespaces:
            raise RuntimeError(f"cluster {self.prefix} is closed")
        h = self.host(host)
        popen_kwargs["start_new_session"] = True
        popen_kwargs.setdefault("preexec_fn", make_preexec(os.getpid()))
        full = ["ip", "netns", "exec", h.netns, *argv]
        with self._lock:
            proc = subprocess.Popen(full, env=dict(os.environ if env is None else env),
                                    **popen_kwargs)
            self._procs.append(proc)
        log.debug("spawned pid %d on %s: %s", proc.pid, h.name, " ".join(map(str, argv)))
        return proc

    def stop_all(self, timeout: float = 3.0) -> None:
        """SIGTERM the process groups started by :meth:`spawn`, SIGKILL what is left after
        ``timeout`` seconds, and reap them."""
        with self._lock:
            procs = list(self._procs)
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            _killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + max(timeout, 0.0)
        for p in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(deadline - time.monotonic(), 0.0))
        for p in procs:  # also the groups of exited leaders: their children may linger
            _killpg(p.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5.0)
        with self._lock:  # forget them only now: a signal handler may re-enter this method
            self._procs = [p for p in self._procs if p not in procs]

    def close(self) -> None:
        """Stop all processes and delete every namespace this cluster created (idempotent)."""
        if self._closed:
            return
        # Re-entrant (a signal handler may call it while it runs): state is dropped only
        # after each step is done, and ``_closed`` is set last.
        try:
            self.stop_all(timeout=2.0)
        finally:
            while self._namespaces:
                ns = self._namespaces[-1]
                # A namespace is freed when its last process exits; deleting it deletes the
                # veth ends and qdiscs in it.
                proc = _run(["ip", "netns", "del", ns], check=False)
                if proc.returncode != 0 and ns in list_netns():
                    log.warning("could not delete namespace %s: %s", ns, proc.stderr.strip())
                with contextlib.suppress(ValueError):
                    self._namespaces.remove(ns)
            self._closed = True
            with _live_lock:
                _live.discard(self)
            log.info("emulated cluster %s removed", self.prefix)

    def __enter__(self) -> EmulatedCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EmulatedCluster(prefix={self.prefix!r}, n={self.num_workers}, "
                f"k={self.num_servers}, {self.bandwidth_bps / 1e6:g} Mbit/s)")


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def close_all() -> None:
    """Close every cluster of this process that is still open (used at exit and on signals)."""
    with _live_lock:
        live = list(_live)
    for cluster in live:
        try:
            cluster.close()
        except Exception as exc:  # keep cleaning the others
            log.warning("cleanup of %s failed: %s", cluster.prefix, exc)


atexit.register(close_all)


def install_signal_cleanup() -> None:
    """Make SIGINT and SIGTERM close every open cluster, then exit ``128 + signum``.

    Call it from the main thread of a program that holds clusters (the CLI does). SIGINT
    otherwise raises ``KeyboardInterrupt``, which also unwinds ``with`` blocks; this handler
    covers SIGTERM and code that is not inside a ``with``.
    """

    def handler(signum, _frame):
        signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not interrupt cleanup
        log.warning("signal %d: removing emulated clusters", signum)
        close_all()
        os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
