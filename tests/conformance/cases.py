"""The semantic cases of the conformance suite, written once for every framework.

Each case is a function taking an initialised shim (``shims/base.py``) and raising
``AssertionError`` with a clear message on failure. Every rank runs the same cases in the same
order (tensor names are declared in first-use order, which must agree across ranks). Inputs
are deterministic functions of the rank, and each case computes its expected result itself:

* integer-valued data in [-5, 5] ([0, 10] for uint8), so sums over a few ranks are exact in
  every dtype (float16 and bfloat16 included) and compared for exact equality;
* an integer average is floor division of the exact sum (as upstream on torch >= 1.5);
* a floating average is ``sum / size`` rounded to the dtype, allowed to differ from the exact
  quotient by at most 1.5 ulp of the dtype (the core may multiply by ``1/size``, one extra
  rounding), and is exact where the quotient is representable (e.g. 0).

Cases are grouped (``GROUPS``) so that one job launch runs many of them. A case may require
capabilities (``Case.requires``); on a shim without them it is reported as skipped.

This module imports only NumPy, the standard library and tests/oracle.py (the expected
push_pull results of every test; NumPy only), so the pytest driver can read the case list
without importing a framework.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from oracle import expected_push_pull, rank_data

# -------------------------------------------------------------------------------- registry --


class Case:
    """One semantic case: ``fn(shim)`` in group ``group``; needs ``requires`` capabilities."""

    def __init__(self, name: str, group: str, fn: Callable[[Any], None],
                 requires: Tuple[str, ...], doc: str):
        self.name = name
        self.group = group
        self.fn = fn
        self.requires = requires
        self.doc = doc

    def missing(self, shim_or_caps) -> List[str]:
        """Capabilities this case needs that the shim (or capability set) lacks."""
        caps = getattr(shim_or_caps, "capabilities", shim_or_caps)
        return [c for c in self.requires if c not in caps]


#: group name -> cases, in execution order
GROUPS: Dict[str, List[Case]] = {"collectives": [], "broadcast": [], "optimizer": [],
                                 "errors": [], "compression": [], "horovod": []}


def case(group: str, requires: Sequence[str] = ()):
    def register(fn):
        GROUPS[group].append(Case(fn.__name__, group, fn, tuple(requires),
                                  (fn.__doc__ or "").strip().split("\n")[0]))
        return fn
    return register


def all_cases() -> List[Case]:
    return [c for cases in GROUPS.values() for c in cases]


# ------------------------------------------------------------------------------ data, checks --

#: 1-, 2- and 3-D shapes of the reduction cases (sizes not multiples of SIMD widths).
SHAPES: Tuple[Tuple[int, ...], ...] = ((17,), (3, 5), (2, 3, 4))

_MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


def shape_tag(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape) or "scalar"


def expected_reduce(size: int, shape, dtype: str, average: bool, salt: int = 0) -> np.ndarray:
    """The oracle's result over ``size`` ranks of :func:`rank_data` ``(r, shape, dtype, salt)``:
    the exact sum (int64), the floor-divided sum (integer average) or the float64 quotient
    (floating average; compared within 1.5 ulp of ``dtype``)."""
    return expected_push_pull(lambda r: rank_data(r, shape, dtype, salt), size, average, dtype)


def _ulp(dtype: str, want: np.ndarray) -> np.ndarray:
    """One unit in the last place of ``dtype`` at magnitude ``want`` (0 where want == 0)."""
    a = np.abs(want.astype(np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return np.where(a > 0, np.exp2(e - _MANTISSA_BITS[dtype]), 0.0)


def _brief(a: np.ndarray, k: int = 8) -> str:
    flat = np.asarray(a).reshape(-1)
    return str(flat[:k].tolist()) + (" ..." if flat.size > k else "")


def assert_values(got: np.ndarray, want: np.ndarray, dtype: str, exact: bool, label: str,
                  ulps: float = 1.5) -> None:
    """``got`` (the result as NumPy) equals ``want``: exactly, or for floating dtypes within
    ``ulps`` units in the last place of ``dtype``."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape}, want {want.shape}"
    g = got.astype(np.float64) if dtype in _MANTISSA_BITS else got.astype(np.int64)
    if exact or dtype not in _MANTISSA_BITS:
        bad = g != want
    else:
        bad = np.abs(g - want) > ulps * _ulp(dtype, want)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        raise AssertionError(
            f"{label}: {int(bad.sum())} of {bad.size} elements wrong "
            f"({'exact' if exact or dtype not in _MANTISSA_BITS else f'{ulps} ulp'} check); "
            f"first at flat index {i}: got {g.reshape(-1)[i]!r}, want {want.reshape(-1)[i]!r}; "
            f"got {_brief(g)}, want {_brief(want)}")


