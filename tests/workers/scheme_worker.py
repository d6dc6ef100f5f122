"""Worker script of tests/test_schemes.py: ``python scheme_worker.py MODE``, under
``python -m byteps.launch``.

Modes:

* ``mixed``: one job, tensors declared with every scheme (``sync`` of
  ``byteps.basics.declare``: ps, ring, tree, hips; the rest take ``BYTEPS_SYNC``; the job needs
  the servers of HiPS and the worker mesh of ring or tree), summed and averaged
  over three rounds of changing integer-valued data, one of them cut in several partitions;
  then a tensor whose scheme differs between ranks (``MismatchError`` on every rank), and a
  scheme given after the name's first push_pull (``InvalidArgumentError``); the job stays
  usable.

* ``early``: worker machine 0 push_pulls "t" once and shuts down; the others push_pull it
  twice: their second one must fail with ``PeerLostError`` saying machine 0 shut down, within
  10 s (``BYTEPS_TIMEOUT`` is 60), printing ``EARLY-CAUGHT <seconds> <message>``.

* ``auto``: ``BYTEPS_SYNC=auto`` with a stand-in cost model (``byteps.sync.cost_model`` put in
  ``sys.modules`` before ``init()``: ring from 4 KiB, tree from 64 KiB, ps below): every tensor
  sums exactly and is declared with the scheme the model chose, except a tensor the core
  compresses, which only the summation service carries: ``ps``.

* ``auto-model``: ``BYTEPS_SYNC=auto`` with the real cost model (measured through the job at
  the first push_pull, its own tensors on the summation service): every tensor sums exactly,
  is declared with ``byteps.cost_model.choose(nbytes)``, and every rank prints the same
  ``CHOICES`` line.

Prints ``FAIL <message>`` and exits 1 on a failure, ``OK <n> cases`` at the end.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import byteps.basics as bps
from byteps import errors


def log(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str) -> None:
    log(f"FAIL rank {bps.rank()}: {msg}")
    sys.exit(1)


def values(rank: int, salt: int, n: int) -> np.ndarray:
    """Integer-valued data of `rank` (exact in every float dtype used here)."""
    return ((np.arange(n) * 7 + rank * 13 + salt * 5) % 19 - 9).astype(np.float64)


def check(name: str, dtype: str, n: int, salt: int, average: bool) -> None:
    size, rank = bps.size(), bps.rank()
    inp = values(rank, salt, n).astype(dtype)
    out = np.empty_like(inp)
    h = bps.push_pull_async(name, inp.ctypes.data, out.ctypes.data, inp.nbytes, dtype,
                            (n,), average)
    bps.wait(h, 60)
    want = sum(values(r, salt, n) for r in range(size))
    want = (want / size if np.dtype(dtype).kind == "f" else want // size) if average else want
    if not np.array_equal(out, want.astype(dtype)):
        bad = np.flatnonzero(out != want.astype(dtype))[:5]
        fail(f"{name} {dtype} round {salt}: got {out[bad]} at {bad}, want "
             f"{want.astype(dtype)[bad]}")


def mode_mixed() -> int:
    cases = 0
    plan = [("t.ps", "ps"), ("t.ring", "ring"), ("t.tree", "tree"), ("t.hips", "hips"),
            ("t.default", None)]
    for name, sync in plan:
        bps.declare(name, sync=sync)
    for rnd in range(3):
        for name, _ in plan:
            for dtype, n, average in (("float32", 1000, False), ("int32", 77, True)):
                check(f"{name}.{dtype}", dtype, n, rnd, average)
                cases += 1
            # 1.5 MB: several partitions at the job's 256 KiB bound
            check(f"{name}.big", "float64", 196_613, rnd, rnd == 1)
            cases += 1
    # A scheme that differs between worker machines: MismatchError on every rank.
    machine = bps.rank() // bps.local_size()
    bps.declare("t.mismatch", sync="ring" if machine % 2 == 0 else "tree")
    try:
        check("t.mismatch", "float32", 10, 0, False)
        fail("t.mismatch: a scheme differing between ranks was accepted")
    except errors.MismatchError as exc:
        if "synchronized differently" not in str(exc):
            fail(f"t.mismatch: MismatchError does not name the scheme: {exc}")
        log(f"MISMATCH-CAUGHT {exc}")
        cases += 1
    # A scheme after the first push_pull.
    try:
        bps.declare("t.ps", sync="ring")
        fail("declaring another scheme after the first push_pull was accepted")
    except errors.InvalidArgumentError:
        cases += 1
    check("t.after", "float32", 33, 9, True)  # the job is still usable
    return cases + 1


def mode_early() -> int:
    check("t", "float32", 100_000, 0, False)
    if bps.rank() // bps.local_size() == 0:
        return 1
    start = time.monotonic()
    try:
        check("t", "float32", 100_000, 1, False)
        fail("the second push_pull succeeded without machine 0")
    except errors.PeerLostError as exc:
        secs = time.monotonic() - start
        if secs > 10 or "shut down" not in str(exc):
            fail(f"PeerLostError after {secs:.1f} s: {exc}")
        log(f"EARLY-CAUGHT {secs:.2f} {exc}")
    return 1


def stand_in_choose(nbytes: int) -> str:
    return "tree" if nbytes >= 65536 else "ring" if nbytes >= 4096 else "ps"


def mode_auto() -> int:
    cases = 0
    # Declared with a compressor (fp16: exact for these integer values and their averages):
    # 200 000 bytes are compressed (BYTEPS_MIN_COMPRESS_BYTES 65536), so the summation service
    # is the only scheme that can carry it, whatever the model says (tree); 8 000 bytes are
    # not, and take the model's choice (ring).
    compressed = {"auto.c.50000": "ps", "auto.c.2000": "ring"}
    for name in compressed:
        bps.declare(name, compression={"compressor_type": "fp16"})
    for rnd in range(2):
        for n in (10, 2000, 50_000):
            check(f"auto.{n}", "float32", n, rnd, rnd == 1)
            want = stand_in_choose(n * 4)
            if bps._sync_of.get(f"auto.{n}") != want:
                fail(f"auto.{n}: declared {bps._sync_of.get(f'auto.{n}')}, the model chose {want}")
            cases += 1
        for name, want in compressed.items():
            check(name, "float32", int(name.rsplit(".", 1)[1]), rnd, rnd == 1)
            if bps._sync_of.get(name) != want:
                fail(f"{name}: declared {bps._sync_of.get(name)} under auto, want {want}")
            cases += 1
    return cases


def mode_auto_model() -> int:
    from byteps import cost_model

    cases, sizes = 0, (10, 2000, 50_000, 600_000)
    for rnd in range(2):
        for n in sizes:
            check(f"auto.{n}", "float32", n, rnd, rnd == 1)
            want = cost_model.choose(n * 4)
            if bps._sync_of.get(f"auto.{n}") != want:
                fail(f"auto.{n}: declared {bps._sync_of.get(f'auto.{n}')}, the model chose {want}")
            cases += 1
    model = cost_model()
    log("CHOICES " + " ".join(f"{n * 4}:{model.choose(n * 4)}" for n in sizes)
        + f" alpha={model.alpha:.6g} beta={model.beta:.6g} gamma={model.gamma:.6g}")
    return cases


def main() -> int:
    mode = sys.argv[1]
    if mode == "auto":
        import types
        model = types.ModuleType("byteps.sync.cost_model")
        model.choose = stand_in_choose
        sys.modules["byteps.sync.cost_model"] = model
    bps.init()
    log(f"START mode={mode} rank={bps.rank()} pid={os.getpid()}")
    n = {"mixed": mode_mixed, "early": mode_early, "auto": mode_auto,
         "auto-model": mode_auto_model}[mode]()
    bps.shutdown()
    log(f"OK {n} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
