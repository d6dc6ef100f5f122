"""``bpslaunch --hosts`` / ``--hostfile``: a byteps job on several hosts, started over ssh.

The shape of ``horovodrun -H``::

    bpslaunch --hosts h1:2,h2:2 [--server-hosts s1,s2] [--ssh-port P] [--ssh-identity F] \\
        [--ssh-config FILE] [--network-interface IF] [--port P] [--env K=V] COMMAND ...

Placement (:func:`build_ssh_plan`): worker host ``i`` (in the order given) is worker machine
``i`` and runs ``slots`` worker processes (the local size; every worker host must have the same
number: global ranks are ``worker_id * local_size + local_rank``); the scheduler runs on the
first worker host, which is also the scheduler's address (``DMLC_PS_ROOT_URI``: the host's name
as given, resolved by every process -- it must resolve to the same, routable address on every
host); one server per worker host (colocated), then one per ``--server-hosts`` host. The
environment of every process comes from :func:`byteps.launch.contract.role_env`.

Every process is one ``ssh`` connection running the fixed command ``<python> -m
byteps.launch.ssh_remote`` (:func:`ssh_argv`); its argv, environment and working directory go as one
JSON line over ssh's standard input, which then stays open as the process's lifeline (see
:mod:`byteps.launch.ssh_remote`). The job's secret and environment therefore never appear on a command
line, locally or remotely. The environment sent is the launcher's own minus the variables that
describe this host, login or terminal (:func:`forwarded_env`), plus ``--env``, plus the role's
contract; the remote login's own environment fills in the rest (``HOME``, ``USER``, ...).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .common import LOCAL_MODE_VARS, ChildSpec, LaunchError, parse_env_pairs
from .contract import CONTRACT_VARS, ClusterSpec, ClusterSpecError, JobIdentity, role_env

#: Default scheduler port range: ``--port`` absent, the port is drawn at random from it (a
#: remote port cannot be probed; below Linux's ephemeral range 32768-60999, so it never meets a
#: port the core or another client picked; a port in use fails the scheduler with a message).
DEFAULT_PORT_RANGE = (20000, 30000)

#: Options always given to ssh: never prompt (fail instead of hanging on a password or an
#: unknown host key), no pseudo-terminal, give up connecting after 15 s, and notice a dead
#: connection within 15 s (the job is then stopped).
SSH_BASE_OPTIONS = ("-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
                    "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")

#: Variables of the launcher's environment that stay behind: they describe this host, this
#: login or this terminal, and the remote login sets its own (plus every ``SSH_*``, ``XDG_*``
#: and ``BASH_FUNC_*`` variable).
HOST_SPECIFIC_VARS = frozenset({
    "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "_",
    "TERM", "TERMCAP", "COLUMNS", "LINES", "DISPLAY", "XAUTHORITY", "PS1", "PS2",
    "PROMPT_COMMAND", "LS_COLORS", "MOTD_SHOWN",
})
_HOST_SPECIFIC_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_")

#: Variables ``--env`` may not set in ssh mode (bpslaunch sets them itself).
RESERVED_VARS = tuple(LOCAL_MODE_VARS) + ("DMLC_INTERFACE",)

_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


@dataclass(frozen=True)
class HostSlots:
    """One worker host: ``name`` as ssh reaches it (``[user@]host``) and its worker count."""

    name: str
    slots: int

    @property
    def address(self) -> str:
        """The host part of ``name`` (without ``user@``): what other processes connect to."""
        return self.name.rpartition("@")[2]


@dataclass(frozen=True)
class SshOptions:
    """How to reach the hosts.

    Attributes:
        port (int | None): ``ssh -p`` (1..65535); default: ssh's (22 or the ssh config's).
        identity (str | None): ``ssh -i`` private key file.
        config (str | None): ``ssh -F`` configuration file (replaces ``~/.ssh/config`` and
            ``/etc/ssh/ssh_config``).
        python (str): the interpreter that runs :mod:`byteps.launch.ssh_remote` and the servers on
            every host; default this launcher's ``sys.executable`` (homogeneous cluster).
        pythonpath (str | None): ``PYTHONPATH`` for the remote runner itself (the launcher's,
            so the remote side imports the same byteps); not secret.
    """

    port: int | None = None
    identity: str | None = None
    config: str | None = None
    python: str = sys.executable
    pythonpath: str | None = None


def _check_host(name: str, what: str) -> str:
    if not _HOST_RE.match(name):
        hint = " (IPv6 addresses are not supported: use a host name)" if ":" in name else ""
        raise LaunchError(f"{what}: {name!r} is not a host name or IPv4 address{hint}")
    return name


def _slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        slots = 0
    if slots < 1:
        raise LaunchError(f"{where}: slots must be an integer >= 1, got {text!r}")
    return slots


def parse_hosts(text: str) -> list[HostSlots]:
    """Parse ``--hosts``: comma-separated ``[user@]host[:slots]`` entries (slots default 1).

    Raises:
        LaunchError: an empty list or entry, a bad host name, slots not an integer >= 1.
    """
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise LaunchError(f"--hosts {text!r}: empty entry (format host[:slots],...)")
        name, sep, slots = entry.rpartition(":") if ":" in entry else (entry, "", "1")
        if sep and ":" in name:
            _check_host(entry, "--hosts")
        hosts.append(HostSlots(_check_host(name, "--hosts"),
                               _slots(slots, f"--hosts entry {entry!r}")))
    return hosts


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[HostSlots]:
    """Parse a hostfile (MPI/Horovod style): one ``[user@]host [slots=N]`` per line.

    ``#`` starts a comment; blank lines are skipped; ``host:N`` is accepted too. Other fields
    (``max_slots=``, ...) are errors, so a typo cannot silently change the job.

    Raises:
        LaunchError: naming ``source`` and the line number.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source} line {number}"
        head, rest = fields[0], fields[1:]
        if ":" in head:
            if rest:
                raise LaunchError(f"{where}: give either host:N or host slots=N, not both")
            name, _, count = head.rpartition(":")
            hosts.append(HostSlots(_check_host(name if ":" not in name else head, where),
                                   _slots(count, where)))
            continue
        slots = 1
        for field in rest:
            key, sep, value = field.partition("=")
            if key != "slots" or not sep:
                raise LaunchError(f"{where}: unknown field {field!r} (format: host slots=N)")
            slots = _slots(value, where)
        hosts.append(HostSlots(_check_host(head, where), slots))
    if not hosts:
        raise LaunchError(f"{source} lists no hosts")
    return hosts


