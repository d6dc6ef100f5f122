"""The α-β-γ cost model that picks the synchronisation scheme of ``BYTEPS_SYNC=auto``.

Three parameters describe the job's machines: **α**, the latency of one message (seconds),
**β**, the time of one byte on one link direction (seconds per byte, 1 / bandwidth), and
**γ**, the time to sum one byte (seconds per byte). Each is measured at start-up
(:mod:`byteps.sync.cost_measure`: push_pulls through the summation service for α and β, the core's
summation kernel for γ, averaged over every rank) or taken from ``BYTEPS_COST_ALPHA``,
``BYTEPS_COST_BETA``, ``BYTEPS_COST_GAMMA``. With them every scheme's cost for a tensor of S
bytes is the closed form of :mod:`byteps.sync.cost_formulas` (the simulator's too), and
:meth:`CostModel.choose` gives the cheapest of ``ps``, ``ring``, ``tree``, ``hips`` (ties go to
the earlier of that order). Costs are linear in S, so the choice changes only at a few sizes:
:attr:`CostModel.intervals` lists them exactly. docs/schemes.md ("The cost model").

``byteps.cost_model()`` calls :func:`get` (``byteps.cost_model`` is a function that carries this
module's :func:`get`, :func:`measure`, :func:`choose` and :class:`CostModel` as attributes)::

    import byteps, byteps.basics as bps
    bps.init()
    model = byteps.cost_model()          # measures once (collective: every rank calls it)
    model.choose(4 << 20)                # 'ps' | 'ring' | 'tree' | 'hips'
    model.as_dict()                      # parameters, sources, intervals, table per size
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..errors import InternalError, InvalidArgumentError, NotInitializedError
from . import cost_formulas
from .cost_envelope import MAX_BYTES, Interval  # noqa: F401 (MAX_BYTES: public, as before)
from .cost_envelope import envelope as _envelope
from .cost_envelope import fill_pieces as _fill_pieces  # noqa: F401 (tests read it here)
from .cost_formulas import SCHEMES
from .schemes import sync_setting

# byteps._core, byteps.basics and cost_measure (which uses both) are imported in the functions
# that need them, not here: `import byteps` imports this module, and loads no _core.

log = logging.getLogger("byteps.cost_model")

#: the parameters and the variables that set them
VARIABLES = {"alpha": "BYTEPS_COST_ALPHA", "beta": "BYTEPS_COST_BETA",
             "gamma": "BYTEPS_COST_GAMMA"}
#: knobs of the schemes' shapes, read when the registry has them (else the defaults below)
TREE_WIDTH_KNOB = "BYTEPS_TREE_WIDTH"
HIPS_GROUP_KNOB = "BYTEPS_HIPS_GROUP"
#: FlexTree width when no knob says otherwise (0: the core's default, the largest divisor of n
#: not above ceil(sqrt(n)), ``cost_formulas.default_tree_width``)
DEFAULT_TREE_WIDTH = 0
#: HiPS group size when no knob says otherwise (0: the core's default, ceil(sqrt(n)),
#: ``cost_formulas.hips_group``)
DEFAULT_HIPS_GROUP = 0
#: the schemes the choice is made among, unless measure() is given others
CANDIDATES = SCHEMES
#: size classes of :meth:`CostModel.table`: 1 B, 2 B, 4 B ... 16 GiB
TABLE_SIZES = tuple(1 << i for i in range(35))
#: where a parameter came from, when not from its variable
MEASURED = "measured"
NO_NETWORK = "not measured (one worker machine)"
#: where :attr:`CostModel.servers` came from
ADDRESS_BOOK = "address book"
GIVEN = "given"
SERVERS_VARIABLE = "DMLC_NUM_SERVER"


@dataclass(frozen=True)
class CostModel:
    """The parameters, the job's shape and the choice of scheme per tensor size.

    Attributes:
        alpha (float): seconds per message (>= 0).
        beta (float): seconds per byte on one link direction (>= 0).
        gamma (float): seconds per byte summed (>= 0).
        workers (int): n, worker machines (``DMLC_NUM_WORKER``).
        servers (int): k of the summation service's formula: the CPU-only servers (on a host
            where no worker machine runs) beside the ones the formula puts on every worker
            machine. :func:`measure` takes it from the scheduler's address book.
        servers_source (str): where ``servers`` came from: ``"address book"`` (the job's
            servers on hosts without a worker, the same on every rank), ``"DMLC_NUM_SERVER"``
            (no job: every server taken as CPU-only) or ``"given"`` (default; ``servers=``).
        partition_bound (int): the job's partition bound, bytes (``BYTEPS_PARTITION_BYTES``
            rounded up to pages of 4096 · local_size, :func:`byteps._core.partition_bound`);
            > 0 adds the schemes' pipeline fill, ``fill · β · min(S, b(S))`` with b(S) the
            core's partition of an S-byte tensor (:meth:`ps_fill_bytes`;
            ``SchemeCost.fill``: ps one partition through the wire, hips its path through
            both levels, the tree up and down its heap). 0 (default): no fill term.
        local_size (int): worker processes per machine (the partition rule's page unit).
        alpha_mesh (float | None): seconds per message of the worker mesh (``ring``,
            ``tree``: worker to worker, no server hop); None (default): ``alpha``.
        latency (dict[str, float]): per scheme, the measured seconds of its tiny push_pull
            (``cost_measure.scheme_latencies``), which replace that scheme's α term
            ``messages · α`` (:meth:`latency_seconds`); default empty: every scheme's α term
            from ``alpha`` / ``alpha_mesh``.
        all_servers (int): every server of the job, colocated or not; when it can run HiPS
            (>= ceil(n/g) + 1), ``hips`` costs what byteps's placement does
            (:func:`byteps.sync.cost_formulas.hips_servers`: a first-level server per group on one
            link, every server taken on a host of its own), else (0, default) the paper's
            placement, a server on every machine (:func:`~byteps.sync.cost_formulas.hips`).
        tree_width (int): FlexTree width w (``tree``), clipped to [1, n]; 0 (given) becomes
            the core's default, the largest divisor of n not above ceil(sqrt(n)).
        hips_group (int): HiPS group size g (``hips``), 0 = the core's default, ``ceil(sqrt(n))``.
        schemes (tuple[str, ...]): the schemes the choice is made among (default: all of
            ``ps``, ``ring``, ``tree``, ``hips``), kept in that order (the order of ties).
        sources (dict[str, str]): per parameter, ``"measured"``, the variable that set it,
            or ``"not measured (one worker machine)"``.
        measure_seconds (float): wall time of the measurement on this rank (0.0: none),
            seconds.
        timings (dict[str, float]): what was timed, averaged over the ranks (empty: nothing
            measured): ``tiny_s`` and ``large_s`` (the 8-byte and the larger push_pull,
            seconds; 0.0 with one worker machine), ``large_bytes``.
        intervals (tuple[Interval, ...]): the choice, from 0 bytes up, in order (derived).

    Raises (constructor):
        byteps.errors.InvalidArgumentError: a parameter negative or not finite, workers < 1,
            servers < 0, tree_width or hips_group < 0, no scheme or an unknown one.
    """

    alpha: float
    beta: float
    gamma: float
    workers: int
    servers: int = 0
    tree_width: int = DEFAULT_TREE_WIDTH
    hips_group: int = DEFAULT_HIPS_GROUP
    sources: Mapping[str, str] = field(default_factory=dict)
    measure_seconds: float = 0.0
    timings: Mapping[str, float] = field(default_factory=dict)
    schemes: Tuple[str, ...] = SCHEMES
    servers_source: str = GIVEN
    partition_bound: int = 0
    local_size: int = 1
    all_servers: int = 0
    alpha_mesh: Optional[float] = None
    latency: Mapping[str, float] = field(default_factory=dict)
    intervals: Tuple[Interval, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise InvalidArgumentError(f"cost model: {name} must be a finite number >= 0 "
                                           f"(seconds{' per byte' if name != 'alpha' else ''})"
                                           f", got {v!r}")
            object.__setattr__(self, name, float(v))
        for name, lo in (("workers", 1), ("servers", 0), ("tree_width", 0), ("hips_group", 0),
                         ("partition_bound", 0), ("local_size", 1), ("all_servers", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidArgumentError(f"cost model: {name} must be an int >= {lo}, "
                                           f"got {v!r}")
        if self.alpha_mesh is not None:
            v = self.alpha_mesh
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    not math.isfinite(v) or v < 0:
                raise InvalidArgumentError(f"cost model: alpha_mesh must be None or a finite "
                                           f"number >= 0 (seconds), got {v!r}")
            object.__setattr__(self, "alpha_mesh", float(v))
        lat = {}
        for name, v in dict(self.latency).items():
            if name not in SCHEMES or isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not math.isfinite(v) or v < 0:
                raise InvalidArgumentError(f"cost model: latency must map schemes of "
                                           f"{', '.join(SCHEMES)} to finite seconds >= 0, got "
                                           f"{name!r}: {v!r}")
            lat[name] = float(v)
        object.__setattr__(self, "latency", lat)
        object.__setattr__(self, "sources", dict(self.sources))
        object.__setattr__(self, "timings", dict(self.timings))
        if self.tree_width == 0:
            object.__setattr__(self, "tree_width", cost_formulas.default_tree_width(self.workers))
        chosen = tuple(self.schemes) if not isinstance(self.schemes, str) else (self.schemes,)
        unknown = [x for x in chosen if x not in SCHEMES]
        if unknown or not chosen:
            raise InvalidArgumentError(f"cost model: schemes must be a non-empty subset of "
                                       f"{', '.join(SCHEMES)}, got {chosen!r}")
        object.__setattr__(self, "schemes", tuple(x for x in SCHEMES if x in chosen))
        object.__setattr__(self, "intervals", _envelope(self))

    # ---------------------------------------------------------------------------- costs --
    def scheme_costs(self) -> Dict[str, cost_formulas.SchemeCost]:
        """{scheme: its :class:`byteps.sync.cost_formulas.SchemeCost`} for this job's shape, for each
        of :attr:`schemes`."""
        return {s: self._scheme_cost(s) for s in self.schemes}

    def _scheme_cost(self, scheme: str) -> cost_formulas.SchemeCost:
        if scheme == "hips" and self.workers > 1 and self.all_servers >= math.ceil(
                self.workers / cost_formulas.hips_group(self.workers, self.hips_group)) + 1:
            return cost_formulas.hips_servers(self.workers, self.hips_group, self.all_servers)
        return cost_formulas.scheme_cost(scheme, self.workers, self.servers, self.tree_width,
                                         self.hips_group)

    def cost(self, scheme: str, nbytes: int) -> float:
        """Seconds one synchronisation of ``nbytes`` bytes costs with ``scheme``.

        Raises:
            byteps.errors.InvalidArgumentError: an unknown scheme, a negative size.
            byteps.errors.InvalidTypeError: ``nbytes`` not an int.
        """
        nbytes = _size(nbytes, "cost")
        if scheme not in SCHEMES:
            cost_formulas.scheme_cost(scheme, self.workers)  # raises, naming it
        return self._seconds(self._scheme_cost(scheme), nbytes)

    def costs(self, nbytes: int) -> Dict[str, float]:
        """{scheme: seconds} for a tensor of ``nbytes`` bytes, for each of :attr:`schemes`."""
        nbytes = _size(nbytes, "costs")
        return {s: self._seconds(c, nbytes) for s, c in self.scheme_costs().items()}

    def message_alpha(self, scheme: str) -> float:
        """α of ``scheme``'s messages: its measured :attr:`latency` over its messages where
        measured, else :attr:`alpha_mesh` for ``ring`` and ``tree`` (when set), else
        :attr:`alpha` (the summation service's, a server hop included)."""
        if scheme in self.latency:
            messages = self._scheme_cost(scheme).messages
            return self.latency[scheme] / messages if messages > 0 else 0.0
        if scheme in ("ring", "tree") and self.alpha_mesh is not None:
            return self.alpha_mesh
        return self.alpha

    def latency_seconds(self, scheme: str) -> float:
        """The α term of ``scheme``'s cost, seconds: its measured :attr:`latency`, else its
        messages times :meth:`message_alpha`."""
        if scheme in self.latency:
            return self.latency[scheme]
        return self._scheme_cost(scheme).messages * self.message_alpha(scheme)

    def _seconds(self, c: cost_formulas.SchemeCost, nbytes: int) -> float:
        return self.latency_seconds(c.scheme) + c.seconds(
            nbytes, 0.0, self.beta, self.gamma, self.ps_fill_bytes(nbytes))

    def ps_fill_bytes(self, nbytes: int) -> int:
        """Bytes of the first partition of a tensor of ``nbytes`` bytes, on which the schemes'
        pipeline fill is paid (``SchemeCost.fill``): ``min(nbytes, b)`` with b the core's
        partition bound of the tensor (``TensorPartitionBound``,
        :func:`byteps._core.tensor_partition_bound`: a small tensor's is a multiple of
        60 KiB, a large one's :attr:`partition_bound`). A server answers a partition's pull
        only once every worker's push of it is in, so the last partition's sum leaves one
        partition's time after the pushes end (HiPS: its path through both levels); the tree's
        first partition goes up and down the heap before the pipeline is full; the ring
        forwards each chunk as it arrives and pays none. 0 when :attr:`partition_bound` is 0
        or n = 1."""
        if self.partition_bound <= 0 or self.workers <= 1:
            return 0
        from .. import _core  # the core's rule (module comment: not at import)

        return min(int(nbytes), _core.tensor_partition_bound(
            int(nbytes), self.partition_bound, self.workers, self.local_size))

    def choose(self, nbytes: int) -> str:
        """The scheme for a tensor of ``nbytes`` bytes: ``"ps"``, ``"ring"``, ``"tree"`` or
        ``"hips"`` (one of :attr:`schemes`), the cheapest (ties: the earliest in that order),
        from :attr:`intervals`.

        Raises:
            byteps.errors.InvalidTypeError: ``nbytes`` not an int.
            byteps.errors.InvalidArgumentError: ``nbytes`` negative.
        """
        nbytes = _size(nbytes, "choose")
        los = [iv.lo for iv in self.intervals]
        return self.intervals[bisect.bisect_right(los, nbytes) - 1].scheme

    def table(self, sizes: Sequence[int] = TABLE_SIZES) -> Dict[int, str]:
        """{size in bytes: scheme} for ``sizes`` (default: powers of two, 1 B to 16 GiB)."""
        return {int(s): self.choose(s) for s in sizes}

    # ------------------------------------------------------------------------- reporting --
    def as_dict(self) -> dict:
        """A JSON-serialisable dict: ``alpha``, ``beta``, ``gamma`` (seconds, seconds per
        byte), ``sources``, ``workers``, ``servers``, ``tree_width``, ``hips_group``,
        ``servers_source``, ``all_servers``, ``partition_bound``, ``local_size``,
        ``measure_seconds``, ``timings``, ``alpha_mesh``, ``latency`` ({scheme: seconds}),
        ``intervals`` (list of ``{"from_bytes", "to_bytes", "scheme"}``, ``to_bytes`` None for
        the last) and ``table`` ({str(size): scheme} per power of two)."""
        return {"alpha": self.alpha, "alpha_mesh": self.alpha_mesh,
                "latency": dict(self.latency), "beta": self.beta,
                "gamma": self.gamma,
                "sources": dict(self.sources), "workers": self.workers,
                "servers": self.servers, "servers_source": self.servers_source,
                "all_servers": self.all_servers,
                "partition_bound": self.partition_bound, "local_size": self.local_size,
                "tree_width": self.tree_width,
                "hips_group": self.hips_group, "schemes": list(self.schemes),
                "measure_seconds": self.measure_seconds,
                "timings": dict(self.timings),
                "intervals": [{"from_bytes": iv.lo, "to_bytes": iv.hi, "scheme": iv.scheme}
                              for iv in self.intervals],
                "table": {str(k): v for k, v in self.table().items()}}

    def describe(self) -> str:
        """One line: the parameters, where each came from, and the choice per size range."""
        src = self.sources
        parts = [f"alpha {self.alpha * 1e6:.3g} us ({src.get('alpha', 'given')})"]
        if self.alpha_mesh is not None:
            parts.append(f"alpha of the worker mesh {self.alpha_mesh * 1e6:.3g} us "
                         f"({src.get('alpha_mesh', 'given')})")
        if self.latency:
            parts.append("tiny push_pull " + ", ".join(
                f"{s} {t * 1e6:.3g} us" for s, t in self.latency.items()) +
                f" ({src.get('latency', 'given')})")
        parts += [f"beta {self.beta * 1e9:.3g} ns/B = {_rate(self.beta)} "
                  f"({src.get('beta', 'given')})",
                  f"gamma {self.gamma * 1e9:.3g} ns/B = {_rate(self.gamma)} "
                  f"({src.get('gamma', 'given')})"]
        ivs = self.intervals
        ranges = f"{ivs[0].scheme} for every size" if len(ivs) == 1 else ", ".join(
            f"{iv.scheme} below {_bytes(iv.hi)}" if iv.lo == 0 else
            f"{iv.scheme} from {_bytes(iv.lo)}" for iv in ivs)
        took = f"; measured in {self.measure_seconds * 1e3:.1f} ms" if self.measure_seconds \
            else ""
        return (f"cost model: {self.workers} worker machine(s), {self.servers} CPU-only "
                f"server(s) ({self.servers_source}), tree "
                f"width {self.tree_width}, HiPS group "
                f"{cost_formulas.hips_group(self.workers, self.hips_group)}; "
                + "; ".join(parts) + f"; choice: {ranges}{took}")


def _size(nbytes, fn: str) -> int:
    """``nbytes`` as an int >= 0 (Python or NumPy integer; bool and float refused)."""
    from ..basics import _as_int  # loads the core (module comment)

    return _as_int(nbytes, "nbytes", f"cost model {fn}", 0)


def _rate(spb: float) -> str:
    return f"{1.0 / spb / 1e9:.3g} GB/s" if spb > 0 else "unlimited"


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------- the job's model --

_lock = threading.RLock()  # one measurement at a time; guards _cached
_cached: Optional[Tuple[tuple, CostModel]] = None
_state = threading.local()  # .measuring: this thread is inside measure()


def overrides(values: Mapping[str, str]) -> Dict[str, float]:
    """{parameter: value} for each ``BYTEPS_COST_*`` set in ``values`` (the knob registry's
    validated values, ``byteps._core.knob_values()``)."""
    return {p: float(values[v]) for p, v in VARIABLES.items() if values.get(v, "") != ""}


def _knob_int(values: Mapping[str, str], name: str, default: int) -> int:
    text = values.get(name, "")
    return int(text) if text != "" else default


def _job_key(values: Mapping[str, str]) -> tuple:
    names = ("BYTEPS_JOB_ID", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "BYTEPS_LOCAL_SIZE",
             TREE_WIDTH_KNOB, HIPS_GROUP_KNOB, *VARIABLES.values())
    return tuple(values.get(n, "") for n in names)


def measure(env: Optional[Mapping[str, str]] = None, *, tree_width: Optional[int] = None,
            hips_group: Optional[int] = None, servers: Optional[int] = None,
            schemes: Optional[Sequence[str]] = None) -> CostModel:
    """Build the job's :class:`CostModel`: measure α, β, γ (collective) unless the
    ``BYTEPS_COST_*`` variables set all three, then apply the ones set. Logs the choice once
    (logger ``byteps.cost_model``, INFO) and, measuring this job, keeps the model for
    :func:`get`. The measurement's own tensors are declared for the summation service.

    Args:
        env: variables to read instead of the process environment (a dict); only when all three
            ``BYTEPS_COST_*`` are in it (nothing to measure).
        tree_width, hips_group: the schemes' shapes; default: the ``BYTEPS_TREE_WIDTH`` /
            ``BYTEPS_HIPS_GROUP`` knobs where the registry has them, else 0 (the core's
            default width) and 0 (sqrt(n)).
        servers: k of the summation service's formula (CPU-only servers); default: in a
            running distributed job, the servers of the scheduler's address book on hosts
            where no worker machine runs (``byteps._core.server_placement()``: the same on
            every rank; servers colocated with workers, as ``bpslaunch`` places them, count
            0); otherwise ``DMLC_NUM_SERVER`` (every server taken as CPU-only). Which schemes
            the job can run is judged from all its servers, whatever ``servers`` says.
        schemes: the schemes to choose among; default :data:`CANDIDATES` (all four).

    Raises:
        byteps.errors.ConfigError: a ``BYTEPS_COST_*`` (or another knob) malformed or out of
            range; the message names the variable.
        byteps.errors.NotInitializedError: something to measure before ``init()``.
        byteps.errors.InvalidArgumentError: ``env`` given without all three variables.
        byteps.errors.BytePSTimeoutError, PeerLostError: a rank did not take part.
        byteps.errors.InternalError: called again from inside a measurement (a push_pull of the
            measurement asked ``BYTEPS_SYNC=auto``'s choice: its tensors are declared with
            ``sync="ps"`` so that it never should).
    """
    if getattr(_state, "measuring", False):
        raise InternalError("cost model: asked for the cost model while measuring it (a "
                            "push_pull of the measurement went through BYTEPS_SYNC=auto's "
                            "choice)")
    with _lock:
        _state.measuring = True
        try:
            return _measure(env, tree_width, hips_group, servers, schemes)
        finally:
            _state.measuring = False


def feasible_schemes(n: int, k: int, group: int) -> tuple:
    """The schemes of :data:`CANDIDATES` this job can run (the core refuses the others):
    ``ps`` needs a server (``k`` = ``DMLC_NUM_SERVER`` >= 1), ``ring`` and ``tree`` two worker
    machines, ``hips`` two worker machines and ceil(n / group) + 1 servers. One worker machine:
    ``ps`` only (nothing crosses a network)."""
    if n <= 1:
        return ("ps",)
    ok = {"ps": k >= 1, "ring": True, "tree": True,
          "hips": group > 0 and k >= math.ceil(n / group) + 1}
    out = tuple(s for s in CANDIDATES if ok.get(s, False))
    return out or ("ring",)


def _servers(values: Mapping[str, str], servers: Optional[int],
             job: bool) -> Tuple[int, int, str]:
    """(k: CPU-only servers, all servers, where k came from). In a running distributed job
    both counts come from the scheduler's address book (a server is colocated when a worker
    machine registered from its host: ``KeyPlanner``'s weights use the same flags), which every
    rank has alike (the local root's, passed to its local ranks); without one,
    ``DMLC_NUM_SERVER`` for both (``job`` False: ``values`` are a what-if's, not the running
    job's). ``servers`` given: k = it."""
    from .. import _core

    total = int(values[SERVERS_VARIABLE])
    k, source = total, SERVERS_VARIABLE
    if job and _core.is_initialized() and _core.is_distributed():
        total, k = (int(x) for x in _core.server_placement())
        source = ADDRESS_BOOK
    if servers is not None:
        k, source = servers, GIVEN
    return k, total, source


def _measure(env, tree_width, hips_group, servers, schemes) -> CostModel:
    global _cached
    from .. import _core

    values = _core.knob_values(None if env is None else dict(env))
    over = overrides(values)
    n = int(values["DMLC_NUM_WORKER"])
    k, total, k_source = _servers(values, servers, env is None)
    w = _knob_int(values, TREE_WIDTH_KNOB, DEFAULT_TREE_WIDTH) if tree_width is None \
        else tree_width
    g = _knob_int(values, HIPS_GROUP_KNOB, DEFAULT_HIPS_GROUP) if hips_group is None \
        else hips_group
    sources = {p: VARIABLES[p] for p in over}
    alpha_mesh = None
    latency: Dict[str, float] = {}
    took = 0.0
    timings: Dict[str, float] = {}
    if len(over) < len(VARIABLES):
        if env is not None:
            raise InvalidArgumentError(
                "cost model: measure(env=...) needs all of " + ", ".join(VARIABLES.values()) +
                " in env (the measurement reads the running job, not env)")
        if not _core.is_initialized():
            missing = ", ".join(v for p, v in VARIABLES.items() if p not in over)
            raise NotInitializedError(f"cost model: call init() first: {missing} not set, so "
                                      "it is measured through the job")
        from . import cost_measure

        n = int(_core.num_worker())
        t0 = time.perf_counter()
        mesh = sync_setting(values) in ("ring", "tree", "auto")
        if g == 0 and n > 1:  # the core's default group (BYTEPS_HIPS_GROUP=0)
            g = cost_formulas.hips_group(n)
        runs = feasible_schemes(n, total, g) if schemes is None else tuple(schemes)
        timed = () if "alpha" in over else tuple(
            s for s in runs if mesh or s not in ("ring", "tree"))
        m = cost_measure.run(n, k, int(_core.size()), int(_core.local_size()),
                             int(values["BYTEPS_PARTITION_BYTES"]), schemes=timed)
        took = time.perf_counter() - t0
        params = {"alpha": m.alpha, "beta": m.beta, "gamma": m.gamma}
        timings = {"tiny_s": m.tiny_s, "large_s": m.large_s, "large_bytes": m.large_bytes}
        if m.alpha_mesh >= 0 and "alpha" not in over:  # BYTEPS_COST_ALPHA sets both
            alpha_mesh = m.alpha_mesh
            sources["alpha_mesh"] = MEASURED
            timings["tiny_mesh_s"] = m.tiny_mesh_s
        if m.latency:
            latency = m.latency
            sources["latency"] = MEASURED
        for p in ("alpha", "beta"):
            sources.setdefault(p, MEASURED if n > 1 else NO_NETWORK)
        sources.setdefault("gamma", MEASURED)
        if m.beta_floored and "beta" not in over:
            log.warning("cost model: on some rank a %d-byte push_pull measured hardly slower "
                        "than a tiny one; beta raised to %g s/B there (set BYTEPS_COST_BETA to "
                        "override)", m.large_bytes, cost_measure.BETA_FLOOR)
        params.update(over)
    else:
        params = over
    if g == 0 and n > 1:  # the core's default group (BYTEPS_HIPS_GROUP=0)
        g = cost_formulas.hips_group(n)
    local = max(_knob_int(values, "BYTEPS_LOCAL_SIZE", 1), 1)
    model = CostModel(params["alpha"], params["beta"], params["gamma"], n, k, w, g, sources,
                      took, timings,
                      feasible_schemes(n, total, g) if schemes is None else tuple(schemes),
                      k_source, _core.partition_bound(int(values["BYTEPS_PARTITION_BYTES"]), local),
                      local, total, alpha_mesh, latency)
    log.info("%s", model.describe())
    if env is None:
        _cached = (_job_key(values), model)
    return model


def get(refresh: bool = False) -> CostModel:
    """The job's :class:`CostModel`: the one :func:`measure` made for this job (same job id,
    shape and variables), else a new one (``refresh``: always a new one). Collective when it
    measures: call it on every rank at the same point. ``byteps.cost_model()`` calls this.

    Raises: as :func:`measure`.
    """
    from .. import _core

    values = _core.knob_values(None)
    with _lock:  # a second thread waits for the first one's measurement
        if not refresh and _cached is not None and _cached[0] == _job_key(values):
            return _cached[1]
        return measure()


def choose(nbytes: int) -> str:
    """``get().choose(nbytes)``: the scheme of a tensor of ``nbytes`` bytes in this job."""
    return get().choose(nbytes)
