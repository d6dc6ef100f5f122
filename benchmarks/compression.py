"""Gradient compression benchmarks: what two-level compression gains on a slow network.

Three parts, each a real measurement of the core's compressors (docs/compression.md):

* **cluster**: push_pull of a float32 gradient (64 MiB) on the emulated cluster
  (:class:`benchmarks.cluster.EmulatedCluster`) with every link shaped to 100 Mbit/s, at the
  (n, k) of :data:`CLUSTER_CONFIGS`, uncompressed and with each compressor of
  :data:`COMPRESSORS` (the push_pull worker of :mod:`benchmarks.cluster` declares its tensor
  with the compressor's kwargs). Per job: the median time of the slowest worker, the speed-up
  over the uncompressed job of the same cluster, the bytes every worker host sent and received
  per push_pull (its ``eth0`` counters: frames, headers included), the machine's CPU busy;
* **throughput**: ``byteps._core_testing.compressor_throughput`` per compressor (compress and
  decompress, float32, one thread, GB/s of raw input bytes) on a 64 MiB tensor and on one
  partition of the core's default size, next to the memory-bandwidth probe of
  :func:`benchmarks.sumbench.memory_bandwidth` (1 thread);
* **training**: ``examples/torch/train_digits.py``, its MLP and its small CNN (``--model cnn``,
  4 MiB of gradients per step) trained on a 100 Mbit/s emulated cluster of n = 2
  worker hosts and k = 2 server hosts, uncompressed and with onebit + error feedback (the torch
  adapter's ``compression_params``): final test accuracy and time per step.

Targets (:mod:`benchmarks.compression_report`): onebit ≥ 8×, top-k 1 % ≥ 5×, dithering k = 4 ≥
4× faster than uncompressed at every (n, k); onebit and fp16 compress and decompress at ≥ 50 %
of the memory-bandwidth probe; onebit + EF within 1 point of the uncompressed test accuracy.

Hooked into ``python -m benchmarks`` (``--compression``, or ``--only compression``) through
``bench_*``, and runnable alone: ``python -m benchmarks.compression [--quick]
[--parts cluster,throughput,training] [--json FILE]``. The cluster and training parts need
root and iproute2 (skipped with the reason otherwise).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from . import ROOT
from . import cluster as bc

log = logging.getLogger(__name__)

#: name -> the core's compressor kwargs (``byteps.basics.declare(name, compression=...)``).
COMPRESSORS = {
    "onebit": {"compressor_type": "onebit", "compressor_onebit_scaling": True},
    "topk": {"compressor_type": "topk", "compressor_k": 0.01},
    "dithering": {"compressor_type": "dithering", "compressor_k": 4},
    "randomk": {"compressor_type": "randomk", "compressor_k": 0.01},
    "fp16": {"compressor_type": "fp16"},
}
#: What each compressor is, for the report.
LABELS = {"onebit": "onebit (scaled)", "topk": "top-k 1 %", "dithering": "dithering k = 4",
          "randomk": "random-k 1 %", "fp16": "fp16"}
#: Minimum speed-up over uncompressed push_pull on the 100 Mbit/s cluster (others: info).
SPEEDUP_TARGETS = {"onebit": 8.0, "topk": 5.0, "dithering": 4.0}
#: Compressors whose compress and decompress must reach this share of the memory bandwidth.
THROUGHPUT_TARGETS = {"onebit": 0.5, "fp16": 0.5}
#: The throughput part: the compressors, plus those with vanilla error feedback ("+ef").
THROUGHPUT_ENTRIES = ("onebit", "onebit+ef", "fp16", "topk", "topk+ef", "randomk",
                      "randomk+ef", "dithering", "dithering+ef")
CLUSTER_CONFIGS = ((2, 2), (4, 4))
BANDWIDTH_MBIT = 100.0
#: The core's default BYTEPS_PARTITION_BYTES and BYTEPS_MIN_COMPRESS_BYTES (knobs.cc).
PARTITION_BYTES = 262144
MIN_COMPRESS_BYTES = 65536
#: Training: the torch adapter's compression_params of the compressed runs.
TRAIN_COMPRESSION = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
#: Training workloads: the command (after the interpreter), epochs, BYTEPS_MIN_COMPRESS_BYTES.
#: The MLP's gradients are 32 KiB and smaller, so its threshold is lowered to 4096 bytes
#: (its two weight matrices are compressed, its biases are not).
TRAIN_MODELS = {
    "mlp": {"argv": [os.path.join(ROOT, "examples", "torch", "train_digits.py")],
            "epochs": 20, "min_compress_bytes": 4096,
            "label": "digits MLP (`examples/torch/train_digits.py`, 64-128-10, SGD momentum 0.9)"},
    "cnn": {"argv": [os.path.join(ROOT, "examples", "torch", "train_digits.py"),
                     "--model", "cnn", "--hidden", "256", "--lr", "0.02"], "epochs": 6,
            "min_compress_bytes": MIN_COMPRESS_BYTES,
            "label": "small CNN (`examples/torch/train_digits.py --model cnn`, conv 32-64, "
                     "FC 4096-256-10, SGD momentum 0.9)"},
}
TRAIN_CONFIG = (2, 2)


def core_kwargs(name: str) -> dict:
    """The kwargs of a throughput entry: ``"topk+ef"`` = top-k with ``ef_type=vanilla``."""
    base, _, ef = name.partition("+")
    kw = dict(COMPRESSORS[base])
    if ef:
        kw["ef_type"] = "vanilla"
    return kw


def _text_kwargs(kw: Mapping) -> dict:
    """kwargs as the core's string map (bools as ``true``/``false``)."""
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v)
            for k, v in kw.items()}