def parse_hostfile(path: str) -> list[HostSlots]:
    """Read and parse a hostfile (see :func:`parse_hostfile_text`).

    Raises:
        LaunchError: the file cannot be read, or is malformed.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchError(f"--hostfile {path}: {exc}") from None
    return parse_hostfile_text(text, f"hostfile {path}")


def parse_server_hosts(text: str) -> list[str]:
    """Parse ``--server-hosts``: comma-separated ``[user@]host`` (one server each).

    Raises:
        LaunchError: an empty entry or a bad host name.
    """
    names = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise LaunchError(f"--server-hosts {text!r}: empty entry (format host,host,...)")
        names.append(_check_host(entry, "--server-hosts"))
    return names


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that travels to the remote processes.

    Everything except :data:`HOST_SPECIFIC_VARS`, names starting with ``SSH_``, ``XDG_`` or
    ``BASH_FUNC_``, and the contract variables (:data:`byteps.launch.contract.CONTRACT_VARS`, which
    every process gets from its role).
    """
    return {k: v for k, v in env.items()
            if k not in HOST_SPECIFIC_VARS and k not in CONTRACT_VARS
            and not k.startswith(_HOST_SPECIFIC_PREFIXES)}


def ssh_argv(host: str, options: SshOptions) -> list[str]:
    """The local command that starts the remote runner on ``host`` (fixed, secret-free).

    ``ssh -T -o BatchMode=yes ... [-F CONFIG] [-p PORT] [-i IDENTITY] -- host
    '[env PYTHONPATH=...] <python> -m byteps.launch.ssh_remote'``.
    """
    argv = ["ssh", *SSH_BASE_OPTIONS]
    if options.config:
        argv += ["-F", options.config]
    if options.port is not None:
        argv += ["-p", str(options.port)]
    if options.identity:
        argv += ["-i", options.identity]
    remote = [options.python, "-m", "byteps.launch.ssh_remote"]
    if options.pythonpath:
        remote = ["env", f"PYTHONPATH={options.pythonpath}", *remote]
    return argv + ["--", host, shlex.join(remote)]