def check_reduced(shim, result, shape, dtype: str, average: bool, label: str,
                  salt: int = 0) -> None:
    """``result`` (a framework tensor) is the sum/average over all ranks of
    ``rank_data(r, shape, dtype, salt)``, with the input's dtype and shape."""
    got_dtype = shim.dtype_of(result)
    assert got_dtype == dtype, f"{label}: result dtype {got_dtype}, want {dtype}"
    want = expected_reduce(shim.size(), shape, dtype, average, salt)
    assert_values(shim.to_numpy(result), want, dtype, exact=not average, label=label)


def make_input(shim, shape, dtype: str, salt: int = 0):
    return shim.tensor(rank_data(shim.rank(), shape, dtype, salt), dtype)


def _mode(average: bool) -> str:
    return "avg" if average else "sum"


# ------------------------------------------------------------------------------- collectives --


@case("collectives")
def sum_and_average_all_dtypes_and_shapes(shim):
    """push_pull sum and average for every supported dtype and 1-, 2-, 3-D shapes; the input
    is left unchanged."""
    r = shim.rank()
    for dtype in shim.dtypes:
        for shape in SHAPES:
            for average in (False, True):
                label = f"push_pull {_mode(average)} {dtype} {shape_tag(shape)}"
                t = make_input(shim, shape, dtype)
                out = shim.push_pull(t, average, f"conf.pp.{dtype}.{shape_tag(shape)}."
                                     f"{_mode(average)}")
                check_reduced(shim, out, shape, dtype, average, label)
                assert_values(shim.to_numpy(t), rank_data(r, shape, dtype), dtype, True,
                              f"{label}: input modified by an out-of-place push_pull")


@case("collectives", requires=("inplace",))
def inplace_sum_and_average(shim):
    """push_pull_inplace writes the sum/average into its argument, every dtype and shape."""
    for dtype in shim.dtypes:
        for shape in SHAPES:
            for average in (False, True):
                label = f"push_pull_inplace {_mode(average)} {dtype} {shape_tag(shape)}"
                t = shim.mutable(rank_data(shim.rank(), shape, dtype, salt=1), dtype)
                out = shim.push_pull_inplace(t, average, f"conf.ppi.{dtype}."
                                             f"{shape_tag(shape)}.{_mode(average)}")
                check_reduced(shim, t, shape, dtype, average, label + " (argument)", salt=1)
                if out is not None:
                    check_reduced(shim, out, shape, dtype, average, label + " (returned)",
                                  salt=1)


@case("collectives", requires=("async", "inplace"))
def async_inplace_all_dtypes(shim):
    """push_pull_async in place, every dtype, all started before the first synchronize;
    synchronize returns the argument holding the result."""
    started = []
    for i, dtype in enumerate(shim.dtypes):
        shape = SHAPES[i % len(SHAPES)]
        for average in (False, True):
            t = shim.mutable(rank_data(shim.rank(), shape, dtype, salt=2), dtype)
            h = shim.push_pull_async(t, average, f"conf.ppai.{dtype}.{_mode(average)}",
                                     inplace=True)
            started.append((h, t, shape, dtype, average))
    for h, t, shape, dtype, average in started:
        out = shim.synchronize(h)
        label = f"push_pull_async_inplace {_mode(average)} {dtype} {shape_tag(shape)}"
        check_reduced(shim, t, shape, dtype, average, label + " (argument)", salt=2)
        check_reduced(shim, out, shape, dtype, average, label + " (synchronize result)",
                      salt=2)


