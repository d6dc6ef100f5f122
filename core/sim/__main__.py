"""``python -m byteps.sim``: the what-if simulator's command line.

    python -m byteps.sim whatif --profile resnet50 --machines 16 --gpus-per-machine 8 \\
        --bandwidth 100Gbps --cpu-machines 4
    python -m byteps.sim run --profile my.json --machines 4 --scheme ring
    python -m byteps.sim models            # the model table (ideal communication at 100 GbE)
    python -m byteps.sim scaling --profile vgg16 resnet50 --bandwidth 25Gbps 100Gbps \\
        --plot scaling.png
    python -m byteps.sim profile resnet50 --out resnet50.json   # write a profile as JSON

``--profile``: a shipped name (resnet50, vgg16, transformer, bert_base, bert_large, e2e_cnn)
or a JSON file (format: ``byteps.sim.profiles``, docs/simulator.md). The comparison with the
emulated cluster's recorded times is the benchmark lab's: ``python -m benchmarks.sim_compare``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from . import profiles, report
from .simulate import (
    METHODS,
    SCHEME_NAMES,
    SCHEMES,
    SYMMETRIC_FROM,
    Cluster,
    Scheme,
    parse_rate,
    simulate,
)


def _cluster_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    nargs = "+" if many else None
    p.add_argument("--profile", default=["resnet50"] if many else "resnet50", nargs=nargs,
                   help="shipped profile name or JSON file (default resnet50)")
    p.add_argument("--tflops", type=float, default=profiles.DEFAULT_TFLOPS,
                   help="shipped profiles: sustained TFLOP/s per GPU for their compute")
    if not many:
        p.add_argument("--machines", "-n", type=int, default=4, help="worker machines")
        p.add_argument("--cpu-machines", "-k", type=int, default=0,
                       help="CPU machines (servers)")
    p.add_argument("--gpus-per-machine", type=int, default=1)
    p.add_argument("--bandwidth", default=["100Gbps"] if many else "100Gbps", nargs=nargs,
                   help="NIC rate per direction, e.g. 100Gbps, 800Mbit/s, 12.5GB/s")
    p.add_argument("--method", choices=METHODS, default="auto",
                   help="byteps: 'full' (every worker, message by message), 'symmetric' (one "
                   "representative worker) or 'auto' (symmetric from "
                   f"{SYMMETRIC_FROM} machines)")
    p.add_argument("--latency-us", type=float, default=20.0, help="per message, one way")
    p.add_argument("--gpu-bus", default="12GB/s", help="local reduce bandwidth (PCIe/NVLink)")
    p.add_argument("--local-bandwidth", default="4.56GB/s",
                   help="a worker's traffic to the server on its own machine (loopback; "
                   "default: measured on this repository's machine)")
    p.add_argument("--sum-rate", default="37.1GB/s", help="γ: summation per server thread")
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--partition-bytes", type=int, default=262144)
    p.add_argument("--credit", type=int, default=None,
                   help="a fixed credit in partitions (0 = unlimited); default: the core's "
                   "adaptive window, from 4")


def _cluster(a: argparse.Namespace) -> Cluster:
    return Cluster(a.machines, a.cpu_machines, a.gpus_per_machine, parse_rate(a.bandwidth),
                   a.latency_us * 1e-6, local_bandwidth=parse_rate(a.local_bandwidth),
                   gpu_bus_bandwidth=parse_rate(a.gpu_bus),
                   sum_rate=parse_rate(a.sum_rate), server_threads=a.server_threads)


def _profile(a: argparse.Namespace, name: Optional[str] = None) -> profiles.Profile:
    name = name or a.profile
    if name in profiles.shipped():
        return profiles.from_architecture(name, tflops=a.tflops)
    return profiles.load(name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m byteps.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="one configuration: iteration time, efficiency, bound")
    _cluster_args(p)
    p.add_argument("--scheme", choices=SCHEMES, default="byteps")
    p.add_argument("--fifo", action="store_true", help="FIFO instead of priority + credit")
    p.add_argument("--compression", type=float, default=1.0, help="ratio (PS schemes)")
    p.add_argument("--bucket-mib", type=float, default=25.0, help="all-reduce bucket")
    p.add_argument("--tree-width", type=int, default=1)
    p.add_argument("--hips-group", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p = sub.add_parser("whatif", help="BytePS / all-reduce / compression on one cluster")
    _cluster_args(p)
    p.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0, 8.0],
                   help="compression ratios to try")
    p = sub.add_parser("scaling", help="BytePS vs all-reduce vs native PS, 8 to 256 GPUs")
    _cluster_args(p, many=True)
    # one model for every point of a curve (auto would switch at 16 machines)
    p.set_defaults(gpus_per_machine=8, partition_bytes=4 << 20, method="symmetric")
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--plot", help="write the efficiency plot here (PNG; needs matplotlib)")
    p = sub.add_parser("models", help="the model table: parameters, compute, ideal comm.")
    p.add_argument("--tflops", type=float, default=profiles.DEFAULT_TFLOPS)
    p = sub.add_parser("profile", help="write a shipped profile as JSON")
    p.add_argument("name", choices=profiles.shipped())
    p.add_argument("--tflops", type=float, default=profiles.DEFAULT_TFLOPS)
    p.add_argument("--out", help="file (default: stdout)")
    a = ap.parse_args(argv)

    if a.cmd == "run":
        sch = Scheme(a.scheme, partition_bytes=a.partition_bytes,
                     credit=4 if a.credit is None else a.credit,
                     adaptive_credit=a.credit is None,
                     compression=a.compression, bucket_bytes=int(a.bucket_mib * (1 << 20)),
                     tree_width=a.tree_width, hips_group=a.hips_group)
        res = simulate(_profile(a), _cluster(a), sch.fifo() if a.fifo else sch,
                       method=a.method if a.scheme == "byteps" else "auto")
        if a.json:
            print(json.dumps({"iteration_s": res.iteration_s, "compute_s": res.compute_s,
                              "efficiency": res.efficiency, "bound": res.bound,
                              "utilisation": res.utilisation()}, indent=1))
        else:
            print(f"{SCHEME_NAMES[a.scheme]}: iteration {res.iteration_s * 1e3:.2f} ms, compute "
                  f"{res.compute_s * 1e3:.2f} ms, scaling efficiency {res.efficiency:.3f}, "
                  f"bound by {res.bound}")
            for k, v in sorted(res.utilisation().items(), key=lambda kv: -kv[1])[:8]:
                print(f"  {k:32s} {100 * v:5.1f} % busy")
    elif a.cmd == "whatif":
        prof, cl = _profile(a), _cluster(a)
        print(f"{prof.name}: {prof.nbytes / 1e6:.1f} MB of gradients, compute "
              f"{prof.compute_s * 1e3:.1f} ms; {cl.machines} machines x "
              f"{cl.gpus_per_machine} GPUs, {cl.bandwidth * 8 / 1e9:g} Gbit/s\n")
        print(report.whatif_markdown(report.whatif(
            prof, cl, a.ratios, a.partition_bytes, 4 if a.credit is None else a.credit,
            a.method, adaptive_credit=a.credit is None)))
        if a.method == "symmetric" or (a.method == "auto" and cl.machines >= SYMMETRIC_FROM):
            print("\nBytePS rows: the symmetric model (one representative worker); it can be "
                  "optimistic where the workers push in key order (docs/simulator.md): check "
                  "one row with `run --method full`.")
    elif a.cmd == "scaling":
        panels = []
        for name in a.profile:
            prof = _profile(a, name)
            for bw in a.bandwidth:
                rows = report.scaling(prof, a.gpus, a.gpus_per_machine, parse_rate(bw),
                                      a.partition_bytes, 4 if a.credit is None else a.credit,
                                      a.method, adaptive_credit=a.credit is None,
                                      latency=a.latency_us * 1e-6,
                                      local_bandwidth=parse_rate(a.local_bandwidth),
                                      gpu_bus_bandwidth=parse_rate(a.gpu_bus),
                                      sum_rate=parse_rate(a.sum_rate),
                                      server_threads=a.server_threads)
                title = (f"{prof.name}, {bw} (compute {prof.compute_s * 1e3:.1f} ms, "
                         f"{prof.nbytes / 1e6:.1f} MB of gradients)")
                print(f"{title}:\n")
                print(report.scaling_markdown(rows) + "\n")
                panels.append((title, rows))
        if a.plot:
            print(f"wrote {report.plot_scaling_grid(panels, a.plot)}")
    elif a.cmd == "models":
        print(report.model_markdown(report.model_table(a.tflops)))
    elif a.cmd == "profile":
        doc = json.dumps(profiles.from_architecture(a.name, tflops=a.tflops).to_json(), indent=1)
        if a.out:
            with open(a.out, "w") as f:
                f.write(doc)
        else:
            print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
