"""The benchmark lab of byteps: development tooling, not part of the installed package.

Run from the repository root (byteps itself installed, or on ``PYTHONPATH``)::

    python -m benchmarks [--quick] [--out docs/performance.md] [--only micro,sum]

writes ``docs/performance.md`` and its plots (:mod:`benchmarks.cli`). The parts run alone too:

* ``python -m benchmarks.micro``    push_pull vs gloo all_reduce vs raw TCP on loopback;
* ``python -m benchmarks.sumbench`` the summation kernels vs NumPy and memory bandwidth;
* ``python -m benchmarks.table1``   the BytePS paper's Table 1 on an emulated cluster;
* ``python -m benchmarks.sched``    scheduling on a training-shaped workload (emulated cluster);
* ``python -m benchmarks.compression``  gradient compressors: push_pull on a 100 Mbit/s
  emulated cluster, compress/decompress throughput, training with and without compression;
* ``python -m benchmarks.e2e``      real training (a small ResNet-like CNN) with byteps
  DistributedOptimizer, DistributedDataParallel and CrossBarrier against torch DDP (gloo) on
  the emulated cluster, and the timeline of one traced iteration;
* ``python -m benchmarks.cluster --probe``  which link bandwidth keeps the cluster network-bound;
* ``python -m benchmarks.ucx_transport``  the UCX transport alone (no van): one 64 MiB frame
  between two UCX contexts, per ``UCX_TLS``.

Every process the lab starts goes through :mod:`benchmarks.runner`, the job runner it shares
with the tests (``tests/jobs.py`` builds on it).

The emulated cluster (:mod:`benchmarks.netns`: network namespaces, veth, a bridge, ``tc``) needs
root and iproute2. Every process the lab starts gets the repository root on ``PYTHONPATH``
(:func:`child_env`), so its workers (``python -m benchmarks.<module> --worker ...``) import this
package from any working directory and any network namespace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: The repository root: the directory that holds this package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) as a new dict with :data:`ROOT` first on
    ``PYTHONPATH``, for a child process that runs ``python -m benchmarks.<module>``."""
    out = dict(os.environ if env is None else env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
    out["PYTHONPATH"] = os.pathsep.join([ROOT, *parts])
    return out