@case("collectives")
def many_operations_in_flight(shim):
    """48 push_pulls of mixed dtypes, shapes and sizes (one of several partitions) in flight
    at once, completed in reverse order."""
    tensors, names, meta = [], [], []
    dtypes = list(shim.dtypes)
    for i in range(48):
        dtype = dtypes[i % len(dtypes)]
        shape = (1 + (i * 37) % 301,) if i % 3 else (3, 1 + i % 7, 5)
        if i == 47 and "float32" in dtypes:
            dtype, shape = "float32", (1_100_000,)  # 4.4 MB: more than one partition
        average = bool(i % 2)
        tensors.append(make_input(shim, shape, dtype, salt=i))
        names.append(f"conf.many.{i}")
        meta.append((shape, dtype, average))
    averages = [m[2] for m in meta]
    # push_pull_many takes one `average` for all: run the sums and averages as two waves,
    # each wave with all its operations in flight together.
    results: Dict[int, Any] = {}
    for avg in (False, True):
        idx = [i for i in range(len(tensors)) if averages[i] == avg]
        outs = shim.push_pull_many([tensors[i] for i in idx], avg, [names[i] for i in idx])
        assert len(outs) == len(idx), f"push_pull_many returned {len(outs)} results"
        results.update(zip(idx, outs))
    for i, (shape, dtype, average) in enumerate(meta):
        check_reduced(shim, results[i], shape, dtype, average,
                      f"in-flight op {i} ({_mode(average)} {dtype} {shape_tag(shape)})", salt=i)


@case("collectives", requires=("async",))
def async_poll_and_synchronize_any_order(shim):
    """32 push_pull_async in flight; poll until every one reports done (never blocks), then
    synchronize in a shuffled order (the same on every rank)."""
    ops = []
    for i in range(32):
        dtype = shim.dtypes[i % len(shim.dtypes)]
        shape = SHAPES[i % len(SHAPES)]
        average = bool(i % 2)
        t = make_input(shim, shape, dtype, salt=100 + i)
        ops.append((shim.push_pull_async(t, average, f"conf.poll.{i}"), shape, dtype, average))
    deadline = time.monotonic() + _timeout() + 10
    pending = set(range(len(ops)))
    while pending:
        pending = {i for i in pending if not shim.poll(ops[i][0])}
        assert time.monotonic() < deadline, (
            f"poll(): {len(pending)} operations still not done after {_timeout() + 10:.0f} s: "
            f"{sorted(pending)}")
        time.sleep(0.002)
    order = list(range(len(ops)))
    random.Random(7).shuffle(order)
    for i in order:
        h, shape, dtype, average = ops[i]
        check_reduced(shim, shim.synchronize(h), shape, dtype, average,
                      f"async op {i} ({_mode(average)} {dtype} {shape_tag(shape)})",
                      salt=100 + i)


@case("collectives")
def same_name_repeated_rounds(shim):
    """One name reduced in 6 consecutive rounds with changing data: each round's sum is that
    round's (rounds never mix)."""
    for rnd in range(6):
        for dtype in ("float32", "int32"):
            if dtype not in shim.dtypes:
                continue
            t = make_input(shim, (2, 9), dtype, salt=200 + rnd)
            out = shim.push_pull(t, False, f"conf.rounds.{dtype}")
            check_reduced(shim, out, (2, 9), dtype, False, f"round {rnd} {dtype}", salt=200 + rnd)


@case("collectives")
def large_tensor_several_partitions(shim):
    """A tensor bigger than BYTEPS_PARTITION_BYTES (4 096 000 B by default), sum and average,
    float32 and int32."""
    shape = (3, 410_000)  # 4.92 MB in 4-byte dtypes
    for dtype in ("float32", "int32"):
        if dtype not in shim.dtypes:
            continue
        for average in (False, True):
            t = make_input(shim, shape, dtype, salt=300)
            out = shim.push_pull(t, average, f"conf.large.{dtype}.{_mode(average)}")
            check_reduced(shim, out, shape, dtype, average,
                          f"large {_mode(average)} {dtype}", salt=300)


