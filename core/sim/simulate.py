"""One training iteration, simulated: the cluster, the scheme, the result and what bounds it.

``simulate(profile, cluster, scheme)`` runs the backward pass of one iteration (each gradient
handed to the scheme when its layer's backward compute ends, last layer first), the
communication (:mod:`byteps.sim.ps_sim` or :mod:`byteps.sim.collectives`), and the next
forward pass (layer j starts when layer j-1 has finished and j's gradient is back on that
machine). Iteration time = the end of the slowest machine's forward pass; at its start
nothing is in flight (the forward pass needed every gradient), so one iteration is the
steady state. Every worker machine starts its backward pass at the same time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Dict, List

from .network import Sim
from .profiles import Layer, Profile

SCHEMES = ("byteps", "ps", "ring", "tree", "hips")
SCHEME_NAMES = {"byteps": "BytePS summation service", "ps": "native PS (servers colocated)",
                "ring": "ring all-reduce", "tree": "tree all-reduce", "hips": "hierarchical PS"}


@dataclass
class Cluster:
    """The machines.

    Attributes:
        machines (int): n worker machines (>= 1).
        cpu_machines (int): k CPU machines for servers (>= 0; ``byteps`` only).
        gpus_per_machine (int): L GPUs (worker processes) per worker machine.
        bandwidth (float): NIC bandwidth per direction, bytes/s (every machine alike).
        latency (float): one-way per-message latency, seconds. Default 20 µs.
        local_bandwidth (float): bytes/s of a worker's traffic to the server on its own
            machine (loopback / shared memory). Default 4.56e9: the forced-distributed
            socket throughput measured on this repository's machine (docs/performance.md).
        gpu_bus_bandwidth (float): bytes/s of the local reduce among a machine's GPUs
            (PCIe / NVLink), used when gpus_per_machine > 1. Default 12e9 (PCIe 3.0 x16).
        server_threads (int): summation threads per server (``BYTEPS_SERVER_ENGINE_THREAD``,
            default 2).
        sum_rate (float): γ, bytes/s one server thread sums. Default 37.1e9: the summation
            kernel, float32, 1 thread, measured on this repository's machine
            (docs/performance.md).
        shaper_burst (float): bytes of a token bucket on each direction of every NIC (a
            ``tbf`` shaper's burst, as the emulated cluster shapes its links); default 0: a
            real NIC, line rate from the first byte. A full bucket at the start of the
            iteration lets that many bytes above the bandwidth pass at ``local_bandwidth``
            (:class:`byteps.sim.network.Port`); the PS schemes only (the all-reduce schemes
            are costed by formula).
    """

    machines: int
    cpu_machines: int = 0
    gpus_per_machine: int = 1
    bandwidth: float = 100e9 / 8
    latency: float = 20e-6
    local_bandwidth: float = 4.56e9
    gpu_bus_bandwidth: float = 12e9
    server_threads: int = 2
    sum_rate: float = 37.1e9
    shaper_burst: float = 0.0

    def check(self) -> None:
        from ..errors import InvalidArgumentError

        if self.machines < 1 or self.cpu_machines < 0 or self.gpus_per_machine < 1:
            raise InvalidArgumentError("cluster: machines >= 1, cpu_machines >= 0 and "
                                       "gpus_per_machine >= 1 are required")
        for f in ("bandwidth", "local_bandwidth", "gpu_bus_bandwidth", "sum_rate"):
            if not getattr(self, f) > 0:
                raise InvalidArgumentError(f"cluster: {f} must be > 0 bytes/s")
        if self.latency < 0 or self.server_threads < 1 or self.shaper_burst < 0:
            raise InvalidArgumentError("cluster: latency >= 0 s, server_threads >= 1, "
                                       "shaper_burst >= 0 bytes")
        if self.shaper_burst and not self.local_bandwidth > self.bandwidth:
            raise InvalidArgumentError("cluster: a shaper_burst needs local_bandwidth (the "
                                       "rate of a burst) above bandwidth")


@dataclass
class Scheme:
    """How gradients are synchronised.

    Attributes:
        name (str): one of :data:`SCHEMES`.
        scheduling (str): ``priority`` (priority + credit) or ``fifo`` (one priority,
            unlimited credit); PS schemes only.
        partition_bytes (int): ``BYTEPS_PARTITION_BYTES``, default 262 144.
        credit (int): ``BYTEPS_SCHEDULING_CREDIT`` in partitions (0 = unlimited), default 4.
        adaptive_credit (bool): ``byteps``: the credit is the core's adaptive push window
            (``byteps._core.PushWindow``, what the core does when ``BYTEPS_SCHEDULING_CREDIT``
            is unset), starting at ``credit`` partitions; False: ``credit`` stays fixed.
            Default True.
        compression (float): compression ratio (wire bytes = bytes / ratio), PS schemes.
        bucket_bytes (int): all-reduce bucket size, default 25 MiB (torch DDP).
        tree_width (int): ``tree``: FlexTree group width w (1 = binary tree).
        hips_group (int): ``hips``: machines per group (0 = the core's default, ceil(sqrt(n))).
    """

    name: str = "byteps"
    scheduling: str = "priority"
    partition_bytes: int = 262144
    credit: int = 4
    adaptive_credit: bool = True
    compression: float = 1.0
    bucket_bytes: int = 25 << 20
    tree_width: int = 1
    hips_group: int = 0

    def check(self) -> None:
        from ..errors import InvalidArgumentError

        if self.name not in SCHEMES:
            raise InvalidArgumentError(f"scheme {self.name!r}: one of {', '.join(SCHEMES)}")
        if self.scheduling not in ("priority", "fifo"):
            raise InvalidArgumentError("scheduling: 'priority' or 'fifo'")
        if self.partition_bytes < 1 or self.credit < 0 or self.bucket_bytes < 1:
            raise InvalidArgumentError("partition_bytes >= 1, credit >= 0, bucket_bytes >= 1")
        if not self.compression >= 1.0:
            raise InvalidArgumentError("compression ratio must be >= 1")
        if self.compression != 1.0 and self.name not in ("byteps", "ps"):
            raise InvalidArgumentError("compression is modelled for the PS schemes only "
                                       "(byteps, ps)")

    def fifo(self) -> Scheme:
        """FIFO: one priority, unlimited credit."""
        return replace(self, scheduling="fifo", credit=0)


@dataclass
class SimResult:
    """What one simulated iteration gives.

    Attributes:
        iteration_s (float): iteration time, seconds (slowest worker machine).
        compute_s (float): forward + backward compute on one GPU, seconds.
        efficiency (float): scaling efficiency = compute_s / iteration_s (1 = linear).
        bound (str): what bounds the iteration: ``compute`` (efficiency >= 0.97) or the
            busiest resource and its busy share of the iteration (``_bound``).
        busy (dict[str, float]): busy seconds per resource (ports: bytes / capacity).
        comm_end_s (float): when the last gradient was back on every machine, seconds.
        events (int): events the simulation processed.
    """

    iteration_s: float
    compute_s: float
    efficiency: float
    bound: str
    busy: Dict[str, float] = field(default_factory=dict)
    comm_end_s: float = 0.0
    events: int = 0

    def utilisation(self) -> Dict[str, float]:
        """Busy fraction of the iteration per resource."""
        return {k: v / self.iteration_s for k, v in self.busy.items()} if self.iteration_s \
            else {}


#: ``simulate(method="auto")`` uses the symmetric model for ``byteps`` from this many worker
#: machines up (the full model's cost grows as n^4; docs/simulator.md compares the two).
SYMMETRIC_FROM = 16
METHODS = ("auto", "full", "symmetric")


def simulate(profile: Profile, cluster: Cluster, scheme: Scheme,
             method: str = "auto", warmup: int = 0) -> SimResult:
    """Simulate one iteration of ``profile`` on ``cluster`` with ``scheme``.

    ``method``: ``full`` (every worker, message by message), ``symmetric`` (``byteps`` only:
    one representative worker, :mod:`byteps.sim.ps_sym`) or ``auto`` (symmetric for
    ``byteps`` from :data:`SYMMETRIC_FROM` worker machines up, else full). ``warmup``
    (default 0): iterations simulated first and not reported; the workers' adaptive push
    windows carry over from them, as in a job's later iterations (a job's first iteration
    starts from the default credit).

    Raises:
        byteps.errors.InvalidArgumentError: an invalid cluster, scheme or method.
    """
    from ..errors import InvalidArgumentError
    from .collectives import CollectiveBackend
    from .ps_sim import PSBackend
    from .ps_sym import SymmetricPSBackend

    cluster.check()
    scheme.check()
    if method not in METHODS:
        raise InvalidArgumentError(f"method {method!r}: one of {', '.join(METHODS)}")
    if method == "auto":
        method = "symmetric" if scheme.name == "byteps" and \
            cluster.machines >= SYMMETRIC_FROM else "full"
    if warmup < 0:
        raise InvalidArgumentError(f"warmup {warmup}: >= 0 iterations")
    layers: List[Layer] = profile.layers
    sizes = [x.nbytes for x in layers]
    backward = list(reversed(range(len(layers))))
    windows = None
    for _ in range(warmup + 1):
        sim = Sim()
        if method == "symmetric":
            be = SymmetricPSBackend(sim, cluster, scheme, sizes, list(range(len(layers))))
        elif scheme.name in ("byteps", "ps"):
            be = PSBackend(sim, cluster, scheme, sizes, list(range(len(layers))))
        else:
            be = CollectiveBackend(sim, cluster, scheme, sizes, backward)
        if windows is not None:
            be.windows = windows
        t = 0.0
        for j in backward:
            t += layers[j].bwd_s
            sim.at(t, be.submit, j)
        bwd_end = t
        sim.run()
        windows = getattr(be, "windows", None)
    iteration, comm_end = 0.0, 0.0
    for done in be.done:
        t = bwd_end
        for j, lay in enumerate(layers):
            t = max(t, done[j] if done[j] is not None else 0.0) + lay.fwd_s
        iteration = max(iteration, t)
        comm_end = max([comm_end] + [d for d in done if d is not None])
    busy = be.busy()
    compute = profile.compute_s
    return SimResult(iteration, compute, compute / iteration if iteration > 0 else 1.0,
                     _bound(compute, iteration, busy), busy, comm_end, sim.events)


#: Scaling efficiency at or above which an iteration counts as compute-bound.
COMPUTE_BOUND_EFFICIENCY = 0.97


def _bound(compute: float, iteration: float, busy: Dict[str, float]) -> str:
    """``compute`` when the iteration is within 3 % of the compute alone, else the busiest
    resource with its busy share of the iteration (and how many others are as busy, within
    1 %); when even that one is busy less than 80 % of the iteration, the time goes to
    communication that overlaps nothing (latency, a pipeline's fill and drain, one collective
    at a time), and the label says so."""
    if iteration <= 0 or not busy or compute >= COMPUTE_BOUND_EFFICIENCY * iteration:
        return "compute"
    top = max(busy, key=lambda k: busy[k])
    same = [k for k, v in busy.items() if k != top and v >= 0.99 * busy[top]]
    frac = busy[top] / iteration
    label = f"{top}, {100 * frac:.0f} % busy" + (f" (and {len(same)} more as busy)" if same
                                                 else "")
    if frac < 0.8:
        label += "; not saturated: communication not overlapped with compute"
    return label


def parse_rate(text: str) -> float:
    """``"100Gbps"``, ``"800Mbit/s"``, ``"25GB/s"``, ``"1e9"`` (bits/s) -> bytes/s.

    Raises:
        byteps.errors.InvalidArgumentError: not a rate.
    """
    from ..errors import InvalidArgumentError

    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKmMgGtT]?)(b|bit|B|byte)?(ps|/s)?\s*", str(text))
    if not m:
        raise InvalidArgumentError(f"not a rate: {text!r} (e.g. 100Gbps, 800Mbit/s, 12.5GB/s)")
    try:
        v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[
            m.group(2).lower()]
    except ValueError as exc:
        raise InvalidArgumentError(f"not a rate: {text!r}") from exc
    return v if m.group(3) in ("B", "byte") else v / 8.0


def t_opt(n: int, k: int, nbytes: float, bandwidth: float) -> float:
    """The summation service's optimum ``2n(n-1) M / ((n^2 + kn - 2k) B)``, seconds
    (docs/architecture.md §4; ``OptimalCommTime``): :func:`byteps.sync.cost_formulas.t_opt`."""
    from ..sync.cost_formulas import t_opt as formula

    return formula(n, k, nbytes, bandwidth)


def single_tensor(nbytes: int) -> Profile:
    """A profile of one tensor and no compute: one push_pull (the architecture table)."""
    return Profile(f"{nbytes} B tensor", [Layer("tensor", int(nbytes))], "one tensor")
