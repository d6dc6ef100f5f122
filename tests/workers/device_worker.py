"""Worker script of tests/test_device.py: ``python device_worker.py MODE [ARGS...]`` under
``python -m byteps.launch``; log, fail, values/expected/compare and the start-up are
bps_worker's.

Device tensors through the real pipeline (COPY_D2H ... COPY_H2D) on the fake device (host
memory, a thread per stream, a delay before each copy), or on CUDA with ``--cuda`` (torch
tensors on ``cuda:<local_rank % device_count>``). Modes:

* ``sums``: every dtype, sizes around the partition bound (``BYTEPS_PARTITION_BYTES``, which
  the test sets), sum and average, in place and out of place, two rounds of each name; each
  result compared exactly (float averages within one unit in the last place).
* ``producer``: the input is written by a producer still running when push_pull is called
  (fake: a write queued on a stream of its own after a delay, then an event; CUDA: a kernel
  queued behind a long ``torch.cuda._sleep``); push_pull waits for that event.
* ``steady N``: N rounds of three tensors; prints ``ALLOCS <json>``: the backend's counters
  after the first round and after the last (pinned allocations, streams, events must not grow).
* ``large ROUNDS``: tensors of 6 000 000 elements (float32, float64 summed and averaged,
  int32 summed; in place and out of place), ROUNDS rounds each.
* ``timed N``: copy timing on (``_core.device.set_copy_timing``), then N rounds of one tensor
  of several partitions into another (out of place: a one-process job copies within the
  device); prints ``TIMED <json>``: the backend's counters and the rounds' wall time
  (seconds).
* ``ops``: device tensors reduced with min, max and product (the host path under
  BYTEPS_NCCL=1), float32 and int32, sizes around the bound, exact.
* ``dlpack``: ``byteps.push_pull`` of NumPy arrays (the DLPack front), every dtype NumPy has
  (not bfloat16), in place and with ``out=``, sum and average, sizes around the bound.
* ``orders ROUNDS``: 12 tensors in flight at once, started in another order and with other
  priorities on every rank and round (BYTEPS_NCCL: the collective calls must keep one order).
* ``schemes ROUNDS``: a compressed (fp16), a ring all-reduce and a summation-service tensor in
  flight at once (a distributed job with BYTEPS_SYNC=ring; each tensor names its scheme).
* ``alone``: local rank 0 push_pulls a device tensor, the others a host tensor of the same name
  (BYTEPS_NCCL=1: the communicator never gets its other ranks); ``CAUGHT <type> <message>``.
* ``stuck``: push_pull of a device tensor until any error; ``CAUGHT <time> <type> <message>``.
* ``loop``: push_pull of a device tensor until a peer is lost (bps_worker's ``loop`` protocol:
  ``READY`` after the first round, ``CAUGHT-PEERLOST <time> <message>`` on PeerLostError).
  With ``FAKE_COLLECTIVE_STALL_LOCAL_RANK=R`` and ``FAKE_COLLECTIVE_STALL_AFTER=N``, local rank
  R's fake collective calls stall from the (N+1)-th on (a GPU stuck in a kernel).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bps_worker (which adds tests/)
import bps_worker as w
from bps_worker import DTYPES, bps, compare, expected, fail, log, make, values

from byteps import _core, errors
from byteps.launch.contract import is_true

CUDA = "--cuda" in sys.argv
if CUDA:
    sys.argv.remove("--cuda")
KIND = "cuda" if CUDA else "fake"


class Buffers:
    """A "device" array of the test's backend: NumPy memory for the fake device, a torch CUDA
    tensor for CUDA (filled from / read back to NumPy through torch)."""

    def __init__(self, host: np.ndarray):
        self.host_dtype, self.shape = host.dtype, host.shape
        if CUDA:
            import torch

            dev = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
            flat = torch.from_numpy(host.reshape(-1).view(np.uint8).copy())
            self.t = flat.to(dev)
            self.ptr = self.t.data_ptr()
            self.device_id = dev.index
        else:
            self.arr = host.copy()
            self.ptr = self.arr.ctypes.data
            self.device_id = 0

    def read(self) -> np.ndarray:
        if CUDA:
            raw = self.t.cpu().numpy()
        else:
            raw = self.arr.reshape(-1).view(np.uint8)
        return raw.view(self.host_dtype).reshape(self.shape).copy()


_events = []  # the last CUDA events passed to the core (alive until their operation ends)


def start_op(name, inp: Buffers, out: Buffers, dtype, average, ready_event=None,
             priority=None, op="sum"):
    """Start the push_pull of a device tensor. ``ready_event``: the producer's event; None:
    on CUDA, an event recorded now on the current stream (the tensors were filled there, as
    byteps.torch does), on the fake device none (its buffers are written by the host)."""
    if ready_event is None:
        ready_event = 0
        if CUDA:
            import torch

            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(inp.t.device))
            _events.append(ev)
            del _events[:-16]  # each mode waits for its operation before starting the next
            ready_event = ev.cuda_event
    nbytes = int(np.prod(inp.shape)) * inp.host_dtype.itemsize
    return _core.push_pull_async(name, inp.ptr, out.ptr, nbytes, dtype, list(inp.shape), average,
                                 priority, 0, device=KIND, device_id=inp.device_id,
                                 ready_event=ready_event, op=op)


def sizes(dtype: str):
    """Element counts around the partition bound: below, at, above, several bounds + 1."""
    per = BOUND // np.dtype(w.np_dtype(dtype)).itemsize
    return (0, 1, 17, per - 1, per, per + 1, 3 * per + 1)


BOUND = 65536  # BYTEPS_PARTITION_BYTES of the job (set in __main__)


def refuses_average(dtype: str) -> bool:
    """BYTEPS_NCCL=1 on one machine of several processes: NCCL averages on the GPU, floating
    point only (byteps refuses an integer average there rather than round it otherwise)."""
    return (is_true(os.environ.get("BYTEPS_NCCL")) and bps.local_size() > 1
            and bps.size() == bps.local_size() and dtype.startswith(("int", "uint")))


def expect_average_refused(name, dtype, n, inplace) -> int:
    host = make(values(1, w.RANK, n, dtype, 0), dtype, (n,))
    inp = Buffers(host)
    out = inp if inplace else Buffers(np.zeros_like(host))
    try:
        bps.wait(start_op(name, inp, out, dtype, True))
    except errors.InvalidArgumentError as e:
        if "average floating-point tensors only" not in str(e):
            fail(f"{name}: refused with {e}")
    else:
        fail(f"{name}: an integer average among the GPUs of one machine was not refused")
    # Refused before it started: the name takes a sum next.
    bps.wait(start_op(name, inp, out, dtype, False))
    compare(f"{name} summed after the refusal", out.read(),
            expected(1, n, dtype, (n,), bps.size(), False, 0), dtype, False)
    return 1


def mode_sums(args) -> int:
    size, count, case = bps.size(), 0, 0
    for dtype in DTYPES:
        for n in sizes(dtype):
            for average in (False, True):
                for inplace in (True, False):
                    case += 1
                    name = f"d{case}.{dtype}.{n}.{int(average)}{int(inplace)}"
                    if n and average and refuses_average(dtype):
                        count += expect_average_refused(name, dtype, n, inplace)
                        continue
                    for rnd in range(2):
                        host = make(values(case, w.RANK, n, dtype, rnd), dtype, (n,))
                        inp = Buffers(host)
                        out = inp if inplace else Buffers(np.zeros_like(host))
                        bps.wait(start_op(name, inp, out, dtype, average))
                        what = f"{name} round {rnd}"
                        compare(what, out.read(), expected(case, n, dtype, (n,), size, average,
                                                           rnd), dtype, average)
                        if not inplace and not np.array_equal(inp.read(), host):
                            fail(f"{what}: the input was modified by an out-of-place push_pull")
                        count += 1
    return count


def mode_ops(args) -> int:
    """Device tensors with op min, max, product (BYTEPS_NCCL=1: the host path, NCCL sums):
    float32 and int32 around the partition bound, exact against the fold of every rank's
    small-integer inputs."""
    fold = {"min": np.minimum, "max": np.maximum, "product": np.multiply}
    count = 0
    for op, np_op in fold.items():
        for dtype in ("float32", "int32"):
            for n in sizes(dtype)[1:]:
                def vals(r, n=n, dtype=dtype):
                    return ((np.arange(n) * 3 + r * 7) % 5 - 2).astype(dtype)
                want = vals(0)
                for r in range(1, bps.size()):
                    want = np_op(want, vals(r))
                inp = Buffers(vals(w.RANK))
                out = Buffers(np.zeros(n, dtype=dtype))
                bps.wait(start_op(f"op.{op}.{dtype}.{n}", inp, out, dtype, False, op=op))
                if not np.array_equal(out.read(), want):
                    fail(f"device {op} {dtype} n={n}: {out.read()[:6]} vs {want[:6]}")
                count += 1
    return count


def mode_large(args) -> int:
    """Tensors of 6 000 000 elements (float32, float64, int32; partitions of 300 KiB and more),
    summed and averaged, in place and out of place, ROUNDS rounds of changing values each."""
    rounds, n, size, count, case = int(args[0]) if args else 3, 6_000_000, bps.size(), 0, 100
    for dtype in ("float32", "float64", "int32"):
        for average in (False, True) if dtype != "int32" else (False,):
            for inplace in (True, False):
                case += 1
                name = f"large{case}.{dtype}.{int(average)}{int(inplace)}"
                for rnd in range(rounds):
                    host = make(values(case, w.RANK, n, dtype, rnd), dtype, (n,))
                    inp = Buffers(host)
                    out = inp if inplace else Buffers(np.zeros_like(host))
                    bps.wait(start_op(name, inp, out, dtype, average))
                    compare(f"{name} round {rnd}", out.read(),
                            expected(case, n, dtype, (n,), size, average, rnd), dtype, average)
                    count += 1
    return count


def mode_producer(args) -> int:
    """The input is still being written when push_pull is called."""
    size, count = bps.size(), 0
    n = 3 * BOUND // 4 + 5  # several partitions
    for rnd in range(3):
        want = expected(7000, n, "float32", (n,), size, False, rnd)
        final = make(values(7000, w.RANK, n, "float32", rnd), "float32", (n,))
        stale = np.full(n, -1.0e6, np.float32)  # what a push that did not wait would sum
        buf = Buffers(stale)
        if CUDA:
            import torch

            src = torch.from_numpy(final).to(buf.t.device)
            stream = torch.cuda.Stream(buf.t.device)
            with torch.cuda.stream(stream):
                torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the write
                buf.t.copy_(src.view(torch.uint8))
                ev = torch.cuda.Event()
                ev.record(stream)
            h = start_op(f"prod.{rnd}", buf, buf, "float32", False, ready_event=ev.cuda_event)
        else:
            from byteps import _core_testing  # the fake device's hooks (test builds)

            fd = _core_testing.fake_device
            stream, ev = fd.create_stream(), fd.create_event()
            fd.write_async(stream, buf.ptr, final, 200_000)  # 0.2 s later
            fd.record(ev, stream)
            h = start_op(f"prod.{rnd}", buf, buf, "float32", False, ready_event=ev)
        bps.wait(h)
        compare(f"producer round {rnd}", buf.read(), want, "float32", False)
        count += 1
    return count


def mode_steady(args) -> int:
    rounds = int(args[0]) if args else 5
    size, counts = bps.size(), []
    tensors = [("s.a", 1000), ("s.b", 3 * BOUND // 4 + 1), ("s.c", 40_000)]
    bufs = {name: Buffers(np.zeros(n, np.float32)) for name, n in tensors}
    for rnd in range(rounds):
        for i, (name, n) in enumerate(tensors):
            host = make(values(8000 + i, w.RANK, n, "float32", rnd), "float32", (n,))
            b = bufs[name]
            if CUDA:
                import torch

                b.t.copy_(torch.from_numpy(host.view(np.uint8)).to(b.t.device))
            else:
                b.arr[:] = host
            bps.wait(start_op(name, b, b, "float32", False))
            compare(f"{name} round {rnd}", b.read(),
                    expected(8000 + i, n, "float32", (n,), size, False, rnd), "float32", False)
        if rnd == 0:
            counts.append(dict(_core.device.stats(KIND)))
    counts.append(dict(_core.device.stats(KIND)))
    log("ALLOCS " + json.dumps({"first": counts[0], "last": counts[-1]}))
    return rounds * len(tensors)


def mode_timed(args) -> int:
    rounds, n = int(args[0]) if args else 3, 5 * BOUND // 4  # 5 partitions of float32
    _core.device.set_copy_timing(KIND, True)
    b, o = Buffers(np.zeros(n, np.float32)), Buffers(np.zeros(n, np.float32))
    wall = 0.0
    for rnd in range(rounds):
        host = make(values(8100, w.RANK, n, "float32", rnd), "float32", (n,))
        if CUDA:
            import torch

            b.t.copy_(torch.from_numpy(host.view(np.uint8)).to(b.t.device))
        else:
            b.arr[:] = host
        t0 = time.perf_counter()
        bps.wait(start_op("timed", b, o, "float32", False))
        wall += time.perf_counter() - t0
        compare(f"timed round {rnd}", o.read(),
                expected(8100, n, "float32", (n,), bps.size(), False, rnd), "float32", False)
    log("TIMED " + json.dumps({"stats": dict(_core.device.stats(KIND)), "wall_s": wall,
                               "bytes": n * 4, "rounds": rounds}))
    return rounds


def mode_dlpack(args) -> int:
    import byteps

    size, count, case = bps.size(), 0, 9000
    for dtype in DTYPES:
        if dtype == "bfloat16":
            continue
        for n in sizes(dtype):
            for average in (False, True):
                case += 1
                x = make(values(case, w.RANK, n, dtype), dtype, (n,))
                want = expected(case, n, dtype, (n,), size, average)
                got = byteps.push_pull(x, average=average, name=f"dl.{case}")
                if got is not x:
                    fail(f"dl.{case}: push_pull returned another object than its input")
                compare(f"dl.{case} {dtype} n={n}", x, want, dtype, average)
                ro = make(values(case, w.RANK, n, dtype), dtype, (n,))
                ro.flags.writeable = False
                out = np.empty_like(ro)
                byteps.push_pull(ro, average=average, name=f"dl.{case}.out", out=out)
                compare(f"dl.{case}.out {dtype} n={n}", out, want, dtype, average)
                count += 2
    return count


def mode_orders(args) -> int:
    """ROUNDS rounds of 12 tensors in flight at once (sizes around the partition bound, three
    dtypes), started in an order and with priorities of this rank's own (another permutation on
    every rank and round): the local processes' collective calls must still be made in one
    order (BYTEPS_NCCL), which the fake collective checks call by call."""
    rounds, size, count = int(args[0]) if args else 4, bps.size(), 0
    rng = np.random.default_rng(1000 + w.RANK)
    specs = [(dtype, n) for dtype in ("float32", "float64", "int32")
             for n in (1, 5, BOUND // 4 - 1, BOUND // 4 * 3 + 7)]
    for i, (dtype, n) in enumerate(specs):  # keys in one order on every rank
        bps.declare(f"orders{i}.{dtype}.{n}")
    for rnd in range(rounds):
        order = rng.permutation(len(specs))
        handles = []
        for i in order:
            dtype, n = specs[i]
            case = 7000 + i
            inp = Buffers(make(values(case, w.RANK, n, dtype, rnd), dtype, (n,)))
            h = start_op(f"orders{i}.{dtype}.{n}", inp, inp, dtype, False,
                         priority=int(rng.integers(-5, 5)))
            handles.append((h, i, inp))
        for h, i, inp in handles:
            bps.wait(h)
            dtype, n = specs[i]
            compare(f"orders{i} round {rnd}", inp.read(),
                    expected(7000 + i, n, dtype, (n,), size, False, rnd), dtype, False)
            count += 1
    return count


def mode_schemes(args) -> int:
    """ROUNDS rounds of device tensors that take the other plans: one compressed (fp16: exact
    for these small integers; summed), one summed by a ring all-reduce among the worker
    machines, one by the summation service, all in flight at once (a distributed job run with
    BYTEPS_SYNC=ring, which builds the worker mesh)."""
    rounds, size, count = int(args[0]) if args else 3, bps.size(), 0
    n = 3 * BOUND // 4 + 5  # above BYTEPS_MIN_COMPRESS_BYTES, several partitions
    plans = {"fp16": dict(compression={"compressor_type": "fp16"}, sync="ps"),
             "ring": dict(sync="ring"), "ps": dict(sync="ps")}
    for name, kwargs in plans.items():
        bps.declare(f"schemes.{name}", **kwargs)
    # values in float16's range: every machine's sum and the total stay exact in fp16
    def vals(i, rank, rnd):
        return values(8000 + i, rank, n, "float16", rnd)

    for rnd in range(rounds):
        started = []
        for i, name in enumerate(plans):
            inp = Buffers(make(vals(i, w.RANK, rnd), "float32", (n,)))
            started.append((start_op(f"schemes.{name}", inp, inp, "float32", False), i, inp))
        for h, i, inp in started:
            bps.wait(h)
            want = sum(vals(i, r, rnd) for r in range(size)).astype(np.float32)
            compare(f"schemes.{list(plans)[i]} round {rnd}", inp.read(), want, "float32", False)
            count += 1
    return count


def mode_alone(args) -> int:
    """Local rank 0 push_pulls a device tensor, the others (later) a host tensor of the same
    name: the NCCL communicator never gets its other ranks (BYTEPS_NCCL=1). Every rank must get
    an error naming the set-up; prints ``CAUGHT <ExceptionType> <message>``."""
    n = 1000
    if bps.local_rank() == 0:
        buf = Buffers(make(values(9000, w.RANK, n, "float32"), "float32", (n,)))
        call = lambda: bps.wait(start_op("alone", buf, buf, "float32", False))  # noqa: E731
    else:  # after the root's set-up gave up (2 x BYTEPS_TIMEOUT): the job has failed by then
        time.sleep(2 * float(os.environ.get("BYTEPS_TIMEOUT", "120")))
        host = make(values(9000, w.RANK, n, "float32"), "float32", (n,))
        call = lambda: bps.wait(_core.push_pull_async(  # noqa: E731
            "alone", host.ctypes.data, host.ctypes.data, host.nbytes, "float32", [n], False))
    try:
        call()
    except errors.BytePSError as exc:
        log(f"CAUGHT {type(exc).__name__} {exc}")
        return 1
    fail("no error")
    return 0


def _push_pull_until(name: str, case: int, expect, line) -> int:
    """push_pull of a device tensor named ``name`` every 10 ms (``READY`` after the first)
    until an error of type ``expect``, which it logs as ``line(exc)``; any other error, or
    none within 120 s, fails the rank."""
    n = 3 * BOUND // 4 + 5
    buf = Buffers(make(values(case, w.RANK, n, "float32"), "float32", (n,)))
    ready, start = False, time.monotonic()
    while time.monotonic() - start < 120:
        try:
            bps.wait(start_op(name, buf, buf, "float32", False))
        except expect as exc:
            log(line(exc))
            return 1
        except Exception as exc:
            fail(f"expected {expect.__name__}, got {type(exc).__name__}: {exc}")
        if not ready:
            log(f"READY pid={os.getpid()}")
            ready = True
        time.sleep(0.01)
    fail("no error within 120 s")
    return 0


def mode_stuck(args) -> int:
    """push_pull of a device tensor until any error (a local rank's calls stall: see the
    FAKE_COLLECTIVE_STALL_* hook); prints ``CAUGHT <time> <ExceptionType> <message>``."""
    return _push_pull_until("stuck", 6001, errors.BytePSError,
                            lambda e: f"CAUGHT {time.time():.3f} {type(e).__name__} {e}")


def mode_loop(args) -> int:
    return _push_pull_until("loop", 6000, errors.PeerLostError,
                            lambda e: f"CAUGHT-PEERLOST {time.time():.3f} {e}")


if __name__ == "__main__":
    BOUND = int(os.environ.get("BYTEPS_PARTITION_BYTES", "65536"))
    if CUDA:
        import torch

        import byteps

        # The core reduces CUDA tensors once byteps.cuda has loaded the runtime.
        if not byteps.cuda_available():
            print(f"FAIL CUDA off: {byteps.cuda_status()['reason']}", flush=True)
            sys.exit(1)
        torch.cuda.set_device(int(os.environ.get("BYTEPS_LOCAL_RANK", "0")) %
                              torch.cuda.device_count())
    else:
        from byteps import _core_testing  # the fake device's hooks (test builds)

        _core_testing.fake_device.set_copy_delay(int(os.environ.get("FAKE_COPY_DELAY_US",
                                                                    "300")))
        if os.environ.get("FAKE_COLLECTIVE_STALL_LOCAL_RANK") == os.environ.get(
                "BYTEPS_LOCAL_RANK", "0"):
            _core_testing.fake_device.stall_collective_after(
                int(os.environ["FAKE_COLLECTIVE_STALL_AFTER"]))
    w.main({"sums": mode_sums, "producer": mode_producer, "steady": mode_steady,
            "loop": mode_loop, "dlpack": mode_dlpack, "timed": mode_timed, "orders": mode_orders,
            "schemes": mode_schemes, "alone": mode_alone, "stuck": mode_stuck,
            "large": mode_large, "ops": mode_ops})