@case("collectives")
def unsupported_dtype_raises_type_error(shim):
    """A dtype the core cannot sum (e.g. bool) raises TypeError at the call, on every rank,
    without communicating."""
    t, what = shim.unsupported_tensor()
    try:
        shim.push_pull(t, False, "conf.unsupported")
    except TypeError:
        pass
    except Exception as e:
        raise AssertionError(f"push_pull of a {what} tensor raised {type(e).__name__}: {e} "
                             "(want TypeError)") from e
    else:
        raise AssertionError(f"push_pull of a {what} tensor did not raise (want TypeError)")


@case("collectives", requires=("fp16",))
def fp16_compression_round_trip(shim):
    """Compression.fp16: locally, float32/float64 compress to float16 and decompress back to
    the original dtype exactly (fp16-representable values), integers pass through; push_pull
    with fp16 compression returns the input dtype with the exact sum, and an average within
    float16 precision."""
    for dtype in ("float32", "float64", "bfloat16"):
        if dtype not in shim.dtypes:
            continue
        src = rank_data(shim.rank(), (4, 6), dtype, salt=400) * 0.25  # fp16-exact
        t = shim.tensor(src, dtype)
        compressed, restored = shim.fp16_round_trip(t)
        cd = shim.dtype_of(compressed)
        assert cd == "float16", f"fp16 compress of {dtype}: compressed dtype {cd}"
        assert shim.dtype_of(restored) == dtype, (
            f"fp16 decompress: dtype {shim.dtype_of(restored)}, want {dtype}")
        assert_values(shim.to_numpy(restored), src, dtype, True, f"fp16 round trip {dtype}")
    for dtype in ("int32", "int64"):
        if dtype not in shim.dtypes:
            continue
        src = rank_data(shim.rank(), (5,), dtype)
        compressed, restored = shim.fp16_round_trip(shim.tensor(src, dtype))
        assert shim.dtype_of(compressed) == dtype, (
            f"fp16 compress of {dtype} changed its dtype to {shim.dtype_of(compressed)}")
        assert_values(shim.to_numpy(restored), src, dtype, True, f"fp16 round trip {dtype}")
    for dtype in ("float32", "float64"):
        if dtype not in shim.dtypes:
            continue
        for average in (False, True):
            label = f"push_pull fp16-compressed {_mode(average)} {dtype}"
            out = shim.push_pull_fp16(make_input(shim, (3, 7), dtype, salt=401), average,
                                      f"conf.fp16.{dtype}.{_mode(average)}")
            assert shim.dtype_of(out) == dtype, f"{label}: result dtype {shim.dtype_of(out)}"
            want = expected_reduce(shim.size(), (3, 7), dtype, average, salt=401)
            # the reduction ran in float16: average within float16 rounding
            assert_values(shim.to_numpy(out), want, "float16", not average, label)


# -------------------------------------------------------------------------------- broadcast --


@case("broadcast")
def broadcast_from_each_root(shim):
    """broadcast from every rank in turn, every dtype: every rank ends with the root's tensor,
    bit for bit."""
    n = shim.size()
    for root in range(n):
        for i, dtype in enumerate(shim.dtypes):
            shape = SHAPES[(root + i) % len(SHAPES)]
            t = make_input(shim, shape, dtype, salt=500 + root)
            out = shim.broadcast(t, root, f"root{root}.{dtype}")
            got_dtype = shim.dtype_of(out)
            assert got_dtype == dtype, f"broadcast from {root} {dtype}: dtype {got_dtype}"
            assert_values(shim.to_numpy(out), rank_data(root, shape, dtype, salt=500 + root),
                          dtype, True, f"broadcast from root {root} {dtype} "
                          f"{shape_tag(shape)}")