def request_line(argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
                 label: str) -> bytes:
    """The JSON request :mod:`byteps.launch.ssh_remote` reads (one line, ``\\n``-terminated)."""
    req = {"protocol": 1, "argv": list(argv), "env": dict(env),
           "unset": [k for k in CONTRACT_VARS if k not in env], "cwd": cwd, "label": label}
    return (json.dumps(req, separators=(",", ":")) + "\n").encode()


def build_ssh_plan(
    hosts: Sequence[HostSlots],
    command: Sequence[str],
    *,
    server_hosts: Sequence[str] = (),
    port: int | None = None,
    interface: str | None = None,
    options: SshOptions | None = None,
    extra_env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    server_argv: Sequence[str] | None = None,
    identity: JobIdentity | None = None,
) -> list[ChildSpec]:
    """Plan a job on ssh hosts (placement: module docstring).

    Args:
        hosts (Sequence[HostSlots]): worker hosts in order, >= 1, all with the same slots.
        command (Sequence[str]): the worker command (argv), non-empty.
        server_hosts (Sequence[str]): extra hosts running one server each.
        port (int | None): scheduler port 1..65535; default a random port of
            :data:`DEFAULT_PORT_RANGE`.
        interface (str | None): ``DMLC_INTERFACE`` of every process (the interface whose
            address a node advertises).
        options (SshOptions | None): how to reach the hosts; default ``SshOptions()``.
        extra_env (Mapping[str, str] | None): ``--env`` entries, for every process.
        base_env (Mapping[str, str] | None): the launcher's environment (default
            ``os.environ``); :func:`forwarded_env` of it travels.
        cwd (str | None): remote working directory; default the launcher's ``os.getcwd()``.
        server_argv (Sequence[str] | None): server/scheduler command; default
            ``[options.python, "-m", "byteps.server"]``.
        identity (JobIdentity | None): default :meth:`JobIdentity.fresh`.

    Returns:
        list[ChildSpec]: scheduler, servers 0.., workers 0.. (rank order); each runs
        :func:`ssh_argv` with the launcher's environment (the job's is in the request, never
        in the local ssh client's), its request (:func:`request_line`) as ``stdin`` and its
        host set.

    Raises:
        LaunchError: no hosts or command, a host listed twice, worker hosts with different
            slots, a port or interface out of range.
    """
    opts = options or SshOptions()
    if not hosts:
        raise LaunchError("no worker hosts given (--hosts or --hostfile)")
    if not command:
        raise LaunchError("no COMMAND given (usage: bpslaunch --hosts h1:2,h2:2 [options] "
                          "COMMAND ...)")
    seen: dict[str, str] = {}
    for name, what in [(h.name, "worker host") for h in hosts] + \
                      [(s, "server host") for s in server_hosts]:
        key = name.rpartition("@")[2]
        if key in seen:
            hint = {("worker host", "worker host"): "give its worker count as slots, "
                                                    f"{key}:N",
                    ("server host", "server host"): "one server per host",
                    }.get((seen[key], what), "a worker host runs a server already")
            raise LaunchError(f"host {key} is listed twice, as {seen[key]} and {what} ({hint})")
        seen[key] = what
    slots = {h.slots for h in hosts}
    if len(slots) > 1:
        listing = ", ".join(f"{h.name}:{h.slots}" for h in hosts)
        raise LaunchError(f"every worker host must run the same number of workers (the local "
                          f"size; ranks are worker_id * local_size + local_rank); got {listing}")
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError(f"--port must be in 1..65535, got {port}")
    if opts.port is not None and not 1 <= opts.port <= 65535:
        raise LaunchError(f"--ssh-port must be in 1..65535, got {opts.port}")
    if interface is not None and not _IFACE_RE.match(interface):
        raise LaunchError(f"--network-interface {interface!r} is not an interface name")
    if port is None:
        low, high = DEFAULT_PORT_RANGE
        port = low + secrets.randbelow(high - low)
    try:
        cluster = ClusterSpec(len(hosts), len(hosts) + len(server_hosts), slots.pop(),
                              hosts[0].address, port, identity or JobIdentity.fresh())
    except ClusterSpecError as exc:  # pragma: no cover - checked above
        raise LaunchError(str(exc)) from None
    local = dict(os.environ if base_env is None else base_env)  # the ssh clients' own
    inherited = {**forwarded_env(local), **(extra_env or {})}
    workdir = os.getcwd() if cwd is None else cwd
    srv = list(server_argv) if server_argv is not None else [opts.python, "-m", "byteps.server"]

    def spec(host: str, role: str, rank: int | None, argv: Sequence[str], **worker) -> ChildSpec:
        env = role_env(cluster, role, interface=interface, base=inherited, **worker)
        label = f"{host} {role}" + ("" if rank is None else f" {rank}")
        return ChildSpec(role, rank, ssh_argv(host, opts), local, host=host,
                         stdin=request_line(argv, env, workdir, label))

    specs = [spec(hosts[0].name, "scheduler", None, srv)]
    for s, host in enumerate([h.name for h in hosts] + list(server_hosts)):
        specs.append(spec(host, "server", s, srv))
    for w, host in enumerate(hosts):
        for lr in range(cluster.local_size):
            specs.append(spec(host.name, "worker", cluster.rank(w, lr), command,
                              worker_id=w, local_rank=lr))
    return specs