# ------------------------------------------------------------------------------------ plan --


def bench_settings(quick: bool, parts: Sequence[str] | None = None, **override) -> dict:
    """The plan. Quick (CI): a 4 MiB tensor on (2, 2) uncompressed and onebit, throughput on
    4 MiB, the CNN for 2 epochs. Full: 64 MiB on (2, 2) and (4, 4) with every compressor,
    throughput on 64 MiB and one 256 KiB partition, both models for their default epochs
    (about 10 minutes on 2 cores). Keyword arguments (not None) replace top-level fields."""
    plan = {
        "quick": quick,
        "parts": list(parts or ("cluster", "throughput", "training")),
        "configs": [list(c) for c in ((2, 2),) if quick] or [list(c) for c in CLUSTER_CONFIGS],
        "bandwidth_mbit": BANDWIDTH_MBIT,
        "bytes": (4 << 20) if quick else (64 << 20),
        "compressors": ["onebit"] if quick else list(COMPRESSORS),
        "iters": {"none": 1, "compressed": 2} if quick else {"none": 2, "compressed": 4},
        "warmup": 1,
        "link_seconds": 0.5 if quick else 2.0,
        "min_compress_bytes": MIN_COMPRESS_BYTES,
        "tp_bytes": (4 << 20) if quick else (64 << 20),
        "tp_partition_bytes": PARTITION_BYTES,
        "tp_seconds": 0.1 if quick else 0.5,
        "tp_entries": ["onebit", "fp16"] if quick else list(THROUGHPUT_ENTRIES),
        "probe_bytes": (64 << 20) if quick else (256 << 20),
        "probe_repeats": 3 if quick else 10,
        "train_config": list(TRAIN_CONFIG),
        "train_models": {m: {"epochs": 2 if quick else v["epochs"]}
                         for m, v in TRAIN_MODELS.items() if not quick or m == "cnn"},
        "train_compression": dict(TRAIN_COMPRESSION),
        "unavailable": bc.netns_unavailable(),
    }
    plan.update({k: v for k, v in override.items() if v is not None})
    return plan


def bench_steps(plan: dict) -> int:
    """Progress steps: per part, one per cluster build and one per job or compressor."""
    steps = 0
    netns = plan["unavailable"] is None
    if "cluster" in plan["parts"]:
        steps += len(plan["configs"]) * (2 + len(plan["compressors"])) if netns else 1
    if "throughput" in plan["parts"]:
        steps += 1 + len(plan["tp_entries"])
    if "training" in plan["parts"]:
        steps += 1 + 2 * len(plan["train_models"]) if netns else 1
    return steps