def _root_object(root: int):
    factor = root + 2

    class Payload:  # a local class: needs cloudpickle-style serialisation by value
        def __init__(self, v):
            self.v = v

    return {
        "root": root,
        "text": f"héllo from rank {root}",
        "nested": [1, 2.5, None, (True, b"\x00\xff"), {"k": list(range(root + 3))}],
        "array": np.arange(6, dtype=np.float64).reshape(2, 3) * factor,
        "fn": lambda v: v * factor,
        "payload": Payload(("p", root)),
        "big": bytes(range(256)) * (40 + root),  # object size differs with the root
    }


@case("broadcast", requires=("broadcast_object",))
def broadcast_object_from_each_root(shim):
    """broadcast_object of an arbitrary Python object (nested containers, NumPy array, a
    closure, an instance of a local class) from every rank; non-roots pass None."""
    r = shim.rank()
    for root in range(shim.size()):
        obj = _root_object(root) if r == root else None
        got = shim.broadcast_object(obj, root, f"conf.obj.{root}")
        want = _root_object(root)
        label = f"broadcast_object from root {root}"
        assert isinstance(got, dict), f"{label}: got {type(got).__name__}"
        for key in ("root", "text", "nested", "big"):
            assert got.get(key) == want[key], f"{label}: [{key!r}] = {got.get(key)!r}"
        assert np.array_equal(got["array"], want["array"]), f"{label}: array {got['array']!r}"
        assert got["fn"](3) == want["fn"](3), f"{label}: fn(3) = {got['fn'](3)!r}"
        assert got["payload"].v == ("p", root), f"{label}: payload {got['payload'].v!r}"


# -------------------------------------------------------------------------------- optimizer --

LR = 0.1
MOMENTUM = 0.9
BATCH_PER_RANK = 4
SEED = 1234


def rank_batch(shim, rank: int, step: int, micro: int = 0, with_extra: bool = False):
    """Deterministic training data of ``rank`` for ``(step, micro)`` (a ``shims.Batch``,
    taken from the shim so this module needs no import of the shims package)."""
    Batch = shim.Batch
    rng = np.random.default_rng(10_000 + 1_000 * step + 100 * micro + rank)
    x = rng.uniform(-1, 1, (BATCH_PER_RANK, 4)).astype(np.float32)
    y = rng.uniform(-1, 1, (BATCH_PER_RANK, 2)).astype(np.float32)
    mask = np.ones(BATCH_PER_RANK, np.float32) if with_extra else None
    return Batch(x, y, mask)


def full_batch(shim, step: int, micro: int = 0, extra_rank: Optional[int] = None):
    """The concatenation of every rank's batch (what a single process would train on)."""
    return shim.Batch.concat([rank_batch(shim, r, step, micro, with_extra=(r == extra_rank))
                              for r in range(shim.size())])


def assert_weights_close(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray], label: str,
                         rtol: float, atol: float) -> None:
    for name in want:
        g, w = got[name], want[name]
        assert g.shape == w.shape, f"{label}: {name} shape {g.shape}, want {w.shape}"
        if not np.allclose(g, w, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(g.astype(np.float64) - w)))
            raise AssertionError(
                f"{label}: parameter {name} differs from single-process training on the "
                f"concatenated batch by up to {err:.3g} (rtol={rtol}, atol={atol}); "
                f"got {_brief(g)}, want {_brief(w)}")


def assert_identical_across_ranks(shim, weights: Dict[str, np.ndarray], label: str) -> None:
    """Every rank's weights equal rank 0's bit for bit (rank 0's broadcast to all)."""
    for name, w in weights.items():
        out = shim.broadcast(shim.tensor(w, "float32"), 0, f"{label}.{name}")
        root = shim.to_numpy(out)
        if not np.array_equal(root.view(np.uint32), np.ascontiguousarray(w).view(np.uint32)):
            raise AssertionError(
                f"{label}: parameter {name} on rank {shim.rank()} differs from rank 0 "
                f"(max |diff| {float(np.max(np.abs(root - w))):.3g}): ranks diverged")


