"""push_pull next to torch.distributed gloo all_reduce (thin wrapper of ``byteps.bench.micro``).

The measurement lives in the ``byteps-bench`` package now (``byteps-bench --only micro`` writes
it into docs/performance.md). This script keeps the foundation issue's command line:

    python benchmarks/pushpull_vs_gloo.py --workers 2 --servers 1 --sizes 4K 64M
    python benchmarks/pushpull_vs_gloo.py --workers 1 --local-size 2 --sizes 4K 64M

``--workers 2 --servers 1`` runs the forced-distributed job, ``--workers 1 --local-size 2`` the
local (shared-memory) one; both next to gloo with two processes and raw TCP. Any other option
is passed to ``python -m byteps.bench.micro`` (see its ``--help``).
"""

from __future__ import annotations

import argparse

from byteps.bench import micro


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="worker machines: 2 or 1 (default 2)")
    p.add_argument("--servers", type=int, default=1, help="servers (only 1 is measured)")
    p.add_argument("--local-size", type=int, default=1, help="processes per machine")
    args, rest = p.parse_known_args()
    if args.workers * args.local_size != micro.WORLD or args.servers != 1:
        p.error(f"byteps.bench.micro measures {micro.WORLD} worker processes: "
                "--workers 2 --servers 1, or --workers 1 --local-size 2")
    job = "dist" if args.workers > 1 else "local"
    micro.main(["--jobs", f"{job},gloo,tcp", "--repeats", "1", *rest])


if __name__ == "__main__":
    main()
