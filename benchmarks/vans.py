"""The vans a benchmark runs its byteps jobs on, and the environment that selects each.

A van is chosen job-wide by environment (core/cpp/comm/van.h ``VanSpec``): by default the TCP
van; ``DMLC_ENABLE_RDMA=ucx`` the UCX van for every connection, UCX choosing its transports
from ``UCX_TLS``; ``BYTEPS_ENABLE_IPC=1`` the TCP van with the peers of one host over UCX
shared memory. Every van's environment sets all three selectors (``0`` where off), so a job
measures the van it names whatever the calling shell exported.

* ``tcp``      the TCP van;
* ``ucx-shm``  the UCX van over shared memory (``UCX_TLS=sm,self``): loopback jobs only;
* ``ucx-tcp``  the UCX van over TCP (``UCX_TLS=tcp,self``); on the emulated cluster also
  ``UCX_NET_DEVICES=eth0`` (:func:`job_env`);
* ``ucx``      the UCX van with the transports UCX picks (``UCX_TLS`` as exported, else all:
  shared memory between the processes of one host);
* ``ipc``      the TCP van, colocated peers over UCX shared memory (``BYTEPS_ENABLE_IPC=1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

#: The variables that select a van (byteps.doctor.VAN_VARIABLES).
SELECTORS = ("DMLC_ENABLE_RDMA", "DMLC_ENABLE_UCX", "BYTEPS_ENABLE_IPC")
_OFF = {k: "0" for k in SELECTORS}


class Van(NamedTuple):
    """One van configuration.

    Attributes:
        name (str): the key used in plans, results and reports ('tcp', 'ucx-shm', ...).
        label (str): what it is, for reports (Markdown).
        env (dict): the variables it sets beyond the selectors' ``0`` defaults.
        needs_ucx (bool): only a byteps built with UCX has it.
        netns_ok (bool): can run on the emulated cluster (shared memory would bypass the
            emulated links between the namespaces: not).
    """

    name: str
    label: str
    env: dict
    needs_ucx: bool
    netns_ok: bool


VANS = {v.name: v for v in (
    Van("tcp", "the TCP van (the default)", {}, False, True),
    Van("ucx-shm", "the UCX van over shared memory (`DMLC_ENABLE_RDMA=ucx UCX_TLS=sm,self`)",
        {"DMLC_ENABLE_RDMA": "ucx", "UCX_TLS": "sm,self"}, True, False),
    Van("ucx-tcp", "the UCX van over TCP (`DMLC_ENABLE_RDMA=ucx UCX_TLS=tcp,self`)",
        {"DMLC_ENABLE_RDMA": "ucx", "UCX_TLS": "tcp,self"}, True, True),
    Van("ucx", "the UCX van, transports of UCX's choice (`DMLC_ENABLE_RDMA=ucx`)",
        {"DMLC_ENABLE_RDMA": "ucx"}, True, False),
    Van("ipc", "the TCP van, peers on one host over UCX shared memory (`BYTEPS_ENABLE_IPC=1`)",
        {"BYTEPS_ENABLE_IPC": "1"}, True, False),
)}


def ucx_built() -> bool:
    """Whether the byteps on the path was built with the UCX van (``doctor.vans()``)."""
    try:
        from byteps._core import doctor
    except Exception:  # no byteps importable here: only the TCP van can be assumed
        return False
    return "ucx" in doctor.vans()


def default_vans(*, netns: bool) -> list[str]:
    """What a full run measures: the TCP van, and where byteps has UCX the UCX van over shared
    memory (loopback) or over TCP (``netns``: the emulated cluster)."""
    if not ucx_built():
        return ["tcp"]
    return ["tcp", "ucx-tcp" if netns else "ucx-shm"]


def check(names: Sequence[str], *, netns: bool = False) -> list[str]:
    """``names`` as a list, TCP first if present. Raises ValueError for an unknown van, one
    this byteps lacks (UCX) or, with ``netns``, one that would bypass the emulated links."""
    out = []
    for n in names:
        van = VANS.get(n)
        if van is None:
            raise ValueError(f"unknown van {n!r} (known: {', '.join(VANS)})")
        if van.needs_ucx and not ucx_built():
            raise ValueError(f"van {n!r} needs a byteps built with UCX (doctor.vans() has no "
                             "'ucx')")
        if netns and not van.netns_ok:
            raise ValueError(f"van {n!r} uses shared memory, which would bypass the emulated "
                             "cluster's links; use 'ucx-tcp'")
        if n not in out:
            out.append(n)
    return sorted(out, key=lambda n: n != "tcp")


def job_env(name: str, *, netns: bool = False) -> dict:
    """The environment (added to every process of a byteps job) that selects van ``name``.

    On the emulated cluster (``netns``) a UCX van is also told ``UCX_NET_DEVICES=eth0``: a
    namespace host has ``lo`` and ``eth0``, and UCX would otherwise offer its peers both, and
    use both rails (``UCX_MAX_RNDV_RAILS=2``) for rendezvous, although only ``eth0`` carries the
    host's address and the shaped link."""
    van = VANS[name]
    env = {**_OFF, **van.env}
    if netns and env.get("DMLC_ENABLE_RDMA") == "ucx":
        env["UCX_NET_DEVICES"] = "eth0"
    return env


def describe(name: str, env: Mapping[str, str]) -> str:
    """``label`` plus the variables of ``env`` beyond the van's own, for reports."""
    van = VANS[name]
    extra = {k: v for k, v in env.items() if k not in _OFF and k not in van.env}
    return van.label + ("" if not extra else " with " + " ".join(
        f"`{k}={v}`" for k, v in extra.items()))
