"""Worker program of the byteps.mxnet multi-process tests::

    python tests/adapter_mxnet/workers/mxnet_worker.py MODE

Modes (each prints ``OK <n> cases`` at the end, ``FAIL <what>`` on a failed check):

* ``module``: the Module API: ``mx.mod.Module`` + ``DistributedOptimizer`` +
  ``broadcast_parameters``; every worker starts from different random parameters, trains 4
  steps on its own batch, and must end with rank 0's initial parameters trained exactly like a
  single-process Module on the concatenated batches (and bit-identical parameters on all ranks);
  then 300 push_pulls of freshly computed arrays (storage allocated lazily by MXNet).
* ``upstream``: upstream BytePS's tests/test_mxnet.py on one worker in a forced-distributed job:
  push_pull of float16/32/64 arrays of shapes (17,), (17,17), (17,17,17) returns the input
  (average over one worker); ``DistributedTrainer._init_params`` keeps every parameter's value.
* ``badinput``: the errors of bad input (run with one worker: no servers needed).
* ``auto``: ``BYTEPS_SYNC=auto`` with a stand-in cost model (``byteps.sync.cost_model`` put in
  ``sys.modules`` before ``init()``: ring from 4 KiB, tree from 64 KiB, ps below): every
  ``byteps_push_pull`` (the engine's path) declares its name with the model's choice for its
  size at the first call and sums exactly, on the CPU path and through a host copy.
* ``gather_scatter``: Horovod's ``allgather``, ``broadcast`` / ``broadcast_`` from every root and
  ``reducescatter`` (Sum, Average) and ``alltoall`` on NDArrays, and in process sets (the even
  and the odd ranks); Horovod's join (refused with several processes per machine).
* ``allreduce``: Horovod's ``allreduce`` / ``allreduce_`` with every op (Average, Sum, Min,
  Max, Product) on every dtype against the fold of every rank's inputs, the scale factors, and
  Horovod's errors (op with average, Adasum).
* ``loop``: push_pull until a peer is lost; prints ``READY`` after the first round and
  ``CAUGHT-PEERLOST <time.time()> <message>`` when ``wait_to_read`` raises PeerLostError.

``MXNET_WORKER_THROUGH_HOST=1``: every NDArray takes the path of a GPU NDArray (a pinned host
copy in and out, ``byteps.mxnet.ops._on_device``), which this CPU build of MXNet cannot make.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np

import byteps.errors as errors
import byteps.mxnet as bps

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: oracle.py
from oracle import expected_sum, rank_data

CASES = 0


def log(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str) -> None:
    log(f"FAIL {msg}")


def ok(case: str) -> None:
    global CASES
    CASES += 1
    log(f"CASE-OK {case}")


# --------------------------------------------------------------------------------- module --
B, STEPS, LR, MOMENTUM = 4, 4, 0.1, 0.9


def mlp_symbol():
    data, label = mx.sym.Variable("data"), mx.sym.Variable("lro_label")
    h = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=8, name="fc1"), act_type="tanh")
    out = mx.sym.FullyConnected(h, num_hidden=2, name="fc2")
    return mx.sym.LinearRegressionOutput(out, label, name="lro")


def batch(rank: int, step: int):
    rng = np.random.default_rng(100 * step + rank)
    return (rng.uniform(-1, 1, (B, 4)).astype(np.float32),
            rng.uniform(-1, 1, (B, 2)).astype(np.float32))


def make_module(batch_size: int):
    mod = mx.mod.Module(mlp_symbol(), data_names=["data"], label_names=["lro_label"],
                        context=mx.cpu())
    mod.bind(data_shapes=[("data", (batch_size, 4))],
             label_shapes=[("lro_label", (batch_size, 2))])
    return mod


def train(mod, optimizer, batches):
    mod.init_optimizer(kvstore=None, optimizer=optimizer)
    for x, y in batches:
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)]))
        mod.update()
    arg, _ = mod.get_params()
    return {k: v.asnumpy() for k, v in arg.items()}


def mode_module() -> None:
    rank, size = bps.rank(), bps.size()
    mod = make_module(B)
    mx.random.seed(10 + rank)  # different on every rank: the broadcast must fix that
    mod.init_params(initializer=mx.init.Uniform(0.5))
    arg, aux = mod.get_params()
    bps.broadcast_parameters(arg, root_rank=0)
    bps.broadcast_parameters(aux, root_rank=0)
    mod.set_params(arg, aux)
    init = {k: v.asnumpy().copy() for k, v in arg.items()}
    opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=LR, momentum=MOMENTUM,
                                                    rescale_grad=1.0 / B))
    got = train(mod, opt, [batch(rank, s) for s in range(STEPS)])
    # reference: one process, the concatenated batches, plain SGD
    ref = make_module(B * size)
    ref.init_params(arg_params={k: mx.nd.array(v) for k, v in init.items()}, aux_params=aux)
    full = [(np.concatenate([batch(r, s)[0] for r in range(size)]),
             np.concatenate([batch(r, s)[1] for r in range(size)])) for s in range(STEPS)]
    want = train(ref, mx.optimizer.SGD(learning_rate=LR, momentum=MOMENTUM,
                                       rescale_grad=1.0 / (B * size)), full)
    moved = max(float(np.abs(want[k] - init[k]).max()) for k in want)
    if moved < 1e-3:
        fail(f"module: the reference did not train (max change {moved})")
    for k in want:
        if not np.allclose(got[k], want[k], rtol=1e-5, atol=1e-6):
            fail(f"module: {k} differs from single-process training by "
                 f"{float(np.abs(got[k] - want[k]).max()):.3g}")
    ok("module_matches_single_process")
    digest = hashlib.sha256(b"".join(got[k].tobytes() for k in sorted(got))).hexdigest()
    root = bps.broadcast_object(digest, root_rank=0, name="module.digest")
    if root != digest:
        fail(f"module: parameters on rank {rank} differ from rank 0's")
    ok("module_identical_across_ranks")
    # Fresh arrays pushed while the operation producing them is still pending: MXNet allocates
    # their storage lazily on the engine thread (a pointer taken at the call raced with that).
    base = np.arange(5000, dtype=np.float32)
    outs = []
    for i in range(300):
        x = (mx.nd.array(base) * (i + 1)).copy()
        bps.byteps_push_pull(x, name=f"fresh.{i % 8}", is_average=False)
        outs.append((i, x))
    for i, x in outs:
        want = expected_sum(lambda r, k=i + 1: base * k, size)  # every rank pushes the same
        if not np.array_equal(x.asnumpy(), want):
            fail(f"fresh array {i}: wrong sum (max error "
                 f"{float(np.abs(x.asnumpy() - want).max()):.3g})")
            break
    ok("fresh_arrays_lazily_allocated")


# ------------------------------------------------------------------------------- upstream --
def mode_upstream() -> None:
    """upstream tests/test_mxnet.py: test_byteps_push_pull, test_byteps_trainer_param_order."""
    count = 0
    for dtype in ("float16", "float32", "float64"):
        for dim in (1, 2, 3):
            mx.random.seed(1234)
            tensor = mx.nd.random.uniform(-100, 100, shape=(17,) * dim).astype(dtype)
            expected = tensor.copy()
            name = f"tensor_{dtype}_{dim}"
            bps.byteps_declare_tensor(name)
            bps.byteps_push_pull(tensor, name=name, priority=0)
            if not np.array_equal(tensor.asnumpy(), expected.asnumpy()):
                fail(f"upstream push_pull {dtype} {(17,) * dim}: result differs from the input")
            count += 1
    ok(f"upstream_push_pull {count} tensors")
    net = mx.gluon.nn.Sequential()
    net.add(mx.gluon.nn.Dense(10, activation="relu"), mx.gluon.nn.Dense(10, activation="relu"),
            mx.gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net(mx.nd.ones((1, 7)))
    params = net.collect_params()
    before = {k: p.data().asnumpy().copy() for k, p in params.items()}
    trainer = bps.DistributedTrainer(params, "sgd", {"learning_rate": 0.1})
    trainer._init_params()
    for k, p in params.items():
        if not np.array_equal(p.data().asnumpy(), before[k]):
            fail(f"upstream trainer param order: {k} changed by the broadcast")
    ok("upstream_trainer_param_order")


# ----------------------------------------------------------------------------------- auto --
def stand_in_choose(nbytes: int) -> str:
    return "tree" if nbytes >= 65536 else "ring" if nbytes >= 4096 else "ps"


def mode_auto() -> None:
    from byteps import basics  # the declared schemes: basics' record of them

    rank, size = bps.rank(), bps.size()
    for rnd in range(2):
        for n in (10, 2000, 50_000):
            name = f"auto.{n}"
            tensor = mx.nd.array(rank_data(rank, (n,), "float32", rnd), dtype="float32")
            bps.byteps_push_pull(tensor, name=name, is_average=False)
            want = expected_sum(lambda r, n=n, rnd=rnd: rank_data(r, (n,), "float32", rnd), size)
            if not np.array_equal(tensor.asnumpy(), want.astype(np.float32)):
                fail(f"{name} round {rnd}: the sum differs")
            declared = basics._sync_of.get(name)
            if declared != stand_in_choose(n * 4):
                fail(f"{name}: declared with {declared}, the model chose "
                     f"{stand_in_choose(n * 4)}")
            ok(f"auto {name} round {rnd} sync={declared}")


# ------------------------------------------------------------------------------ allreduce --
def mode_allreduce() -> None:
    rank, size = bps.rank(), bps.size()
    fold = {bps.Sum: np.add, bps.Average: np.add, bps.Min: np.minimum, bps.Max: np.maximum,
            bps.Product: np.multiply}
    for op, np_op in fold.items():
        for dtype in ("float16", "float32", "float64", "uint8", "int8", "int32", "int64"):
            def vals(r, dtype=dtype):
                v = (np.arange(1031) * 3 + r * 7) % 5
                return (v if dtype == "uint8" else v - 2).astype(np.float64)
            want = vals(0)
            for r in range(1, size):
                want = np_op(want, vals(r))
            if op == bps.Average:
                want = want / size if dtype.startswith("float") else np.floor(want / size)
            x = mx.nd.array(vals(rank), dtype=dtype)
            out = bps.allreduce(x, name=f"ar.{op}.{dtype}", op=op)
            inplace = mx.nd.array(vals(rank), dtype=dtype)
            bps.allreduce_(inplace, name=f"ar_.{op}.{dtype}", op=op)
            for label, got in (("allreduce", out), ("allreduce_", inplace)):
                if not np.allclose(got.asnumpy().astype(np.float64), want, rtol=1e-2, atol=1e-2):
                    fail(f"{label} {op} {dtype}: {got.asnumpy()[:6]} vs {want[:6]}")
            if not np.array_equal(x.asnumpy().astype(np.float64), vals(rank)):
                fail(f"allreduce {op} {dtype} changed its input")
            ok(f"allreduce {op} {dtype}")
    y = mx.nd.full((4,), rank + 1.0)
    bps.allreduce_(y, name="ar.scaled", op=bps.Sum, prescale_factor=0.5, postscale_factor=4.0)
    if not np.allclose(y.asnumpy(), 2.0 * size * (size + 1) / 2):
        fail(f"allreduce_ scale factors: {y.asnumpy()}")
    ok("allreduce scale factors")
    expect("allreduce op and average", errors.InvalidArgumentError,
           lambda: bps.allreduce(y, average=True, op=bps.Max), ["supersedes"])
    expect("allreduce Adasum", errors.InvalidArgumentError,
           lambda: bps.allreduce(y, op=bps.Adasum), ["Adasum"])


# ------------------------------------------------------------------ allgather, reducescatter --
def mode_gather_scatter() -> None:
    rank, size = bps.rank(), bps.size()
    for dtype in ("float16", "float32", "float64", "uint8", "int32", "int64"):
        got = bps.allgather(mx.nd.full((rank + 1, 2), rank, dtype=dtype), name=f"ag.{dtype}")
        want = np.concatenate([np.full((r + 1, 2), r) for r in range(size)]).astype(dtype)
        if got.dtype != np.dtype(dtype) or not np.array_equal(got.asnumpy(), want):
            fail(f"allgather {dtype}: {got.asnumpy()}")
        ok(f"allgather {dtype}")
    for root in range(size):
        x = mx.nd.full((3, 2), rank + 1.0)
        got = bps.broadcast(x, root, name="bc")
        if not np.array_equal(got.asnumpy(), np.full((3, 2), root + 1.0)) or \
                not np.array_equal(x.asnumpy(), np.full((3, 2), rank + 1.0)):
            fail(f"broadcast from {root}: {got.asnumpy()}")
        bps.broadcast_(x, root, name="bc_")
        if not np.array_equal(x.asnumpy(), np.full((3, 2), root + 1.0)):
            fail(f"broadcast_ from {root}: {x.asnumpy()}")
        ok(f"broadcast from {root}")
    rows = 2 * size + 1
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    begin = sum(counts[:rank])
    x = mx.nd.array(np.arange(rows * 2).reshape(rows, 2) * (rank + 1), dtype="float32")
    total = np.arange(rows * 2).reshape(rows, 2) * sum(r + 1 for r in range(size))
    for op, want in ((bps.Sum, total), (bps.Average, total / size)):
        got = bps.reducescatter(x, name=f"rs.{op}", op=op)
        if not np.allclose(got.asnumpy(), want[begin:begin + counts[rank]]):
            fail(f"reducescatter {op}: {got.asnumpy()}")
        ok(f"reducescatter {op}")
    expect("reducescatter Max", errors.InvalidArgumentError,
           lambda: bps.reducescatter(x, op=bps.Max), ["Sum or Average"])
    mine = mx.nd.array(np.concatenate([np.full(((rank + j) % 3, 2), 10 * rank + j)
                                       for j in range(size)]), dtype="int32")
    got = bps.alltoall(mine, splits=[(rank + j) % 3 for j in range(size)], name="a2a")
    want = np.concatenate([np.full(((i + rank) % 3, 2), 10 * i + rank) for i in range(size)])
    if not np.array_equal(got.asnumpy(), want.astype("int32")):
        fail(f"alltoall: {got.asnumpy()}")
    ok("alltoall")
    outs = bps.grouped_allreduce([mx.nd.full((3,), rank), mx.nd.full((2,), rank + 1)],
                                 name="g.ar", op=bps.Sum)
    if outs[0].asnumpy().tolist() != [sum(range(size))] * 3 or \
            outs[1].asnumpy().tolist() != [sum(range(1, size + 1))] * 2:
        fail(f"grouped_allreduce: {[o.asnumpy() for o in outs]}")
    outs = bps.grouped_allgather([mx.nd.full((1,), rank)], name="g.ag")
    outs += bps.grouped_reducescatter([mx.nd.ones((size, 2))], name="g.rs", op=bps.Sum)
    if outs[0].asnumpy().tolist() != list(range(size)) or \
            outs[1].asnumpy().tolist() != [[float(size)] * 2]:
        fail(f"grouped_allgather / grouped_reducescatter: {[o.asnumpy() for o in outs]}")
    ok("grouped forms")
    if size > 1:
        process_sets()


def process_sets() -> None:
    """Horovod's process sets on NDArrays: the even and the odd machines' ranks each allreduce (through
    the host), allgather, broadcast from every rank of the set, reducescatter and alltoall
    among themselves; the other set's operation is an error."""
    rank, size, local = bps.rank(), bps.size(), bps.local_size()
    side = [(k // local) % 2 for k in range(size)]  # by machine: a set holds whole machines
    sets = [bps.add_process_set([k for k in range(size) if side[k] == p]) for p in (0, 1)]
    ps = sets[side[rank]]
    ranks, me, n = ps.ranks, ps.rank(), len(ps.ranks)
    x = mx.nd.full((4, 2), rank + 1.0)
    got = bps.allreduce(x, op=bps.Sum, name="ps.ar", process_set=ps)
    if not np.array_equal(got.asnumpy(), np.full((4, 2), sum(k + 1.0 for k in ranks))):
        fail(f"process set allreduce: {got.asnumpy()}")
    got = bps.allreduce(x, name="ps.avg", process_set=ps)
    if not np.allclose(got.asnumpy(), sum(k + 1.0 for k in ranks) / n):
        fail(f"process set allreduce Average: {got.asnumpy()}")
    got = bps.allgather(mx.nd.full((me + 1,), rank), name="ps.ag", process_set=ps)
    if got.asnumpy().tolist() != [k for i, k in enumerate(ranks) for _ in range(i + 1)]:
        fail(f"process set allgather: {got.asnumpy()}")
    for root in ranks:
        got = bps.broadcast(x, root, name="ps.bc", process_set=ps)
        if not np.array_equal(got.asnumpy(), np.full((4, 2), root + 1.0)):
            fail(f"process set broadcast from {root}: {got.asnumpy()}")
    got = bps.reducescatter(mx.nd.ones((n, 2)), name="ps.rs", op=bps.Sum, process_set=ps)
    if got.asnumpy().tolist() != [[float(n)] * 2]:
        fail(f"process set reducescatter: {got.asnumpy()}")
    got = bps.alltoall(mx.nd.array([[rank]] * n, dtype="int32"), name="ps.a2a",
                       process_set=ps)
    if got.asnumpy().ravel().tolist() != ranks:
        fail(f"process set alltoall: {got.asnumpy()}")
    bps.barrier(process_set=ps)
    expect("another set's allreduce", errors.InvalidArgumentError,
           lambda: bps.allreduce(x, name="ps.other", process_set=sets[1 - side[rank]]),
           ["not in"])
    ok("process sets")
    if local > 1:
        expect("join with several processes per machine", errors.ConfigError, bps.join,
               ["join()"])
        return
    if rank == 0:  # Horovod's join: the others go on without rank 0
        last = bps.join()
    else:
        got = bps.allreduce(mx.nd.full((4,), 6.0), name="join.ar")
        if not np.allclose(got.asnumpy(), 6.0 * (size - 1) / size):
            fail(f"allreduce with rank 0 joined: {got.asnumpy()}")
        got = bps.allgather(mx.nd.full((rank,), rank), name="join.ag")
        if got.asnumpy().tolist() != [r for r in range(1, size) for _ in range(r)]:
            fail(f"allgather with rank 0 joined: {got.asnumpy()}")
        last = bps.join()
    if last == 0:
        fail("join() returned 0, the rank that joined first")
    ok("join")


# ------------------------------------------------------------------------------ bad input --
def expect(case: str, exc_type, fn, words=()) -> None:
    """``fn()`` raises ``exc_type`` (which must also be a byteps.errors.BytePSError)."""
    try:
        fn()
    except exc_type as exc:
        missing = [w for w in words if w not in str(exc)]
        if not isinstance(exc, errors.BytePSError):
            fail(f"{case}: {type(exc).__name__} is not a byteps.errors.BytePSError: {exc}")
        elif missing:
            fail(f"{case}: message lacks {missing}: {exc}")
        else:
            ok(case)
    except Exception as exc:
        fail(f"{case}: {type(exc).__name__} instead of {exc_type.__name__}: {exc}")
    else:
        fail(f"{case}: no error (want {exc_type.__name__})")


def mode_badinput() -> None:
    expect("before_init", errors.NotInitializedError,
           lambda: bps.byteps_push_pull(mx.nd.ones((2,)), name="x"))
    bps.init()
    expect("numpy_array", TypeError, lambda: bps.byteps_push_pull(np.ones(3), name="np"),
           ["NDArray", "ndarray"])
    expect("python_list", TypeError, lambda: bps.byteps_push_pull([1.0, 2.0], name="list"),
           ["NDArray"])
    expect("row_sparse", TypeError, lambda: bps.byteps_push_pull(
        mx.nd.sparse.zeros("row_sparse", (4, 3)), name="rsp"), ["sparse", "row_sparse"])
    expect("csr", TypeError, lambda: bps.byteps_push_pull(
        mx.nd.sparse.zeros("csr", (4, 3)), name="csr"), ["sparse", "csr"])
    expect("bool_dtype", TypeError, lambda: bps.byteps_push_pull(
        mx.nd.array([1, 0], dtype="bool"), name="bool"), ["bool", "float32", "int64"])
    expect("empty_name", ValueError, lambda: bps.byteps_push_pull(mx.nd.ones((2,)), name=""))
    expect("int_name", TypeError, lambda: bps.byteps_push_pull(mx.nd.ones((2,)), name=3))
    expect("str_priority", TypeError, lambda: bps.byteps_push_pull(
        mx.nd.ones((2,)), name="prio", priority="high"), ["priority"])
    expect("declare_int", TypeError, lambda: bps.byteps_declare_tensor(3))
    expect("declare_empty", ValueError, lambda: bps.byteps_declare_tensor(""))
    expect("compressor_kwargs", ValueError, lambda: bps.byteps_declare_tensor(
        "g", byteps_compressor_type="twobit"), ["twobit"])
    expect("compressor_kwarg_without_prefix", ValueError, lambda: bps.byteps_declare_tensor(
        "g", compressor="onebit"), ["prefix"])
    expect("compressor_kwarg_type", TypeError, lambda: bps.byteps_declare_tensor(
        "g", byteps_seed=[1]), ["byteps_seed"])
    expect("broadcast_single_ndarray", ValueError,
           lambda: bps.broadcast_parameters(mx.nd.ones((2,))))
    expect("bad_root", ValueError,
           lambda: bps.broadcast_parameters({"a": mx.nd.ones((2,))}, root_rank=5))
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize(ctx=mx.cpu())
    expect("trainer_compressor", ValueError, lambda: bps.DistributedTrainer(
        [p], "sgd", {"learning_rate": 0.1}, compression_params={"compressor": "twobit"}),
        ["twobit"])
    expect("trainer_topk_without_k", ValueError, lambda: bps.DistributedTrainer(
        [p], "sgd", {"learning_rate": 0.1}, compression_params={"compressor": "topk"}),
        ["'k'"])
    expect("trainer_nesterov_without_mu", ValueError, lambda: bps.DistributedTrainer(
        [p], "sgd", {"learning_rate": 0.1},
        compression_params={"compressor": "onebit", "momentum": "nesterov"}), ["mu"])
    expect("optimizer_not_optimizer", TypeError, lambda: bps.DistributedOptimizer("sgd"))
    expect("trainer_compression_type", TypeError, lambda: bps.DistributedTrainer(
        [p], "sgd", {"learning_rate": 0.1}, compression_params=5))
    # odd shapes work: 0-d and one element (MXNet's legacy shape semantics have no
    # zero-size arrays)
    for shape in ((), (1,), (1, 1, 1)):
        t = mx.nd.array(np.full(shape, 3.0, np.float32))
        bps.byteps_push_pull(t, name=f"odd{len(shape)}", is_average=False)
        if not np.array_equal(t.asnumpy(), np.full(shape, 3.0 * bps.size(), np.float32)):
            fail(f"push_pull of shape {shape}: {t.asnumpy()!r}")
    ok("odd_shapes")


# ----------------------------------------------------------------------------------- loop --
def mode_loop() -> int:
    t = mx.nd.ones((50000,))
    start, ready = time.monotonic(), False
    while time.monotonic() - start < 120:
        bps.byteps_push_pull(t, name="loop", is_average=True)
        try:
            t.wait_to_read()
        except errors.PeerLostError as exc:
            log(f"CAUGHT-PEERLOST {time.time():.3f} {exc}")
            return 1
        except Exception as exc:
            fail(f"expected PeerLostError, got {type(exc).__module__}.{type(exc).__name__}: "
                 f"{exc}")
            return 1
        if not ready:
            log(f"READY pid={os.getpid()}")
            ready = True
        time.sleep(0.01)
    fail("no error within 120 s")
    return 1


def main(argv) -> int:
    mode = argv[0]
    through_host = os.environ.get("MXNET_WORKER_THROUGH_HOST") == "1"
    if through_host:
        bps.ops._on_device = lambda tensor: True
    if mode == "loop":
        bps.init()
        return mode_loop()
    if mode == "auto":
        import types
        model = types.ModuleType("byteps.sync.cost_model")
        model.choose = stand_in_choose
        sys.modules["byteps.sync.cost_model"] = model
    if mode == "badinput":
        mode_badinput()
    else:
        bps.init()
        {"module": mode_module, "upstream": mode_upstream, "auto": mode_auto,
         "allreduce": mode_allreduce, "gather_scatter": mode_gather_scatter}[mode]()
    if through_host:
        if not bps.ops._host_copies:
            fail("MXNET_WORKER_THROUGH_HOST=1, but no array went through a host copy")
        ok(f"{len(bps.ops._host_copies)} names went through a pinned host copy")
    bps.shutdown()
    log(f"OK {CASES} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