def _file_option(path: str | None, option: str) -> str | None:
    if path is None:
        return None
    if not os.path.isfile(path):
        raise LaunchError(f"{option} {path}: no such file")
    return os.path.abspath(path)


def ssh_options_given(args) -> list[str]:
    """The ssh-mode options present in parsed ``bpslaunch`` arguments (for refusing them in
    another mode)."""
    names = (("--server-hosts", "server_hosts"), ("--ssh-port", "ssh_port"),
             ("--ssh-identity", "ssh_identity"), ("--ssh-config", "ssh_config"),
             ("--network-interface", "network_interface"))
    return [opt for opt, attr in names if getattr(args, attr, None) is not None]


def plan_from_args(args, command: Sequence[str], parent: Mapping[str, str],
                   server_argv: Sequence[str] | None = None) -> list[ChildSpec]:
    """:func:`build_ssh_plan` from ``bpslaunch``'s parsed arguments (``--hosts`` or
    ``--hostfile`` given).

    Raises:
        LaunchError: both or neither of --hosts/--hostfile, local-mode options mixed in, or
            anything :func:`build_ssh_plan` refuses.
    """
    if (args.hosts is None) == (args.hostfile is None):
        raise LaunchError("give exactly one of --hosts and --hostfile")
    mixed = [opt for opt, val in (("--workers", args.workers), ("--servers", args.servers),
                                  ("--local-size", args.local_size)) if val is not None]
    if mixed:
        raise LaunchError(f"{', '.join(mixed)} belong to local mode; with --hosts/--hostfile "
                          "the hosts' slots give the workers and every worker host runs a "
                          "server (add more with --server-hosts)")
    hosts = parse_hosts(args.hosts) if args.hosts is not None else parse_hostfile(args.hostfile)
    servers = parse_server_hosts(args.server_hosts) if args.server_hosts is not None else []
    options = SshOptions(port=args.ssh_port,
                         identity=_file_option(args.ssh_identity, "--ssh-identity"),
                         config=_file_option(args.ssh_config, "--ssh-config"),
                         pythonpath=parent.get("PYTHONPATH") or None)
    return build_ssh_plan(hosts, command, server_hosts=servers, port=args.port,
                          interface=args.network_interface, options=options,
                          extra_env=parse_env_pairs(args.env, RESERVED_VARS), base_env=parent,
                          server_argv=server_argv)


__all__ = ["HostSlots", "SshOptions", "build_ssh_plan", "forwarded_env", "parse_hostfile",
           "parse_hostfile_text", "parse_hosts", "parse_server_hosts", "plan_from_args",
           "request_line", "ssh_argv"]
