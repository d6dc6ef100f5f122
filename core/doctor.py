"""``python -m byteps.doctor`` (also ``bpslaunch --doctor``): what to look at when a cluster
misbehaves, on the host it runs on, for the environment it runs in.

It reports, without starting anything or sending a packet:

* the byteps version, the transports (vans) a job of this build can select and the one this
  environment selects (``DMLC_ENABLE_RDMA``, ``DMLC_ENABLE_UCX``, ``BYTEPS_ENABLE_IPC``); when
  the build links UCX (the UCX van), the UCX version,
  the ``UCX_TLS`` / ``UCX_NET_DEVICES`` values it uses (UCX reads them from this process's
  environment itself) and the transport/device pairs it finds;
* RDMA devices the kernel exposes (``/sys/class/infiniband``: device, port, state, link layer,
  rate), which an RDMA-capable van needs;
* the summation kernels: the instruction set in use on this CPU and the others it supports;
* the framework versions installed (read from package metadata: nothing is imported);
* CUDA: whether this process could reduce CUDA tensors (the runtime loaded at run time, its
  devices), and why not; NCCL's version or why it was not found;
* the network: every interface with an IPv4 address, and the address this process would
  advertise as a node of the job its ``DMLC_*`` variables describe (``DMLC_NODE_HOST``, else
  ``DMLC_INTERFACE``'s address, else the local address on the route to ``DMLC_PS_ROOT_URI``,
  as the core chooses it);
* the environment: each ``BYTEPS_*``/``DMLC_*`` variable the core would warn about or refuse.

``--json`` prints the same report as one JSON object (keys as in :func:`gather`).
Exit status: 0, or 1 when a problem was found (an address that cannot be advertised, a refused
variable), so scripts can check a host before a job starts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from byteps import __version__, _core, cuda
from byteps.errors import BytePSError, ConfigError

#: Distributions whose versions are reported (first installed name of each group wins).
FRAMEWORKS = (("torch", ("torch",)), ("tensorflow", ("tensorflow-cpu", "tensorflow")),
              ("keras", ("keras",)), ("mxnet", ("mxnet",)), ("numpy", ("numpy",)))


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def rdma_devices(root: str = "/sys/class/infiniband") -> List[Dict]:
    """RDMA devices and their ports from sysfs: list of {device, port, state, link_layer,
    rate}; empty when the kernel exposes none (no RDMA hardware or driver)."""
    out = []
    base = Path(root)
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        ports = dev / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            out.append({"device": dev.name, "port": port.name,
                        "state": _read(port / "state"), "link_layer": _read(port / "link_layer"),
                        "rate": _read(port / "rate")})
    return out


def framework_versions() -> Dict[str, Optional[str]]:
    """{framework: installed version or None}, from package metadata (no import)."""
    found = {}
    for name, dists in FRAMEWORKS:
        found[name] = None
        for dist in dists:
            try:
                found[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def advertised_address(env: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """The address a node of the job described by ``env`` would advertise, and why:
    {address, source, problem}. ``address`` is None when there is none to advertise (a
    single-machine job) or it cannot be determined (``problem`` says why)."""
    role = env.get("DMLC_ROLE", "worker")
    uri, port = env.get("DMLC_PS_ROOT_URI", ""), env.get("DMLC_PS_ROOT_PORT", "0")
    if role == "scheduler":
        return {"address": uri or None, "source": "DMLC_PS_ROOT_URI (the scheduler binds it)",
                "problem": None if uri else "DMLC_PS_ROOT_URI is not set"}
    if env.get("DMLC_NODE_HOST"):
        return {"address": env["DMLC_NODE_HOST"], "source": "DMLC_NODE_HOST", "problem": None}
    if env.get("DMLC_INTERFACE"):
        name = env["DMLC_INTERFACE"]
        addr = _core.doctor.interface_address(name)
        return {"address": addr or None, "source": f"DMLC_INTERFACE={name}",
                "problem": None if addr else f"DMLC_INTERFACE={name} has no IPv4 address"}
    if not uri:
        return {"address": None, "source": "no DMLC_PS_ROOT_URI: a single-machine job needs no "
                                           "address", "problem": None}
    try:
        host = socket.gethostbyname(uri)
    except OSError as err:
        return {"address": None, "source": f"route to DMLC_PS_ROOT_URI={uri}",
                "problem": f"cannot resolve {uri}: {err}"}
    try:
        port_no = int(port or 0)
    except ValueError:
        port_no = 0
    addr, why = _core.doctor.route_address(host, port_no)
    return {"address": addr or None, "source": f"the route to the scheduler at {uri}",
            "problem": why or None}


def environment_notices(env: Mapping[str, str]) -> Dict:
    """{"notices": [text, ...] of every variable the core warns or informs about,
    "refused": message or None}."""
    try:
        notices, refused = _core.check_environment(dict(env)), None
    except ConfigError as err:
        # The notices about everything else, also when a variable is refused.
        refusable = {v["name"] for v in _core.upstream_knobs() if v["status"] == "refused"}
        notices = _core.check_environment({k: v for k, v in env.items() if k not in refusable})
        refused = str(err)
    return {"notices": [n["text"] for n in notices], "refused": refused}


VAN_VARIABLES = ("DMLC_ENABLE_RDMA", "DMLC_ENABLE_UCX", "BYTEPS_ENABLE_IPC")


def selected_van(env: Mapping[str, str]) -> str:
    """The van a process with ``env`` selects ('tcp', 'tcp + ipc', 'ucx', 'ucx (rdma required)'),
    or the configuration error a bad value raises, as text."""
    try:
        return _core.doctor.selected_van({k: v for k, v in env.items() if k in VAN_VARIABLES})
    except BytePSError as err:
        return f"none: {err}"


def one_way_pushes(env: Mapping[str, str], ucx: Optional[Dict]) -> str:
    """Which UCX links write one-way under ``env``'s BYTEPS_UCX_ONE_WAY (docs/rdma.md): pushes
    into the servers' slots, and sums into the workers' aggregates or pinned buffers, given
    what UCX finds here, as text."""
    value = env.get("BYTEPS_UCX_ONE_WAY", "auto")
    if value == "0":
        return "none (BYTEPS_UCX_ONE_WAY=0)"
    if value == "1":
        return "RDMA and shared-memory links (BYTEPS_UCX_ONE_WAY=1); never UCX's TCP"
    rdma = (ucx or {}).get("rdma_resources") or []
    return ("RDMA links (BYTEPS_UCX_ONE_WAY=auto): " +
            (", ".join(rdma) if rdma else "UCX has no RDMA transport here, so none"))


def gather(env: Optional[Mapping[str, str]] = None) -> Dict:
    """The whole report as a dict: byteps, vans, van (the one this environment selects, or the
    error text for a value no van answers to), ucx (None in a build without UCX, else {version,
    tls, net_devices, resources, rdma_resources, error}), rdma_devices, summation, frameworks, network,
    environment, cuda and nccl (byteps.cuda.cuda_status / nccl_status), one_way (text:
    one_way_pushes; None without UCX), problems (list of text; empty when nothing is wrong)."""
    env = dict(os.environ) if env is None else dict(env)
    advertised = advertised_address(env)
    environment = environment_notices(env)
    problems = [p for p in (advertised["problem"], environment["refused"]) if p]
    ucx = _core.doctor.ucx_info()
    return {
        "byteps": {"version": __version__, "core": _core.__file__,
                   "python": sys.version.split()[0]},
        "vans": list(_core.doctor.vans()),
        "van": selected_van(env),
        "ucx": ucx,
        "one_way": one_way_pushes(env, ucx) if ucx else None,
        "rdma_devices": rdma_devices(),
        "summation": {"active_isa": _core.reduce.active_isa(),
                      "available_isas": list(_core.reduce.available_isas())},
        "frameworks": framework_versions(),
        "cuda": cuda.cuda_status(),
        "nccl": cuda.nccl_status(),
        "network": {"interfaces": [list(p) for p in _core.doctor.interface_addresses()],
                    "advertised": advertised},
        "environment": environment,
        "problems": problems,
    }


def render(report: Dict) -> str:
    """The report as text, one fact a line."""
    lines = [f"byteps {report['byteps']['version']} (Python {report['byteps']['python']}; "
             f"core {report['byteps']['core']})",
             "vans in this build: " + ", ".join(report["vans"])]
    ucx = report.get("ucx")
    lines.append(f"  selected by this environment: {report['van']}")
    if "ucx" not in report["vans"]:
        lines.append("  no UCX van: this byteps was built without UCX (install libucx-dev and "
                     "pkg-config, then reinstall byteps from source), so RDMA and shared memory "
                     "are out of reach")
    if ucx:
        lines.append(f"  UCX {ucx['version']}: UCX_TLS={ucx['tls']}, "
                     f"UCX_NET_DEVICES={ucx['net_devices']}")
        lines.append("  UCX transports: " + (ucx["error"] or ", ".join(ucx["resources"])))
        if report.get("one_way"):
            lines.append(f"  one-way writes (pushes, sums) over: {report['one_way']}")
    devs = report["rdma_devices"]
    lines.append("RDMA devices: " + ("none found in /sys/class/infiniband" if not devs else ""))
    for d in devs:
        lines.append(f"  {d['device']} port {d['port']}: {d['state']}, {d['link_layer']}, "
                     f"{d['rate']}")
    s = report["summation"]
    lines.append(f"summation kernels: {s['active_isa']} (this CPU supports: "
                 f"{', '.join(s['available_isas'])})")
    fw = report["frameworks"]
    lines.append("frameworks: " + ", ".join(f"{k} {v}" if v else f"{k} not installed"
                                           for k, v in fw.items()))
    lines.append(cuda.describe(report["cuda"]))
    nccl = report["nccl"]
    if nccl["available"]:
        need = nccl["min_version"]
        stages = ("its stages among the machine's GPUs can run (BYTEPS_NCCL=1)"
                  if nccl["stages_supported"]
                  else f"older than {need // 10000}.{need // 100 % 100}: no NCCL stages")
        lines.append(f"NCCL: {nccl['version']} ({nccl['library']}); {stages}")
    else:
        lines.append(f"NCCL: not loaded: {nccl['reason']}")
    net = report["network"]
    lines.append("interfaces: " + ", ".join(f"{n} {a}" for n, a in net["interfaces"]))
    adv = net["advertised"]
    lines.append(f"this node would advertise: {adv['address'] or '-'} ({adv['source']})")
    env = report["environment"]
    for text in env["notices"]:
        lines.append(f"environment: {text}")
    if env["refused"]:
        lines.append(f"environment: REFUSED: {env['refused']}")
    for p in report["problems"]:
        lines.append(f"PROBLEM: {p}")
    if not report["problems"]:
        lines.append("no problem found")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Print the report (text, or JSON with ``--json``). Returns 1 if a problem was found."""
    parser = argparse.ArgumentParser(prog="python -m byteps.doctor", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = gather()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