def _train_and_compare(shim, variant: str, label: str, steps: int, passes: int = 1,
                       compression: str = "none", extra_rank: Optional[int] = None,
                       rtol: float = 1e-5, atol: float = 1e-6) -> None:
    r = shim.rank()
    init = shim.initial_weights(SEED)
    # distributed training, each rank on its own batch
    model = shim.make_model(init)
    opt = shim.distributed_optimizer(model, LR, MOMENTUM, variant, compression=compression,
                                     backward_passes_per_step=passes)
    try:
        for step in range(steps):
            shim.train_step(model, opt, [
                rank_batch(shim, r, step, micro, with_extra=(r == extra_rank))
                for micro in range(passes)])
    finally:
        shim.close_optimizer(opt)
    got = shim.get_weights(model)
    # the reference: one process, plain optimizer, the concatenated batch
    ref_model = shim.make_model(init)
    ref_opt = shim.make_optimizer(ref_model, LR, MOMENTUM)
    for step in range(steps):
        shim.train_step(ref_model, ref_opt, [full_batch(shim, step, micro, extra_rank)
                                             for micro in range(passes)])
    want = shim.get_weights(ref_model)
    moved = max(float(np.max(np.abs(want[k] - init[k]))) for k in init if k != "extra"
                or extra_rank is not None)
    assert moved > 1e-3, f"{label}: the reference did not train (max change {moved})"
    assert_weights_close(got, want, label, rtol, atol)
    assert_identical_across_ranks(shim, got, f"conf.same.{label}")


@case("optimizer", requires=("optimizer",))
def distributed_optimizer_matches_single_process(shim):
    """DistributedOptimizer (every variant) trained 3 steps, each rank on its own batch,
    equals single-process training on the concatenated batch (float32 tolerance); weights are
    identical bit for bit across ranks."""
    for variant in shim.optimizer_variants:
        _train_and_compare(shim, variant, f"dist.{variant}", steps=3)


@case("optimizer", requires=("optimizer", "backward_passes"))
def backward_passes_per_step(shim):
    """backward_passes_per_step=3: gradients of 3 micro-batches are summed locally, then
    averaged across ranks, once per step; equals single-process training accumulating the 3
    concatenated micro-batches."""
    for variant in shim.backward_passes_variants:
        _train_and_compare(shim, variant, f"bpps.{variant}", steps=2, passes=3)


@case("optimizer", requires=("optimizer", "fp16"))
def fp16_compressed_training(shim):
    """DistributedOptimizer with Compression.fp16 stays within float16 precision of
    single-process training; ranks stay identical bit for bit."""
    for variant in shim.optimizer_variants:
        _train_and_compare(shim, variant, f"fp16.{variant}", steps=3, compression="fp16",
                           rtol=2e-3, atol=2e-3)


@case("optimizer", requires=("optimizer",))
def parameter_without_gradient_on_some_ranks(shim):
    """A parameter used only in rank 0's forward pass (no gradient at all elsewhere): the
    step completes on every rank (no deadlock) and equals single-process training."""
    for variant in shim.optimizer_variants:
        _train_and_compare(shim, variant, f"nograd.{variant}", steps=2, extra_rank=0)


# ----------------------------------------------------------------------------------- errors --


def _timeout() -> float:
    try:
        return float(os.environ.get("BYTEPS_TIMEOUT", "120"))
    except ValueError:
        return 120.0


def _expect_mismatch(shim, fn: Callable[[], Any], what: str) -> None:
    limit = _timeout()
    t0 = time.monotonic()
    try:
        fn()
    except shim.errors.MismatchError:
        dt = time.monotonic() - t0
        assert dt < limit, (f"{what}: MismatchError came after {dt:.1f} s, more than "
                            f"BYTEPS_TIMEOUT={limit:g} s")
        return
    except Exception as e:
        dt = time.monotonic() - t0
        raise AssertionError(f"{what}: rank {shim.rank()} raised {type(e).__module__}."
                             f"{type(e).__name__} after {dt:.1f} s, want "
                             f"byteps.errors.MismatchError: {e}") from e
    raise AssertionError(f"{what}: rank {shim.rank()} got no error (want MismatchError)")


def _still_works(shim, name: str) -> None:
    out = shim.push_pull(make_input(shim, (5,), "float32", salt=600), False, name)
    check_reduced(shim, out, (5,), "float32", False, f"push_pull {name} after an error",
                  salt=600)


