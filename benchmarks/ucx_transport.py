"""The UCX transport alone (core/cpp/comm/ucx): time of one large frame between two UCX contexts
of one process, per ``UCX_TLS``.

    python -m benchmarks.ucx_transport [--tls tcp,shm] [--size 64M] [--iters 5] [--json FILE]

UCX reads ``UCX_TLS`` when a context is created, so each transport list is measured in a child
process of its own (``--worker``, started through :mod:`benchmarks.runner`). There two
``UcxTestPeer``s (``byteps._core_testing``, the transport without a van) connect by exchanging
worker addresses; a staged, registered ``size``-byte buffer is sent ``1 + iters`` times into a
registered receiver buffer. Each time runs from the send to the receiver's ``OnFrame`` (both
clocks of this one process); the first send, which pays registration and connection set-up,
is left out. Printed per transport list: median and best time, the median's GB/s (10^9 bytes
per second) and how many frames went by rendezvous. It measures and asserts nothing
(``tests/test_ucx_transport.py`` checks the transport; ``tests/bench`` runs this once, small).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence

from . import child_env, runner
from .micro import fmt_size, parse_size

#: UCX_TLS values of a default run: UCX's TCP transport, and shared memory (posix/sysv with
#: cma, whatever UCX finds here).
TLS = ("tcp", "shm")
SIZE = 64 << 20
ITERS = 5
PUSH = 21  # the frame type the transport tests send (a push)


def ucx_missing() -> str | None:
    """Why the UCX transport cannot be measured here, or None."""
    try:
        from byteps import _core_testing
    except ImportError as exc:
        return (f"the core's test hooks are not built ({exc}; build with "
                f"BYTEPS_BUILD_TESTING=ON, as the nox sessions do)")
    if not _core_testing.ucx_available:
        return "this build has no UCX transport (pkg-config found no ucx at build time)"
    return None


def measure(size: int = SIZE, iters: int = ITERS) -> dict:
    """In this process (its ``UCX_TLS`` as set): ``1 + iters`` frames of ``size`` bytes from
    one ``UcxTestPeer`` to another. Returns ``size`` (bytes), ``times`` (s, the first send
    left out), ``median_s``, ``min_s``, ``rndv`` (frames received by rendezvous, all sends),
    ``lanes`` and ``config`` (UCX's summary of the link and of its configuration)."""
    import numpy as np

    from byteps import _core_testing

    peer = _core_testing.UcxTestPeer
    a, b = peer("bench-a"), peer("bench-b")
    try:
        la = a.connect(b.address, timeout=20, name="bench-b")
        lb = b.accept(timeout=20)
        data = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8).tobytes()
        sid = a.stage(data, register=True)
        b.prepare(1, size, register=True)
        times = []
        for _ in range(1 + iters):
            a.send(la, 1, PUSH, staged=sid)
            t0 = a.wait_sent(1, 60)[0][3]
            rx = b.recv(60)
            times.append(rx["t"] - t0)
        times = times[1:]
        return {"size": size, "times": times, "median_s": statistics.median(times),
                "min_s": min(times), "rndv": b.stats(lb)["rndv_received"],
                "lanes": a.describe(la), "config": a.config_summary}
    finally:
        a.shutdown()
        b.shutdown()


def run_tls(tls: str, size: int = SIZE, iters: int = ITERS, timeout: float = 240.0) -> dict:
    """:func:`measure` in a child process whose ``UCX_TLS`` is ``tls``; its result.

    Raises:
        RuntimeError: the child failed or printed no result (the message has its output's
            tail); runner.JobTimeout: it ran past ``timeout`` seconds (it was killed).
    """
    argv = [sys.executable, "-m", "benchmarks.ucx_transport", "--worker", "--size", str(size),
            "--iters", str(iters)]
    res = runner.run(argv, env=child_env({**os.environ, "UCX_TLS": tls}), timeout=timeout,
                     label=f"UCX transport benchmark, UCX_TLS={tls}")
    found = [ln for ln in res.output.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not found:
        raise RuntimeError(f"UCX transport benchmark with UCX_TLS={tls}: exit status "
                           f"{res.returncode}\n{res.output[-4000:]}")
    return json.loads(found[-1][len("RESULT "):])


def line(tls: str, r: dict) -> str:
    """One transport list's result as a sentence."""
    gbs = r["size"] / r["median_s"] / 1e9
    return (f"UCX_TLS={tls}: {fmt_size(r['size'])} in {r['median_s'] * 1e3:.2f} ms median "
            f"({gbs:.2f} GB/s, best {r['min_s'] * 1e3:.2f} ms, {len(r['times'])} timed), "
            f"rendezvous frames {r['rndv']}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.ucx_transport``: see ``--help``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.ucx_transport", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tls", default=",".join(TLS),
                   help=f"comma-separated UCX_TLS values, one run each (default {','.join(TLS)})")
    p.add_argument("--size", default="64M",
                   help="frame size, e.g. 1M, 64M (default 64M)")
    p.add_argument("--iters", type=int, default=ITERS,
                   help=f"timed frames after the first (default {ITERS})")
    p.add_argument("--json", help="also write the results here ({UCX_TLS: result})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    size = parse_size(args.size)
    if args.iters < 1 or size < 1:
        p.error("--iters and --size must be positive")
    if args.worker:
        print("RESULT " + json.dumps(measure(size, args.iters)), flush=True)
        return 0
    why = ucx_missing()
    if why:
        print(f"python -m benchmarks.ucx_transport: {why}", file=sys.stderr)
        return 2
    results = {}
    for tls in [t for t in args.tls.split(",") if t]:
        results[tls] = run_tls(tls, size, args.iters)
        print(line(tls, results[tls]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
