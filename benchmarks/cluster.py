"""Emulated-cluster benchmarks: link measurement, real byteps jobs, and the default-B probe.

* :class:`EmulatedCluster` (from :mod:`benchmarks.netns`): n worker hosts + k CPU-server hosts
  as network namespaces behind a bridge, each host's link shaped to B in both directions.
* :func:`measure_link` (from :mod:`benchmarks.linktest`): TCP bulk throughput between two
  hosts, bytes/s.
* :func:`run_byteps_job`: a real byteps job in upstream mode (``DMLC_*`` per process).
* ``python -m benchmarks.cluster --probe [--quick]``: for candidate bandwidths, the shaped
  link throughput and a push_pull at n = k = 4 against ``t_opt``; prints a Markdown table and
  the recommended default B (the largest B at which push_pull still tracks ``t_opt``, i.e. the
  network and not the CPU is the bottleneck).

Process placement of :func:`run_byteps_job`: the scheduler runs on the first worker host
(``w0``; its traffic is a few small control messages), one server on every CPU-server host,
plus -- the placement of docs/architecture.md §4, which ``t_opt`` assumes -- one server
colocated on every worker host while k < n (k = 0: only those; the scheduler recognises
colocation by address), and one worker process (``BYTEPS_LOCAL_SIZE=1``) per worker host.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import secrets
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from byteps.launch.contract import ClusterSpec, JobIdentity, role_env

from . import child_env, runner
from .linktest import measure_link, t_opt, table_goodput
from .netns import (
    EmulatedCluster,
    Host,
    close_all,
    install_signal_cleanup,
    list_netns,
    netns_unavailable,
    own_netns_left,
    tbf_params,
)

__all__ = [
    "COMPRESSION_ENV",
    "EmulatedCluster",
    "Host",
    "JobResult",
    "close_all",
    "install_signal_cleanup",
    "list_netns",
    "measure_link",
    "table_goodput",
    "netns_unavailable",
    "own_netns_left",
    "pushpull_worker_argv",
    "idle_before_iteration",
    "IDLE_ENV",
    "run_byteps_job",
    "run_pushpull",
    "PushPullStats",
    "t_opt",
    "tbf_params",
    "choose_default_bandwidth",
    "probe_table",
    "PROBE_ENV",
]

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ byteps jobs --


class JobResult(NamedTuple):
    """What :func:`run_byteps_job` returns.

    Attributes:
        returncodes (list[int | None]): exit code of worker i (``-n``: killed by signal n, which
            is what a worker stopped at the timeout reports).
        output (str): the output lines of every process of the job (stdout and stderr), in
            arrival order, each prefixed ``[worker i] ``, ``[server j] `` or ``[scheduler] ``.
    """

    returncodes: list
    output: str

    @property
    def ok(self) -> bool:
        """True when every worker exited 0."""
        return all(rc == 0 for rc in self.returncodes)

    def lines(self, label: str) -> list[str]:
        """Output lines of one process (``"worker 0"``), without the prefix."""
        pre = f"[{label}] "
        return [ln[len(pre):] for ln in self.output.splitlines() if ln.startswith(pre)]

    def worker_reports(self, what: str) -> list[dict]:
        """The last ``RESULT {json}`` line of every worker, decoded.

        Raises:
            RuntimeError: a worker failed or printed no ``RESULT`` (names ``what`` and carries
                the tail of the output).
        """
        reports = []
        for i in range(len(self.returncodes)):
            found = [ln for ln in self.lines(f"worker {i}") if ln.startswith("RESULT ")]
            if found:
                reports.append(json.loads(found[-1][7:]))
        if not self.ok or len(reports) != len(self.returncodes):
            tail = "\n".join(self.output.splitlines()[-30:])
            raise RuntimeError(f"{what} failed (exit codes {self.returncodes}):\n{tail}")
        return reports


def run_on_worker_hosts(cluster: EmulatedCluster, argv: Sequence[str], env: Mapping[str, str],
                        timeout: float, what: str, rank_env: bool = True
                        ) -> tuple[list[str], list[int | None]]:
    """``argv`` once on every worker host of ``cluster`` (``RANK`` = the worker's index with
    ``rank_env``), all at once (:mod:`benchmarks.runner`); waits up to ``timeout`` seconds in
    all, then stops whatever still runs. Returns every process's output (stdout and stderr) and
    exit code (negative: it was stopped by that signal), in worker order."""
    group = runner.Group()
    try:
        procs = [group.start(argv, {**env, "RANK": str(i)} if rank_env else dict(env),
                             label=f"{what} on {h.name}", spawn=functools.partial(cluster.spawn, h))
                 for i, h in enumerate(cluster.workers)]
        if None in group.wait_all(timeout):
            log.warning("%s on %s still running after %.0f s; stopping", what, cluster.prefix,
                        timeout)
    finally:
        cluster.stop_all(timeout=3.0)
    for p in group.procs:
        p.drain(5.0)
    return [p.output for p in procs], [p.returncode for p in procs]


def run_byteps_job(
    cluster: EmulatedCluster,
    worker_argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    service_grace: float = 10.0,
    colocate: bool | None = None,
    on_line: Callable[[str], None] | None = None,
) -> JobResult:
    """Run a byteps job on ``cluster`` in upstream mode and wait for its workers.

    Placement: scheduler on ``w0`` (``DMLC_PS_ROOT_URI`` = w0's address, a random port); one
    server (``python -m byteps.server``) per CPU-server host and, as in docs/architecture.md
    §4, one colocated on every worker host while k < n (its optimal share
    ``(n-k)/(n^2+kn-2k)`` is then positive; at k >= n it is 0, so none are started); one worker
    process running ``worker_argv`` per worker host. ``DMLC_NUM_SERVER`` counts all servers.
    k = 0: only the colocated servers. Every process's environment is its role's
    (``byteps.launch.contract.role_env``: the job's shape and scheduler, a fresh ``BYTEPS_JOB_ID``
    and ``BYTEPS_SECRET``, ``PYTHONUNBUFFERED=1``) with its host's address as
    ``DMLC_NODE_HOST``; a worker is machine i with ``BYTEPS_LOCAL_SIZE=1``,
    ``BYTEPS_LOCAL_RANK=0``. ``env`` is added on top of ``os.environ`` (and may override
    ``BYTEPS_*`` knobs, not the contract's variables). The processes run through
    :mod:`benchmarks.runner` (spawned by ``cluster.spawn``, stopped by ``cluster.stop_all``).

    Args:
        cluster: where to run.
        worker_argv: the worker command (run once per worker host).
        env: extra environment for every process.
        timeout: seconds the workers may run before everything is stopped.
        service_grace: seconds the servers and scheduler get to exit by themselves after the
            workers are done, before they are stopped.
        colocate: start a server on every worker host too; default ``k < n`` (always when
            k = 0). ``False`` with k > 0 gives the CPU-server-only layout.
        on_line: called (from a reader thread) with every output line as it arrives, prefixed
            like ``JobResult.output``; lets a caller act while the job runs (fault tests).

    Returns:
        JobResult: worker exit codes and the prefixed output of every process.
    """
    n, k = cluster.num_workers, cluster.num_servers
    if colocate is None:
        colocate = k < n
    server_hosts = cluster.servers + (cluster.workers if colocate or k == 0 else [])
    root = cluster.workers[0]
    spec = ClusterSpec(n, len(server_hosts), 1, root.address, random.randint(20000, 59999),
                       JobIdentity(f"bench{uuid.uuid4().hex[:12]}", secrets.token_hex(16)))
    base = child_env({**os.environ, **(env or {})})
    server_argv = [sys.executable, "-m", "byteps.server"]
    lines: list[str] = []
    lock = threading.Lock()

    def collect(prefix: str) -> Callable[[str], None]:
        def add(line: str) -> None:
            line = f"{prefix}{line}\n"
            with lock:
                lines.append(line)
            if on_line:
                on_line(line)
        return add

    group = runner.Group()

    def start(label: str, host: Host, argv: Sequence[str], role: str, **ids) -> runner.Proc:
        return group.start(argv, role_env(spec, role, node_host=host.address, base=base, **ids),
                           label=label, on_line=collect(f"[{label}] "),
                           spawn=functools.partial(cluster.spawn, host))

    try:
        services = [start("scheduler", root, server_argv, "scheduler")]
        services += [start(f"server {j}", h, server_argv, "server")
                     for j, h in enumerate(server_hosts)]
        workers = [start(f"worker {i}", h, worker_argv, "worker", worker_id=i, local_rank=0)
                   for i, h in enumerate(cluster.workers)]
        if None in group.wait_all(timeout, workers):
            log.warning("byteps job on %s: workers still running after %.0f s; stopping",
                        cluster.prefix, timeout)
        else:
            group.wait_all(service_grace, services)
    finally:
        cluster.stop_all(timeout=3.0)
        for p in group.procs:
            p.drain(5.0)
    codes = [w.returncode for w in workers]
    result = JobResult(codes, "".join(lines))
    if not result.ok:
        log.warning("byteps job on %s: worker exit codes %s", cluster.prefix, codes)
    return result


# ----------------------------------------------------------------- push_pull worker / probe --


def pushpull_worker_argv(nbytes: int, iters: int, warmup: int = 1) -> list[str]:
    """Command of a worker that push_pulls a float32 tensor of ``nbytes`` bytes ``warmup`` +
    ``iters`` times, checks every sum exactly, and prints ``RESULT {json}`` (see
    :func:`_worker_main`)."""
    return [sys.executable, "-m", "benchmarks.cluster", "--worker", str(nbytes), str(iters),
            str(warmup)]


#: Environment variable of a push_pull (or gloo) worker: seconds it waits before the barrier
#: that starts each iteration (:func:`idle_before_iteration`).
IDLE_ENV = "BENCH_IDLE_BEFORE_ITERATION_S"


def idle_before_iteration(cluster: EmulatedCluster) -> float:
    """Seconds every link of ``cluster`` stays idle before each timed iteration: twice the time
    its shaper's bucket takes to refill (8 ms at 800 Mbit/s; 0 unshaped).

    The emulated links' ``tbf`` passes the first bytes after an idle spell above the rate, up to
    the bucket (4 ms of the rate). Back to back, the link direction that carried the last bytes
    of one iteration started the next with its bucket part-filled, the other direction with
    it full; at n = 2 that made one worker 3 ms slower than the other in every iteration of a
    4 MiB push_pull (40.2 against 43.3 ms), whichever data flow byteps used
    (docs/performance-notes.md). Between the reductions of a training step there is compute;
    here every link starts each iteration in the same state, for byteps and gloo alike.
    """
    return 2 * cluster.bucket_refill_s


#: Environment variable of a push_pull worker: a JSON object of the core's compressor kwargs
#: (``byteps.basics.declare(name, compression=...)``) its tensor is declared with.
COMPRESSION_ENV = "BENCH_PUSHPULL_COMPRESSION"


def _net_bytes(dev: str = "eth0") -> tuple[int, int] | None:
    """(received, sent) bytes of ``dev`` in this process's network namespace, from
    ``/proc/net/dev`` (every frame's bytes on the link); None when unreadable."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == dev:
                    v = rest.split()
                    return int(v[0]), int(v[8])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _worker_main(nbytes: int, iters: int, warmup: int) -> int:
    """A push_pull benchmark worker (run by :func:`run_byteps_job`).

    Rank r sends ``x[i] = (i % 251) + 1000 * r`` (float32, exact): the sum is
    ``size * (i % 251) + 1000 * size * (size - 1) / 2``. Every iteration starts after
    :data:`IDLE_ENV` seconds (default 0) and a barrier (a 4-byte push_pull). Prints ``RESULT``
    with the seconds of each timed iteration (``times``), the CPU seconds of this process
    (every thread) during each timed push_pull (``cpu``), and the bytes its host's ``eth0``
    received and sent during the timed iterations (``net``: ``[rx, tx]``, None outside a
    network namespace's ``eth0``); exits 1 on a wrong sum.

    With :data:`COMPRESSION_ENV` set, the tensor is declared with that compressor, rank r sends
    standard-normal values (seed r) and a sum only has to be finite (compression is lossy).
    """
    import numpy as np

    import byteps.basics as bps

    compression = json.loads(os.environ.get(COMPRESSION_ENV) or "null")
    idle_s = float(os.environ.get(IDLE_ENV) or 0)
    bps.init()
    r, size = bps.rank(), bps.size()
    nelem = max(nbytes // 4, 1)
    if compression:
        bps.declare("bench.grad", compression=compression)
        x = np.random.default_rng(r).standard_normal(nelem, dtype=np.float32)
        want = None
    else:
        base = (np.arange(nelem, dtype=np.int64) % 251).astype(np.float32)
        x = base + np.float32(1000 * r)
        want = base * np.float32(size) + np.float32(1000 * size * (size - 1) // 2)
    out = np.empty_like(x)
    token = np.zeros(1, np.float32)

    def barrier() -> None:
        # Every worker starts the timed push_pull together: the check of the previous result
        # (tens of ms of CPU per worker, all sharing two cores) must not count as waiting.
        bps.wait(bps.push_pull_async("bench.barrier", token.ctypes.data, token.ctypes.data,
                                     token.nbytes, "float32", token.shape, False))

    times, cpu = [], []
    t_start = net0 = None
    for it in range(warmup + iters):
        if it == warmup:
            t_start, net0 = time.monotonic(), _net_bytes()
        out.fill(-1)
        time.sleep(idle_s)  # every link's shaper bucket full again (idle_before_iteration)
        barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        h = bps.push_pull_async("bench.grad", x.ctypes.data, out.ctypes.data, x.nbytes,
                                "float32", x.shape, False)
        bps.wait(h)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if want is None and not np.isfinite(out).all():
            print(f"FAIL rank {r} iter {it}: a compressed sum is not finite", flush=True)
            return 1
        if want is not None and not np.array_equal(out, want):
            bad = int(np.flatnonzero(out != want)[0])
            print(f"FAIL rank {r} iter {it}: out[{bad}]={out[bad]} want {want[bad]}", flush=True)
            return 1
        if it >= warmup:
            times.append(dt)
            cpu.append(dc)
    t_end = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every network namespace
    net1 = _net_bytes()
    net = [b - a for a, b in zip(net0, net1)] if net0 and net1 else None
    from byteps import _core

    credit = _core.push_credit() if _core.is_distributed() else None
    bps.shutdown()
    print("RESULT " + json.dumps({"rank": r, "size": size, "bytes": int(x.nbytes),
                                  "times": times, "cpu": cpu, "t_start": t_start,
                                  "t_end": t_end, "net": net, "push_credit": credit}),
          flush=True)
    return 0


class PushPullStats(NamedTuple):
    """Result of :func:`run_pushpull`.

    Attributes:
        seconds (float): median over the timed iterations of the slowest worker's time, s.
        cpu_busy (float | None): fraction (0..1) of all CPU time of this machine that was busy
            (not idle/iowait) during the timed iterations; None if it could not be sampled
            (no readable ``/proc/stat``).
    """

    seconds: float
    cpu_busy: float | None


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from ``/proc/stat``."""
    with open("/proc/stat") as f:
        vals = [float(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
    return sum(vals) - idle, sum(vals)


def run_pushpull(
    cluster: EmulatedCluster,
    nbytes: int,
    iters: int = 3,
    warmup: int = 1,
    env: Mapping[str, str] | None = None,
    timeout: float = 180.0,
    compression: Mapping[str, object] | None = None,
    reports: list | None = None,
) -> PushPullStats:
    """Time push_pull of ``nbytes`` (float32) on ``cluster`` with a real byteps job, sampling
    the machine's CPU load (``/proc/stat``, every 50 ms) during the timed iterations.

    Args:
        compression: the core's compressor kwargs the workers declare their tensor with
            (:data:`COMPRESSION_ENV`); None: uncompressed, every sum checked exactly.
        reports: if given, every worker's ``RESULT`` dict is appended to it (``net``: the
            bytes its host received and sent during the timed iterations).

    Raises:
        RuntimeError: the job failed (the message carries the tail of its output).
    """
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            try:
                busy, total = _cpu_times()
            except (OSError, ValueError, IndexError):  # no readable /proc/stat: cpu_busy None
                return
            samples.append((time.monotonic(), busy, total))
            stop.wait(0.05)

    env = {**(env or {}), IDLE_ENV: str(idle_before_iteration(cluster))}
    if compression:
        env[COMPRESSION_ENV] = json.dumps(dict(compression))
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        res = run_byteps_job(cluster, pushpull_worker_argv(nbytes, iters, warmup), env=env,
                             timeout=timeout)
    finally:
        stop.set()
        th.join(2.0)
    found = res.worker_reports("push_pull job")
    if reports is not None:
        reports.extend(found)
    slowest = [max(ts) for ts in zip(*(r["times"] for r in found))]
    t0 = max(r["t_start"] for r in found)
    t1 = min(r["t_end"] for r in found)
    window = [s for s in samples if t0 <= s[0] <= t1]
    cpu = None
    if len(window) >= 2 and window[-1][2] > window[0][2]:
        cpu = (window[-1][1] - window[0][1]) / (window[-1][2] - window[0][2])
    return PushPullStats(statistics.median(slowest), cpu)


#: Environment of the probe's jobs: fine partitions and enough credit that all k servers and
#: both directions of every link are busy at once. With upstream's partitions (4 096 000 bytes,
#: credit 4) a 16 MiB tensor is 5 partitions over 4 servers and push_pull took ~2 x t_opt at
#: every B -- a pipelining limit, not the CPU limit the probe looks for.
PROBE_ENV = {"BYTEPS_PARTITION_BYTES": str(256 * 1024), "BYTEPS_SCHEDULING_CREDIT": "16"}


def choose_default_bandwidth(
    candidates_mbit: Sequence[float] = (100, 200, 400, 800, 1600),
    n: int = 4,
    k: int = 4,
    model_bytes: int = 16 << 20,
    iters: int = 3,
    link_seconds: float = 2.0,
    tolerance: float = 1.10,
    env: Mapping[str, str] | None = None,
) -> tuple[float | None, list[dict]]:
    """Measure, for each candidate bandwidth, the link goodput and a push_pull at (n, k).

    For each B (Mbit/s) a fresh cluster is built; its row holds the goodput of w0 -> s0
    (``goodput_Bps``, bytes/s), the push_pull time (``time_s``, s), the machine's CPU busy
    fraction during it, ``t_opt`` at the set B and at the measured goodput, and ``ratio`` =
    time / t_opt(goodput). Network-bound means the time scales with 1/B, i.e. the ratio stays
    at its value for the smallest B (where the network is surely the bottleneck); once the CPU
    saturates the time stops shrinking and the ratio grows. The recommended default is the
    largest B whose ratio, and that of every smaller candidate, is at most ``tolerance`` times
    the smallest B's ratio.

    Args:
        env: job environment; default :data:`PROBE_ENV`.

    Returns:
        (recommended B in bits/s, or None when no two candidates were measured; rows).
    """
    env = PROBE_ENV if env is None else env
    rows: list[dict] = []
    for mbit in sorted(candidates_mbit):
        bps_ = mbit * 1e6
        with EmulatedCluster(n, k, bps_) as c:
            dst = c.servers[0] if k else c.workers[-1]
            good = measure_link(c, c.workers[0], dst, seconds=link_seconds)
            t, cpu = run_pushpull(c, model_bytes, iters=iters, env=env)
            network = c.network_info()
        row = {"mbit": mbit, "goodput_Bps": good, "link_frac": good * 8 / bps_, "time_s": t,
               "cpu_busy": cpu, "network": network,
               "t_opt_set_s": t_opt(n, k, model_bytes, bps_ / 8),
               "t_opt_meas_s": t_opt(n, k, model_bytes, good)}
        row["ratio"] = t / row["t_opt_meas_s"]
        row["vs_lowest"] = row["ratio"] / (rows[0]["ratio"] if rows else row["ratio"])
        rows.append(row)
        log.info("B=%g Mbit/s: link %.3f of set, push_pull %.3f s, %.2f x t_opt", mbit,
                 row["link_frac"], t, row["ratio"])
    best = None
    for row in rows:
        if row["vs_lowest"] > tolerance:
            break
        best = row["mbit"] * 1e6
    return best, rows


def probe_table(rows: Sequence[dict], n: int, k: int, model_bytes: int) -> str:
    """The probe's rows as a Markdown table."""
    from .report import network_sentence

    out = [f"push_pull of {model_bytes / 2**20:g} MiB float32, n = {n} worker hosts, "
           f"k = {k} server hosts, {os.cpu_count()} CPU cores; "
           f"{network_sentence([r.get('network') for r in rows])}", "",
           "| B set (Mbit/s) | link goodput (Mbit/s) | goodput / B | push_pull (s) "
           "| t_opt at goodput (s) | time / t_opt | ratio / ratio at lowest B | CPU busy |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpu = "n/a" if r["cpu_busy"] is None else f"{100 * r['cpu_busy']:.0f} %"
        out.append(f"| {r['mbit']:g} | {r['goodput_Bps'] * 8 / 1e6:.1f} | {r['link_frac']:.3f} "
                   f"| {r['time_s']:.3f} | {r['t_opt_meas_s']:.3f} | {r['ratio']:.2f} "
                   f"| {r['vs_lowest']:.2f} | {cpu} |")
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster",
        description="Emulated-cluster tools (need root and iproute2). --probe: choose the "
        "default link bandwidth B at which push_pull is network-bound.")
    p.add_argument("--probe", action="store_true", help="run the bandwidth probe")
    p.add_argument("--quick", action="store_true",
                   help="probe 200/800/1600 Mbit/s with 2 timed iterations (under ~1 minute)")
    p.add_argument("--bandwidths", type=float, nargs="+", metavar="MBIT",
                   help="candidate bandwidths in Mbit/s (default 100 200 400 800 1600; "
                   "quick: 200 800 1600)")
    p.add_argument("--size-mib", type=float, help="push_pull tensor size in MiB (default 16)")
    p.add_argument("--workers", "-n", type=int, default=4, help="worker hosts (default 4)")
    p.add_argument("--servers", "-k", type=int, default=4, help="server hosts (default 4)")
    p.add_argument("--iters", type=int, help="timed iterations (default 3; quick: 2)")
    p.add_argument("--tolerance", type=float, default=1.10,
                   help="network-bound while time / t_opt is within this factor of its value "
                   "at the smallest B (default 1.10)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                   help="job environment (repeatable; replaces the probe's default "
                   f"{' '.join(f'{k}={v}' for k, v in PROBE_ENV.items())})")
    p.add_argument("--worker", nargs=3, type=int, metavar=("BYTES", "ITERS", "WARMUP"),
                   help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.cluster``: see ``--help``."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if args.worker:
        return _worker_main(*args.worker)
    if not args.probe:
        _parser().print_help()
        return 2
    reason = netns_unavailable()
    if reason:
        log.error("cannot build an emulated cluster: %s", reason)
        return 2
    install_signal_cleanup()
    mbits = args.bandwidths or ([200, 800, 1600] if args.quick else [100, 200, 400, 800, 1600])
    env = dict(PROBE_ENV)
    if args.env:
        env = dict(kv.split("=", 1) for kv in args.env if "=" in kv)
    size = int((args.size_mib or 16) * 2**20)
    iters = args.iters or (2 if args.quick else 3)
    t0 = time.monotonic()
    best, rows = choose_default_bandwidth(mbits, args.workers, args.servers, size, iters,
                                          link_seconds=1.0 if args.quick else 2.0,
                                          tolerance=args.tolerance, env=env)
    print(probe_table(rows, args.workers, args.servers, size))
    print(f"\njob environment: {' '.join(f'{k}={v}' for k, v in env.items())}; CPU busy is "
          "machine-wide (includes anything else running)\n")
    top = rows[-1]["mbit"] * 1e6
    if best is None:
        print("Recommendation: none (no candidate measured).")
    else:
        tail = ("" if best < top else " (the largest candidate: try larger ones to find the "
                "CPU limit)")
        print(f"Recommendation: default B = {best / 1e6:g} Mbit/s, the largest candidate at "
              f"which push_pull time still scales with 1/B (time / t_opt within "
              f"{args.tolerance:g} x its value at {rows[0]['mbit']:g} Mbit/s): the network, "
              f"not the CPU, is the bottleneck{tail}.")
    log.info("probe took %.1f s", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
