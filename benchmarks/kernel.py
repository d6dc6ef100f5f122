"""What this kernel lets an emulated cluster use, found out by trying it.

An emulated cluster (:mod:`.netns`) needs network namespaces, ``veth`` pairs, a ``bridge`` and a
qdisc that limits a rate; everything else degrades:

* **Link shaping**: the first of :data:`SHAPERS` the kernel has (``tbf``, else ``htb``). With
  neither the cluster cannot shape links and says so (:func:`probe_kernel` sets ``problem``).
* **Added latency** needs ``netem`` (``sch_netem``); only ``latency_ms > 0`` asks for it.
* **TCP congestion control**: a namespace other than the initial one may only select an
  algorithm of ``net.ipv4.tcp_allowed_congestion_control`` (the kernel answers ``EPERM``, which
  ``echo`` reports as an I/O error), whatever ``tcp_available_congestion_control`` lists. A
  cluster asks for ``cubic``; :func:`choose_congestion_control` keeps the namespace's default
  where that is not allowed, and the cluster records what its hosts really use.

Nothing here changes the root namespace: the probe works in a scratch namespace of its own,
which it deletes.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Seconds a single ``ip``/``tc`` command may take.
CMD_TIMEOUT = 20.0
#: Per-namespace sysctl: the congestion control of new TCP sockets.
CC_SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"
#: Global sysctls: what a non-initial namespace may select, and what the kernel has.
CC_ALLOWED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
CC_AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
#: Rate-limiting qdiscs, in order of preference.
SHAPERS = ("tbf", "htb")

_counter = itertools.count()


def run_cmd(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command (bounded time); raise ``RuntimeError`` with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=CMD_TIMEOUT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_netns() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = run_cmd(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def unknown_qdisc(exc_or_text: BaseException | str) -> bool:
    """Whether a ``tc`` error means the kernel (or ``tc``) lacks the qdisc kind."""
    text = str(exc_or_text).lower()
    return "unknown" in text or "no such file" in text or "not supported" in text


def choose_congestion_control(preferred: str | None, current: str | None,
                              allowed: Sequence[str] | None) -> str | None:
    """The algorithm to write into a namespace's ``tcp_congestion_control``; None = keep it.

    Args:
        preferred: the algorithm asked for (None: keep whatever the namespace has).
        current: what the namespace uses now (None: unknown).
        allowed: ``tcp_allowed_congestion_control`` (None: unknown, then ``preferred`` is
            tried and a refusal keeps the current one).

    Returns:
        ``preferred`` when it differs from ``current`` and a non-initial namespace may select
        it, else None.
    """
    if not preferred or preferred == current:
        return None
    if allowed is not None and preferred not in allowed:
        return None
    return preferred


@dataclass(frozen=True)
class KernelSupport:
    """What :func:`probe_kernel` found.

    Attributes:
        problem (str | None): why no emulated cluster can be built here (None: it can).
        shaper (str | None): the qdisc that will shape links (``"tbf"`` or ``"htb"``).
        shapers (tuple[str, ...]): every qdisc of :data:`SHAPERS` the kernel has.
        netem (bool): whether ``netem`` can add latency.
        cc_default (str | None): congestion control a new namespace starts with.
        cc_allowed (tuple[str, ...] | None): what a new namespace may select (None: unknown).
        cc_available (tuple[str, ...] | None): what the kernel has (None: unknown).
    """

    problem: str | None
    shaper: str | None = None
    shapers: tuple[str, ...] = ()
    netem: bool = False
    cc_default: str | None = None
    cc_allowed: tuple[str, ...] | None = None
    cc_available: tuple[str, ...] | None = None


def read_congestion(netns: str) -> tuple[str | None, tuple[str, ...] | None,
                                          tuple[str, ...] | None]:
    """``(current, allowed, available)`` congestion control as seen inside ``netns``; a sysctl
    that cannot be read is None."""
    script = "; ".join(f"echo \"$(cat {p} 2>/dev/null)\"" for p in
                       (CC_SYSCTL, CC_ALLOWED, CC_AVAILABLE))
    out = run_cmd(["ip", "netns", "exec", netns, "sh", "-c", script], check=False).stdout
    lines = (out.splitlines() + ["", "", ""])[:3]
    current = lines[0].strip() or None
    allowed, available = (tuple(ln.split()) or None for ln in lines[1:])
    return current, allowed, available


def set_congestion(netns: str, preferred: str | None) -> str | None:
    """Make ``netns`` use ``preferred`` where the kernel lets it (see
    :func:`choose_congestion_control`); returns the algorithm it uses afterwards (None:
    unknown). Never raises for a refusal: it is logged and the namespace keeps its default."""
    current, allowed, _ = read_congestion(netns)
    want = choose_congestion_control(preferred, current, allowed)
    if want is None:
        if preferred and current and preferred != current:
            log.debug("congestion control %s is not allowed in a network namespace here "
                     "(tcp_allowed_congestion_control: %s); %s keeps %s", preferred,
                     " ".join(allowed or ()), netns, current)
        return current
    proc = run_cmd(["ip", "netns", "exec", netns, "sh", "-c",
                    f"echo {want} > {CC_SYSCTL}; cat {CC_SYSCTL}"], check=False)
    used = proc.stdout.strip() or current
    if used != want:
        log.warning("could not select congestion control %s in %s (%s); it uses %s", want,
                    netns, proc.stderr.strip(), used)
    return used


def _try_qdisc(netns: str, dev: str, spec: Sequence[str]) -> str | None:
    """Add and remove a root qdisc; the error text, or None when it worked."""
    proc = run_cmd(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                    *spec], check=False)
    if proc.returncode != 0:
        return proc.stderr.strip() or f"exit status {proc.returncode}"
    run_cmd(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)
    return None


_QDISC_SPECS = {
    "tbf": ["tbf", "rate", "100mbit", "burst", "131072", "limit", "655360"],
    "htb": ["htb", "default", "1"],
    "netem": ["netem", "delay", "1ms"],
}


def _probe_in(ns: str) -> KernelSupport:
    for argv, what in (
            (["ip", "-n", ns, "link", "add", "br0", "type", "bridge"], "bridge"),
            (["ip", "-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
             "veth")):
        proc = run_cmd(argv, check=False)
        if proc.returncode != 0:
            return KernelSupport(f"the kernel cannot create a {what} device in a network "
                                 f"namespace: {proc.stderr.strip()}")
    run_cmd(["ip", "-n", ns, "link", "set", "veth0", "up"], check=False)
    errors = {kind: _try_qdisc(ns, "veth0", _QDISC_SPECS[kind]) for kind in _QDISC_SPECS}
    shapers = tuple(s for s in SHAPERS if errors[s] is None)
    cc = read_congestion(ns)
    problem = None
    if not shapers:
        problem = ("links cannot be shaped: the kernel has none of the qdiscs "
                   + ", ".join(f"{s} (sch_{s}: {errors[s]})" for s in SHAPERS))
    return KernelSupport(problem, shapers[0] if shapers else None, shapers,
                         errors["netem"] is None, *cc)


@functools.cache
def probe_kernel() -> KernelSupport:
    """Try, once per process, in a scratch namespace (deleted again), what a cluster needs:
    a namespace, a bridge, a veth pair, the qdiscs ``tbf``/``htb``/``netem``, and the
    congestion-control sysctls. Needs root and iproute2 (the caller checks)."""
    existing = set(list_netns())
    while True:
        ns = f"bpsprobe{os.getpid() % 100000}{next(_counter)}"
        if ns not in existing:
            break
    proc = run_cmd(["ip", "netns", "add", ns], check=False)
    if proc.returncode != 0:
        return KernelSupport(f"cannot create a network namespace: {proc.stderr.strip()}")
    try:
        support = _probe_in(ns)
    finally:
        run_cmd(["ip", "netns", "del", ns], check=False)
    log.debug("kernel support for emulated clusters: %s", support)
    return support