@case("errors")
def mismatched_shape_raises_everywhere(shim):
    """One name, shape (4 + rank,): MismatchError on every rank within BYTEPS_TIMEOUT; the
    job keeps working for other names."""
    t = shim.tensor(np.ones(4 + shim.rank()), "float32")
    _expect_mismatch(shim, lambda: shim.push_pull(t, False, "conf.err.shape"),
                     "mismatched shape")
    _still_works(shim, "conf.err.after_shape")


@case("errors")
def mismatched_dtype_raises_everywhere(shim):
    """One name and shape, float32 on rank 0 and int32 elsewhere (same byte count):
    MismatchError on every rank within BYTEPS_TIMEOUT."""
    dtype = "float32" if shim.rank() == 0 else "int32"
    t = shim.tensor(np.ones(6), dtype)
    _expect_mismatch(shim, lambda: shim.push_pull(t, False, "conf.err.dtype"),
                     "mismatched dtype")
    _still_works(shim, "conf.err.after_dtype")


@case("errors")
def mismatched_name_raises_everywhere(shim):
    """Each rank names its tensor differently at the same point of the program (same
    declaration position, dtype and shape): MismatchError on every rank within
    BYTEPS_TIMEOUT."""
    t = shim.tensor(np.ones(3), "float32")
    name = f"conf.err.name.rank{shim.rank()}"
    _expect_mismatch(shim, lambda: shim.push_pull(t, False, name), "mismatched name")
    _still_works(shim, "conf.err.after_name")


@case("errors", requires=("concurrent",))
def duplicate_in_flight_name_raises(shim):
    """Starting a second operation under a name whose first operation is unfinished raises
    ValueError at the call; the first operation then completes normally.

    Deterministic: rank 0 starts ``dup`` (which cannot finish before the other ranks join it),
    tries ``dup`` again, then releases the others through a second name ``go``; only then do
    they start ``dup``. Both names were used once before by everyone in the same order, so
    their keys agree."""
    r = shim.rank()
    names = ("conf.err.dup", "conf.err.dup.go")
    for name in names:  # first use: declare both names in the same order on every rank
        _check_sum(shim, shim.push_pull(make_input(shim, (4,), "float32", 700), False, name),
                   (4,), 700, f"warm-up {name}")
    if r == 0:
        h = shim.start(make_input(shim, (4,), "float32", 701), False, names[0])
        try:
            shim.start(make_input(shim, (4,), "float32", 702), False, names[0])
        except ValueError:
            pass
        except Exception as e:
            raise AssertionError(f"duplicate in-flight name raised {type(e).__name__}: {e} "
                                 "(want ValueError)") from e
        else:
            raise AssertionError("starting a second operation under an in-flight name did "
                                 "not raise (want ValueError)")
        _check_sum(shim, shim.push_pull(make_input(shim, (4,), "float32", 703), False,
                                        names[1]), (4,), 703, "release")
        _check_sum(shim, shim.finish(h), (4,), 701, "first in-flight operation")
    else:
        _check_sum(shim, shim.push_pull(make_input(shim, (4,), "float32", 703), False,
                                        names[1]), (4,), 703, "release")
        out = shim.finish(shim.start(make_input(shim, (4,), "float32", 701), False, names[0]))
        _check_sum(shim, out, (4,), 701, "first in-flight operation")
    _still_works(shim, "conf.err.after_dup")


def _check_sum(shim, out, shape, salt: int, label: str) -> None:
    check_reduced(shim, out, shape, "float32", False, label, salt=salt)


def _register_group_files() -> None:
    """The groups that live in files of their own, loaded by path (the pytest driver imports
    this file under another name): "compression" (compression_cases.py: it needs the
    compressors' NumPy reference) and "horovod" (horovod_cases.py)."""
    import importlib.util
    import sys

    for group in ("compression", "horovod"):
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{group}_cases.py")
        spec = importlib.util.spec_from_file_location(f"byteps_conformance_{group}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.register(case, sys.modules[__name__])


_register_group_files()
