"""Worker script of tests/test_distributed.py: ``python bps_worker.py MODE [ARGS...]``.

Run under ``python -m byteps.launch``. Every rank computes its own input as a deterministic,
integer-valued function of (rank, case, round) and the expected result as the NumPy sum of the
inputs of all ranks, so every comparison of a sum is exact. On any failure the worker prints
``FAIL <message>`` and exits 1; on success it prints ``OK <n> cases`` as its last line.

Modes (see main()): correctness, partitions, fastslow, inflight, overlap, declare, mismatch,
loop (runs until a peer is lost; used by the kill tests), timeout, shm, orphan, soak.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

import numpy as np

import byteps.basics as bps
from byteps import errors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: oracle.py
from oracle import expected_push_pull, expected_sum

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")
SHAPES = ((0,), (1,), (17,), (3, 5, 7), (1000, 33))
INT_DTYPES = ("int8", "uint8", "int32", "int64")


def log(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str) -> None:
    log(f"FAIL rank {RANK}: {msg}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


RANK = -1

# --------------------------------------------------------------------------------- bfloat16 --


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even (no NaNs in these tests)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def np_dtype(dtype: str):
    return np.uint16 if dtype == "bfloat16" else np.dtype(dtype)


# ------------------------------------------------------------------------------------ data --


def _period(dtype: str) -> int:
    """The modulus of :func:`values` for ``dtype``: its values repeat along the tensor with
    this period (``i * 7`` modulo it)."""
    return {"uint8": 21, "int8": 25, "float16": 41, "bfloat16": 41}.get(dtype, 2001)


def values(case: int, rank: int, n: int, dtype: str, rnd: int = 0) -> np.ndarray:
    """Integer values (as int64) for one rank: small enough that the sum over <= 8 ranks fits
    every dtype exactly (int8: |v| <= 12; uint8: 0..20), negative values included for signed
    dtypes so floor division of the average is exercised. Element i depends on i only through
    ``i * 7`` modulo :func:`_period`, so one period is computed and repeated (the oracle of a
    64 MiB tensor over 4 ranks otherwise costs seconds of every rank's CPU)."""
    m = _period(dtype)
    i = np.arange(min(n, m), dtype=np.int64)
    base = (i * 7 + rank * 13 + case * 5 + rnd * 3) % m
    # centred on 0 for the signed dtypes: int8 -12..12, float16/bfloat16 -20..20, else -1000..
    one = base - {"uint8": 0, "int8": 12, "float16": 20, "bfloat16": 20}.get(dtype, 1000 - rnd)
    return np.resize(one, n) if n > one.size else one


def make(vals: np.ndarray, dtype: str, shape) -> np.ndarray:
    if dtype == "bfloat16":
        arr = f32_to_bf16_bits(vals.astype(np.float32))
    else:
        arr = vals.astype(np_dtype(dtype))
    return np.ascontiguousarray(arr.reshape(shape))


def expected(case: int, n: int, dtype: str, shape, size: int, average: bool, rnd: int = 0):
    """The oracle's result for the inputs :func:`values` of every rank, in ``dtype``'s
    storage (bfloat16: bits); a floating average is the exact quotient rounded to float32
    first for float16/bfloat16/float32 (the inputs' sums are small integers, so this equals the
    float32 division of the sum)."""
    k = min(n, _period(dtype))  # element-wise: one period, repeated (see values)
    want = expected_push_pull(lambda r: values(case, r, k, dtype, rnd), size, average, dtype)
    if dtype in INT_DTYPES:
        one = want.astype(np_dtype(dtype))
    else:
        f = want.astype(np.float64 if dtype == "float64" else np.float32)
        one = f32_to_bf16_bits(f) if dtype == "bfloat16" else f.astype(np_dtype(dtype))
    return (np.resize(one, n) if n > k else one).reshape(shape)


def compare(what: str, got: np.ndarray, want: np.ndarray, dtype: str, average: bool) -> None:
    """Sums and integer averages must be bit-exact; averages of floats may differ by one unit
    in the last place (x/n vs x*(1/n))."""
    if got.shape != want.shape or got.dtype != want.dtype:
        fail(f"{what}: result {got.dtype}{got.shape} != expected {want.dtype}{want.shape}")
    if got.size == 0:
        return
    if dtype == "bfloat16":
        g, w = bf16_bits_to_f32(got).astype(np.float64), bf16_bits_to_f32(want).astype(np.float64)
        eps = 2.0 ** -7
    elif dtype in INT_DTYPES:
        g, w = got.astype(np.int64), want.astype(np.int64)
        eps = 0.0
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        eps = float(np.finfo(np_dtype(dtype)).eps)
    if average and eps:
        bad = np.abs(g - w) > eps * np.abs(w)
    else:
        bad = g != w
    bad = np.flatnonzero(bad.ravel())
    if bad.size:
        j = int(bad[0])
        fail(f"{what}: {bad.size} of {got.size} elements differ; first at flat index {j}: "
             f"got {g.ravel()[j]!r}, expected {w.ravel()[j]!r}")


def push_pull(name, inp, out, dtype, average, priority=None):
    return bps.push_pull_async(name, inp.ctypes.data, out.ctypes.data, inp.nbytes, dtype,
                               inp.shape, average, priority)


def run_case(name: str, case: int, dtype: str, shape, average: bool, inplace: bool,
             rnd: int = 0) -> None:
    n = int(np.prod(shape))
    size = bps.size()
    inp = make(values(case, RANK, n, dtype, rnd), dtype, shape)
    orig = inp.copy()
    out = inp if inplace else np.full_like(inp, 0x55 if inp.dtype.itemsize == 1 else 77)
    h = push_pull(name, inp, out, dtype, average)
    bps.wait(h)
    what = f"{name} (dtype={dtype} shape={shape} average={average} inplace={inplace} round={rnd})"
    compare(what, out, expected(case, n, dtype, shape, size, average, rnd), dtype, average)
    if not inplace and not np.array_equal(inp, orig):
        fail(f"{what}: the input buffer was modified by an out-of-place push_pull")


# ----------------------------------------------------------------------------------- modes --


def mode_correctness(args) -> int:
    big = "--no-big" not in args
    count = 0
    case = 0
    for dtype in DTYPES:
        for shape in SHAPES:
            for average in (False, True):
                for inplace in (True, False):
                    case += 1
                    name = f"c{case}.{dtype}.{'x'.join(map(str, shape))}.{int(average)}{int(inplace)}"
                    run_case(name, case, dtype, shape, average, inplace)
                    count += 1
    # Reuse of a name with new data (second round of the same tensors).
    for dtype in DTYPES:
        case += 1
        run_case(f"c1.{dtype}.again", case, dtype, (17,), False, True)
        run_case(f"c1.{dtype}.again", case, dtype, (17,), False, True, rnd=1)
        count += 2
    if big:
        n = 16 * 1024 * 1024  # 64 MiB of float32
        case += 1
        run_case("big.f32.sum.inplace", case, "float32", (n,), False, True)
        case += 1
        run_case("big.f32.avg.outofplace", case, "float32", (n,), True, False)
        # Over reduce::kStreamingMinBytes (8 MiB), odd lengths: the outputs are written with
        # streaming stores, and distributed pulls are averaged on the way in (PullSink).
        case += 1
        run_case("big.f16.avg.inplace", case, "float16", (4_500_001,), True, True)
        case += 1
        run_case("big.i32.avg.outofplace", case, "int32", (2_300_003,), True, False)
        count += 4
    return count


def mode_partitions(args) -> int:
    """ARGS: rounds (4), megabytes per tensor (5)."""
    rounds = int(args[0]) if args else 4
    megabytes = float(args[1]) if len(args) > 1 else 5.0
    n = int(megabytes * 1000 * 1000) // 4  # ~5 MB of float32
    count = 0
    for dtype in ("float32", "int32"):
        for rnd in range(rounds):
            run_case(f"part.{dtype}", 900 + (dtype == "int32"), dtype, (n,), False, rnd % 2 == 0,
                     rnd=rnd)
            count += 1
    # average over the partitioned path, float64 (~5 MB)
    run_case("part.f64.avg", 950, "float64", (n // 2,), True, False)
    return count + 1


def mode_fastslow(args) -> int:
    rounds = int(args[0]) if args else 200
    slow = int(args[1]) if len(args) > 1 else 0
    rng = random.Random(1234 + RANK)
    n = 3000
    count = 0
    for rnd in range(rounds):
        if RANK == slow:
            time.sleep(rng.uniform(0.0005, 0.006))
        run_case("fastslow", 777, "int32", (n,), False, rnd % 3 != 0, rnd=rnd)
        count += 1
    return count


def duplicate_in_flight() -> int:
    """At most one operation per name may be in flight: a second push_pull of a name whose
    first one cannot have finished yet (another rank starts it 0.3 s later) raises ValueError.
    The names are declared first so that the rank-dependent start order keeps the keys equal."""
    bps.declare("dup.A")
    bps.declare("dup.B")
    a = make(values(2100, RANK, 64, "int32"), "int32", (64,))
    b = make(values(2101, RANK, 64, "int32"), "int32", (64,))
    mine, other = ("dup.A", "dup.B") if RANK == 0 else ("dup.B", "dup.A")
    arr_mine, arr_other = (a, b) if RANK == 0 else (b, a)
    h1 = push_pull(mine, arr_mine, arr_mine, "int32", False)
    try:
        push_pull(mine, arr_mine, arr_mine, "int32", False)
    except ValueError as exc:
        log(f"duplicate in-flight name rejected: {exc}")
    else:
        fail(f"a second push_pull of {mine!r} (in flight: rank 0 / the others start it 0.3 s "
             "later) was accepted")
    time.sleep(0.3)
    h2 = push_pull(other, arr_other, arr_other, "int32", False)
    bps.wait(h1)
    bps.wait(h2)
    size = bps.size()
    compare("dup.A", a, expected(2100, 64, "int32", (64,), size, False), "int32", False)
    compare("dup.B", b, expected(2101, 64, "int32", (64,), size, False), "int32", False)
    return 3


def mode_inflight(args) -> int:
    size = bps.size()
    specs = []
    for k in range(50):
        dtype = DTYPES[k % len(DTYPES)]
        shape = ((k * 37) % 500 + 1,) if k % 5 else (4, (k % 7) + 1, 3)
        if k == 10:
            shape = (300000,)  # a multi-partition one among them
            dtype = "float32"
        average = k % 4 == 1
        inplace = k % 3 == 0
        n = int(np.prod(shape))
        inp = make(values(2000 + k, RANK, n, dtype), dtype, shape)
        out = inp if inplace else np.zeros_like(inp)
        prio = None if k % 2 else (k * 31) % 17
        specs.append((f"inflight.{k}", k, dtype, shape, average, inplace, inp, inp.copy(), out,
                      prio))
    handles = [push_pull(s[0], s[6], s[8], s[2], s[4], s[9]) for s in specs]
    for h, s in zip(reversed(handles), reversed(specs)):
        name, k, dtype, shape, average, inplace, inp, orig, out, _ = s
        bps.wait(h)
        n = int(np.prod(shape))
        compare(name, out, expected(2000 + k, n, dtype, shape, size, average), dtype, average)
        if not inplace and not np.array_equal(inp, orig):
            fail(f"{name}: input modified")
    return len(specs) + duplicate_in_flight()


def mode_overlap(args) -> int:
    size = bps.size()
    n = 8 * 1024 * 1024  # 32 MiB of float32
    inp = make(values(3000, RANK, n, "float32"), "float32", (n,))
    want = expected(3000, n, "float32", (n,), size, False)
    out = np.empty_like(inp)
    count = 0
    for rnd in range(2):
        out.fill(-1)
        h = push_pull("overlap", inp, out, "float32", False)
        if bps.poll(h):
            fail(f"poll() returned True right after starting a 32 MiB push_pull (round {rnd})")
        polls = 1
        deadline = time.monotonic() + 60
        while not bps.poll(h):
            polls += 1
            if time.monotonic() > deadline:
                fail("poll() never returned True within 60 s")
            time.sleep(0.001)
        bps.wait(h)
        log(f"overlap round {rnd}: {polls} polls before completion")
        compare("overlap", out, want, "float32", False)
        count += 1
    # A plain wait also works after a False poll.
    out.fill(-1)
    h = push_pull("overlap", inp, out, "float32", False)
    if bps.poll(h):
        fail("poll() returned True right after starting (wait variant)")
    bps.wait(h)
    compare("overlap", out, want, "float32", False)
    return count + 1


def mode_crossorder(args) -> int:
    """Ranks produce the same prioritized tensors in opposite orders (rank 0 lowest priority
    first, the others highest first, 50 ms apart, as two workers whose backward passes drift
    apart), with a credit of one partition: every sum must still arrive (credit held across a
    pull's round trip would deadlock here). Three rounds."""
    size = bps.size()
    count = 8
    order = list(range(count)) if RANK == 0 else list(reversed(range(count)))
    n = 4 * 65536 // 4  # four partitions of 64 KiB each
    for k in range(count):  # same keys everywhere (as the optimizers declare up front)
        bps.declare(f"cross.{k}")
    for rnd in range(3):
        bufs = {}
        for k in order:
            inp = make(values(5000 + k, RANK, n, "float32", rnd), "float32", (n,))
            out = np.full_like(inp, -1)
            bufs[k] = (inp, out, push_pull(f"cross.{k}", inp, out, "float32", False, k))
            time.sleep(0.05)
        for k, (_inp, out, h) in bufs.items():
            bps.wait(h, 60)
            compare(f"cross.{k} round {rnd}", out,
                    expected(5000 + k, n, "float32", (n,), size, False, rnd), "float32", False)
    return 3 * count


def mode_declare(args) -> int:
    names = [f"layer{i}.weight" if i % 2 else f"layer{i}.bias" for i in range(20)]
    keys = [bps.declare(nm) for nm in names]
    again = [bps.declare(nm) for nm in names]
    if keys != again:
        fail(f"re-declaring returned different keys: {keys} vs {again}")
    if len(set(keys)) != len(keys):
        fail(f"distinct names got equal keys: {keys}")
    # The declared names are usable, in declaration order and reversed.
    for i, nm in enumerate(names):
        run_case(nm, 4000 + i, "float32", (33,), False, True)
    for i, nm in reversed(list(enumerate(names))):
        run_case(nm, 4100 + i, "float32", (33,), True, False)
    log("KEYS " + json.dumps(keys))
    return len(names) * 2 + 1


def mode_mismatch(args) -> int:
    """Each sub-case: one name with a rank-dependent shape/dtype/size; every rank must get
    MismatchError. Prints ``MISMATCH-CAUGHT <case>`` per case."""
    r = RANK
    cases = [
        # same byte count, different shape
        ("mm.shape", "float32", (2, 6) if r % 2 == 0 else (3, 4)),
        # different byte count
        ("mm.size", "float32", (10 + r,)),
        # different dtype, same byte count
        ("mm.dtype", "float32" if r % 2 == 0 else "int32", (8,)),
    ]
    count = 0
    for name, dtype, shape in cases:
        inp = make(values(5000, r, int(np.prod(shape)), dtype), dtype, shape)
        try:
            h = push_pull(name, inp, inp, dtype, False)
            bps.wait(h, timeout=60)
        except errors.MismatchError as exc:
            log(f"MISMATCH-CAUGHT {name}: {exc}")
            count += 1
            continue
        except Exception as exc:
            fail(f"{name}: expected MismatchError, got {type(exc).__name__}: {exc}")
        fail(f"{name}: push_pull with rank-dependent {dtype} {shape} succeeded")
    # The job stays usable after a mismatch.
    run_case("mm.after", 5100, "float32", (17,), False, True)
    return count + 1


def mode_loop(args) -> int:
    """Push_pull in a loop until a peer is lost. Prints ``READY`` after the first round and
    ``CAUGHT-PEERLOST <time.time()> <message>`` on PeerLostError; exits 3 after 120 s without
    an error. ARGS: float32 elements (50 000)."""
    count = int(args[0]) if args else 50000
    inp = make(values(6000, RANK, count, "float32"), "float32", (count,))
    out = np.empty_like(inp)
    ready = False
    start = time.monotonic()
    rnd = 0
    while time.monotonic() - start < 120:
        try:
            h = push_pull("loop", inp, out, "float32", False)
            bps.wait(h)
        except errors.PeerLostError as exc:
            t = time.time()
            log(f"CAUGHT-PEERLOST {t:.3f} {exc}")
            return 1
        except Exception as exc:
            fail(f"expected PeerLostError, got {type(exc).__name__}: {exc}")
        if not ready:
            log(f"READY pid={os.getpid()}")
            ready = True
        rnd += 1
        time.sleep(0.01)
    fail("no error within 120 s")
    return 0


def mode_timeout(args) -> int:
    """BYTEPS_TIMEOUT=3: worker 1 never pushes "lonely"; worker 0 must get BytePSTimeoutError
    naming the missing worker or the tensor. args: [seconds worker 1 sleeps, "declared"]: with
    "declared" every rank push_pulls "lonely" once first, so the stall is at the servers (a
    later round), not at the declaration."""
    run_case("to.warmup", 7000, "float32", (17,), False, True)
    if len(args) > 1 and args[1] == "declared":
        run_case("lonely", 7001, "float32", (100,), False, True)
    if RANK == 0:
        inp = make(values(7001, RANK, 100, "float32"), "float32", (100,))
        t0 = time.monotonic()
        try:
            h = push_pull("lonely", inp, inp, "float32", False)
            bps.wait(h)
        except errors.BytePSTimeoutError as exc:
            dt = time.monotonic() - t0
            log(f"CAUGHT-TIMEOUT {dt:.2f} {exc}")
            if dt > 10:
                fail(f"the timeout came after {dt:.1f} s (BYTEPS_TIMEOUT=3)")
            return 1
        except Exception as exc:
            fail(f"expected BytePSTimeoutError, got {type(exc).__name__}: {exc}")
        fail("push_pull of 'lonely' succeeded although worker 1 never pushed it")
    else:
        time.sleep(float(args[0]) if args else 6.0)
        log("LONELY-SKIPPED")
    return 1


def mode_shm(args) -> int:
    """Prints READY, waits until the file args[0] exists (the test creates it), then runs a few
    more rounds and exits normally."""
    go = args[0]
    run_case("shm.a", 8000, "float32", (100000,), False, True)
    log(f"READY pid={os.getpid()}")
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            fail(f"{go} did not appear within 60 s")
        time.sleep(0.02)
    for rnd in range(3):
        run_case("shm.a", 8000, "float32", (100000,), False, rnd % 2 == 0, rnd=rnd)
    for k, dtype in enumerate(DTYPES):  # more names, each with its own segment
        run_case(f"shm.{dtype}", 8001 + k, dtype, (5000,), k % 2 == 0, k % 3 == 0)
    return 4 + len(DTYPES)


def mode_orphan(args) -> int:
    """--local-size 2, single machine: after a warm-up, local rank 0 starts a push_pull of a new
    name (its shared-memory segment is created) that local rank 1 never joins; rank 1 prints
    ``READY`` and sleeps (the test kills it). Rank 0 prints ``ORPHAN-STARTED`` and then
    ``CAUGHT-PEERLOST <time> <message>`` when the loss of rank 1 fails the operation."""
    run_case("orphan.warmup", 9000, "float32", (1000,), False, True)
    if RANK != 0:
        log(f"READY pid={os.getpid()}")
        time.sleep(120)
        fail("was not killed within 120 s")
    inp = make(values(9001, RANK, 100000, "float32"), "float32", (100000,))
    h = push_pull("orphan", inp, inp, "float32", False)
    log(f"READY pid={os.getpid()}")
    log("ORPHAN-STARTED")
    try:
        bps.wait(h)
    except errors.PeerLostError as exc:
        log(f"CAUGHT-PEERLOST {time.time():.3f} {exc}")
        return 1
    except Exception as exc:
        fail(f"expected PeerLostError, got {type(exc).__name__}: {exc}")
    fail("the orphan push_pull succeeded without local rank 1")
    return 0


def mode_soak(args) -> int:
    """args[0] iterations of push_pull (out of place, sum) over 50 tensors of mixed sizes (1
    element .. 1 MiB) and dtypes, every result checked exactly. After a warm-up of a tenth of
    the iterations and at the end, prints ``MEASURE start|end`` and pauses 3 s so the test can
    read every process's resident memory and open descriptors at the same moment."""
    iterations = int(args[0])
    dtypes = ("float32", "float16", "int32", "float64", "int64")
    counts = np.geomspace(1, 1 << 18, 50).astype(np.int64)
    tensors = [(f"soak.{i}", dtypes[i % len(dtypes)]) for i in range(len(counts))]
    bufs = [(np.empty(int(n), dtype=dt), np.empty(int(n), dtype=dt))
            for n, (_, dt) in zip(counts, tensors)]
    size = bps.size()
    for it in range(iterations):
        if it == max(1, iterations // 10):
            log("MEASURE start")
            time.sleep(3.0)
        bump = it % 3
        handles = []
        for (name, dt), (inp, out) in zip(tensors, bufs):
            inp.fill(RANK + 1 + bump)
            handles.append(push_pull(name, inp, out, dt, False))
        for h in handles:
            bps.wait(h)
        expected = expected_sum(lambda r, b=bump: r + 1 + b, size)
        for (name, _), (_, out) in zip(tensors, bufs):
            if not (out[0] == expected and out[-1] == expected):
                fail(f"{name} iteration {it}: {out[0]}, {out[-1]} != {expected}")
    log("MEASURE end")
    time.sleep(3.0)
    return iterations * len(tensors)


MODES = {
    "correctness": mode_correctness,
    "partitions": mode_partitions,
    "fastslow": mode_fastslow,
    "inflight": mode_inflight,
    "overlap": mode_overlap,
    "crossorder": mode_crossorder,
    "declare": mode_declare,
    "mismatch": mode_mismatch,
    "loop": mode_loop,
    "timeout": mode_timeout,
    "shm": mode_shm,
    "orphan": mode_orphan,
    "soak": mode_soak,
}


def main(modes=None) -> None:
    """Run the mode named by argv[1] from ``modes`` (default: this file's MODES; other worker
    scripts pass their own and use this file's log / fail / push_pull / RANK)."""
    global RANK
    modes = MODES if modes is None else modes
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "late":  # the last worker machine starts late: rendezvous and heartbeats must cope
        mode = "declare"
        late = int(os.environ.get("DMLC_WORKER_ID", "0")) == int(os.environ["DMLC_NUM_WORKER"]) - 1
        if late:
            time.sleep(float(args[0]))
        bps.init()
        time.sleep(float(args[0]))  # the job lives on after the rendezvous
        args = []
    bps.init()
    RANK = bps.rank()
    log(f"START mode={mode} rank={RANK} size={bps.size()} local_rank={bps.local_rank()} "
        f"local_size={bps.local_size()} pid={os.getpid()}")
    try:
        n = modes[mode](args)
    except Exception:
        fail("unexpected exception:\n" + traceback.format_exc())
    bps.shutdown()
    log(f"OK {n} cases")


if __name__ == "__main__":
    main()