# --------------------------------------------------------------------------------- cluster --


def _timeout(n: int, nbytes: int, bandwidth_Bps: float, runs: int) -> float:
    return 60.0 + 4.0 * runs * 2 * max(n - 1, 1) * nbytes / bandwidth_Bps


class RoleCpu:
    """Samples, every ``interval`` s from a thread, the CPU seconds (``/proc/<pid>/stat``
    utime + stime) of every process of a cluster, grouped by ``DMLC_ROLE``."""

    def __init__(self, cluster: bc.EmulatedCluster, interval: float = 0.05) -> None:
        self.cluster, self.interval = cluster, interval
        self.samples: list[tuple[float, dict]] = []
        self._roles: dict[int, str | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _cpu(pid: int) -> float | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                v = f.read().rsplit(")", 1)[1].split()
            return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def _role(self, pid: int) -> str | None:
        if pid not in self._roles:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                self._roles[pid] = env.get(b"DMLC_ROLE", b"").decode() or None
            except OSError:
                return None
        return self._roles[pid]

    def _run(self) -> None:
        while not self._stop.is_set():
            now, snap = time.monotonic(), {}
            for p in self.cluster.processes():
                role, cpu = self._role(p.pid), self._cpu(p.pid)
                if role and cpu is not None:
                    snap[p.pid] = (role, cpu)
            self.samples.append((now, snap))
            self._stop.wait(self.interval)

    def __enter__(self) -> RoleCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def between(self, t0: float, t1: float) -> dict:
        """role -> CPU seconds of all its processes from the first to the last sample in
        [t0, t1] (``CLOCK_MONOTONIC``); {} with fewer than two samples there."""
        win = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(win) < 2:
            return {}
        out: dict = {}
        for pid, (role, c1) in win[-1][1].items():
            if pid in win[0][1]:
                out[role] = out.get(role, 0.0) + c1 - win[0][1][pid][1]
        return out


def _job_stats(st: bc.PushPullStats, reports: list, iters: int, roles: RoleCpu) -> dict:
    """A job's result: time, CPU busy, the mean bytes a worker host received and sent per
    push_pull (``None`` where the counters were unreadable), the mean CPU seconds of a worker
    process during its push_pull, and of all servers per push_pull (over the timed window)."""
    out = {"time_s": st.seconds, "cpu_busy": st.cpu_busy, "rx_bytes": None, "tx_bytes": None,
           "worker_cpu_s": None, "server_cpu_s": None}
    nets = [r.get("net") for r in reports]
    if nets and all(nets):
        out["rx_bytes"] = sum(x[0] for x in nets) / len(nets) / iters
        out["tx_bytes"] = sum(x[1] for x in nets) / len(nets) / iters
    cpus = [sum(r["cpu"]) for r in reports if r.get("cpu")]
    if cpus and len(cpus) == len(reports):
        out["worker_cpu_s"] = sum(cpus) / len(cpus) / iters
    t0, t1 = max(r["t_start"] for r in reports), min(r["t_end"] for r in reports)
    server = roles.between(t0, t1).get("server")
    if server is not None:
        out["server_cpu_s"] = server / iters
    return out


def run_cluster(plan: dict, progress: Callable[[str], None]) -> dict:
    """push_pull on the 100 Mbit/s cluster, uncompressed and per compressor; JSON-able rows
    (a failed job becomes ``{"error": ...}``)."""
    if plan["unavailable"]:
        progress("compression cluster: skipped")
        return {"skipped": plan["unavailable"]}
    B = plan["bandwidth_mbit"] * 1e6
    m, warm = plan["bytes"], plan["warmup"]
    env = {"BYTEPS_MIN_COMPRESS_BYTES": str(plan["min_compress_bytes"])}
    rows = []
    for n, k in plan["configs"]:
        progress(f"compression cluster n={n} k={k}: build + link")
        with bc.EmulatedCluster(n, k, B) as c:
            good = bc.table_goodput(c, plan["link_seconds"])
            row = {"n": n, "k": k, "bytes": m, "goodput_Bps": good,
                   "t_opt_s": bc.t_opt(n, k, m, good), "network": c.network_info(), "jobs": {}}
            for name in ["none", *plan["compressors"]]:
                iters = plan["iters"]["none" if name == "none" else "compressed"]
                progress(f"compression cluster n={n} k={k}: {name}")
                reports: list = []
                try:
                    with RoleCpu(c) as roles:
                        st = bc.run_pushpull(c, m, iters=iters, warmup=warm, env=env,
                                             timeout=_timeout(n, m, B / 8 * 0.9, iters + warm),
                                             compression=COMPRESSORS.get(name), reports=reports)
                    row["jobs"][name] = _job_stats(st, reports, iters, roles)
                except RuntimeError as exc:
                    log.warning("compression %s n=%d k=%d failed: %s", name, n, k, exc)
                    row["jobs"][name] = {"error": str(exc).splitlines()[0],
                                         "detail": str(exc)[-2000:]}
                log.info("n=%d k=%d %s: %s", n, k, name, row["jobs"][name])
            rows.append(row)
    return {"rows": rows}


# ------------------------------------------------------------------------------ throughput --


def compressor_throughput(kwargs: Mapping, nbytes: int, seconds: float) -> tuple:
    """(compress, decompress) GB/s of raw float32 input bytes, one thread, from the core's
    test hook ``byteps._core_testing.compressor_throughput`` on ``nbytes // 4`` elements.
    ImportError (recorded in the row by :func:`run_throughput`) where byteps was built without
    its test hooks (the CMake option BYTEPS_BUILD_TESTING)."""
    try:
        from byteps import _core_testing
    except ImportError as exc:
        raise ImportError("the throughput part needs byteps._core_testing, the core's test hooks: "
                          "build byteps with -C cmake.define.BYTEPS_BUILD_TESTING=ON (every nox "
                          "session does)") from exc
    c, d = _core_testing.compressor_throughput(_text_kwargs(kwargs), "float32", nbytes // 4,
                                               float(seconds))
    return float(c), float(d)


def run_throughput(plan: dict, progress: Callable[[str], None]) -> dict:
    """Compress/decompress GB/s per entry at the tensor and partition sizes, and the memory
    bandwidth probe (1 thread)."""
    from .sumbench import memory_bandwidth

    progress("compression throughput: memory bandwidth")
    out: dict = {"membw": memory_bandwidth(plan["probe_bytes"], plan["probe_repeats"], 1),
                 "rows": {}}
    sizes = sorted({plan["tp_bytes"], plan["tp_partition_bytes"]}, reverse=True)
    for name in plan["tp_entries"]:
        progress(f"compression throughput: {name}")
        row = {}
        for nbytes in sizes:
            try:
                c, d = compressor_throughput(core_kwargs(name), nbytes, plan["tp_seconds"])
                row[str(nbytes)] = {"compress": c, "decompress": d}
            except Exception as exc:  # a missing hook or a refused kwarg: recorded, not fatal
                log.warning("throughput %s %d B failed: %s", name, nbytes, exc)
                row[str(nbytes)] = {"error": f"{type(exc).__name__}: {exc}"}
        out["rows"][name] = row
    return out


# -------------------------------------------------------------------------------- training --

_ACC = re.compile(r"final test accuracy: (\d+(?:\.\d+)?)")
_STEP = re.compile(r"time per step: ([\d.]+) ms")


def train_argv(model: str, epochs: int, compression: Mapping | None) -> list:
    """The worker command of a training job."""
    argv = [sys.executable, *TRAIN_MODELS[model]["argv"], "--epochs", str(epochs)]
    if compression:
        argv += ["--compression-params", json.dumps(dict(compression))]
    return argv


def run_training(plan: dict, progress: Callable[[str], None]) -> dict:
    """Both models, uncompressed and with :data:`TRAIN_COMPRESSION`, on one cluster."""
    if plan["unavailable"]:
        progress("compression training: skipped")
        return {"skipped": plan["unavailable"]}
    n, k = plan["train_config"]
    B = plan["bandwidth_mbit"] * 1e6
    rows = []
    progress(f"compression training n={n} k={k}: build")
    with bc.EmulatedCluster(n, k, B) as c:
        network = c.network_info()
        for model, mp in plan["train_models"].items():
            env = {"BYTEPS_MIN_COMPRESS_BYTES": str(TRAIN_MODELS[model]["min_compress_bytes"]),
                   "OMP_NUM_THREADS": "1"}
            for variant in ("none", "onebit+ef"):
                progress(f"compression training: {model} {variant}")
                comp = plan["train_compression"] if variant != "none" else None
                row = {"model": model, "variant": variant, "epochs": mp["epochs"],
                       "min_compress_bytes": int(env["BYTEPS_MIN_COMPRESS_BYTES"])}
                t0 = time.monotonic()
                res = bc.run_byteps_job(c, train_argv(model, mp["epochs"], comp), env=env,
                                        timeout=600.0)
                row["job_s"] = time.monotonic() - t0
                out0 = "\n".join(res.lines("worker 0"))
                acc, step = _ACC.search(out0), _STEP.search(out0)
                if res.ok and acc and step:
                    row.update(accuracy=float(acc.group(1)), step_s=float(step.group(1)) / 1e3)
                else:
                    tail = "\n".join(res.output.splitlines()[-20:])
                    row["error"] = (f"exit codes {res.returncodes}" if not res.ok
                                    else "no accuracy / step time printed")
                    row["detail"] = tail
                    log.warning("training %s %s failed: %s\n%s", model, variant, row["error"],
                                tail)
                log.info("training: %s", {k: v for k, v in row.items() if k != "detail"})
                rows.append(row)
    return {"rows": rows, "network": network}


# ------------------------------------------------------------------------------ the bench --


def bench_run(plan: dict, progress: Callable[[str], None] = lambda label: None) -> dict:
    """Measure the parts of the plan; JSON-able results."""
    from .report import machine

    if plan["unavailable"] is None and \
            threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        bc.install_signal_cleanup()
    info = machine()
    res = {"plan": plan, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "commit": info.get("commit"), "dirty": _dirty()}
    t0 = time.monotonic()
    runners = {"cluster": run_cluster, "throughput": run_throughput, "training": run_training}
    for part in plan["parts"]:
        res[part] = runners[part](plan, progress)
    res["elapsed_s"] = time.monotonic() - t0
    return res


def _dirty() -> bool | None:
    """Whether the core's sources differ from the commit (others' work in progress)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", "core"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.strip())


def bench_markdown(res: dict, img_dir: str | None = None, img_rel: str = "img"):
    """The section and its targets (:func:`benchmarks.compression_report.markdown`)."""
    from .compression_report import markdown

    return markdown(res, img_dir, img_rel)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.compression``: measure and print the section."""
    from .report import run_standalone

    p = argparse.ArgumentParser(prog="python -m benchmarks.compression", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the CI smoke plan (about 2 minutes)")
    p.add_argument("--parts", help="comma-separated: cluster, throughput, training")
    p.add_argument("--sizes-mib", type=float, help="cluster and throughput tensor size, MiB")
    p.add_argument("--compressors", help=f"comma-separated, of {', '.join(COMPRESSORS)}")
    p.add_argument("--configs", nargs="+", metavar="N,K", help="cluster (n,k) pairs")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args(argv)
    size = int(args.sizes_mib * 2**20) if args.sizes_mib else None
    plan = bench_settings(
        args.quick, args.parts.split(",") if args.parts else None, bytes=size, tp_bytes=size,
        compressors=args.compressors.split(",") if args.compressors else None,
        configs=[[int(v) for v in c.split(",")] for c in args.configs] if args.configs else None)
    return run_standalone(plan, bench_run, bench_markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
