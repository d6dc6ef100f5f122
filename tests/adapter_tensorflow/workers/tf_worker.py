"""One rank of the multi-process byteps.tensorflow checks (run under the launcher).

Prints ``TF_WORKER_OK rank=<r> size=<n> cases=<k>`` when every check passed, else
``TF_WORKER_FAILED`` and the failures (exit code 1). Argument: a scratch directory.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: oracle.py

import numpy as np
import tensorflow as tf

import byteps.keras as bk
import byteps.tensorflow as bps
from byteps.tensorflow import _keras

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.get_logger().setLevel("ERROR")
import keras  # noqa: E402
from oracle import expected_push_pull, expected_sum  # noqa: E402

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.uint8, tf.int32,
          tf.int64]
failures = []
cases = [0]


def check(cond, msg):
    cases[0] += 1
    if not cond:
        failures.append(msg)
        print(f"FAIL rank {bps.rank()}: {msg}", flush=True)


def close(a, b, rtol=1e-5, atol=1e-6):
    return np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol,
                       atol=atol)


def run(label, fn):
    try:
        fn()
    except Exception:
        cases[0] += 1
        failures.append(f"{label} raised:\n{traceback.format_exc()}")
        print(f"FAIL rank {bps.rank()}: {label}\n{traceback.format_exc()}", flush=True)


def same_on_all_ranks(values, name):
    """True if the float64 vector ``values`` equals rank 0's."""
    mine = tf.constant(np.asarray(values, np.float64).ravel())
    root = bps.broadcast(mine, 0, name=name)
    return np.array_equal(root.numpy(), mine.numpy())


R = N = 0


def t_push_pull():
    f_sum = tf.function(lambda t: bps.push_pull(t, op=bps.Sum))
    f_avg = tf.function(lambda t: bps.push_pull(t, op=bps.Average))
    for dt in DTYPES:
        base = np.arange(10).reshape(2, 5) % 7
        x = tf.cast(base + R, dt)
        total = expected_sum(lambda r, b=base: b + r, N)
        limit = {tf.int8: 127, tf.uint8: 255}.get(dt)
        check(limit is None or total.max() <= limit, "test data fits")
        for label, s, a in (("eager", bps.push_pull(x, op=bps.Sum, name=f"pp.{dt.name}"),
                             bps.push_pull(x, name=f"ppa.{dt.name}")),
                            ("graph", f_sum(x), f_avg(x))):
            check(s.dtype == dt and s.shape == (2, 5), f"{label} {dt.name} dtype/shape")
            check(np.array_equal(s.numpy().astype(np.float64), total), f"{label} sum {dt.name}")
            expect = expected_push_pull(lambda r, b=base: b + r, N, True, dt.name)
            rtol = {tf.float16: 2e-3, tf.bfloat16: 1.6e-2}.get(dt, 1e-6)
            check(close(a.numpy(), expect, rtol=rtol, atol=rtol),
                  f"{label} average {dt.name}: {a.numpy()} vs {expect}")


def t_allreduce_ops():
    """Horovod's allreduce with Min, Max, Product (every dtype, eager and in tf.function),
    the scale factors, and its errors."""
    fold = {bps.Min: np.minimum, bps.Max: np.maximum, bps.Product: np.multiply}
    graph = {op: tf.function(lambda t, o=op: bps.allreduce(t, op=o)) for op in fold}
    for op, np_op in fold.items():
        for dt in DTYPES:
            def vals(r, dt=dt):
                v = (np.arange(12) * 3 + r * 7) % 5
                return v if dt == tf.uint8 else v - 2
            want = vals(0).astype(np.float64)
            for r in range(1, N):
                want = np_op(want, vals(r))
            x = tf.cast(vals(R), dt)
            eager = bps.allreduce(x, op=op, name=f"ar.{op}.{dt.name}")
            check(eager.dtype == dt and np.array_equal(eager.numpy().astype(np.float64), want),
                  f"eager allreduce {op} {dt.name}: {eager.numpy()} vs {want}")
            g = graph[op](x)
            check(np.array_equal(g.numpy().astype(np.float64), want),
                  f"graph allreduce {op} {dt.name}: {g.numpy()} vs {want}")
    x = tf.fill([4], float(R + 1))
    got = bps.allreduce(x, op=bps.Sum, prescale_factor=0.5, postscale_factor=4.0, name="ar.sc")
    check(close(got.numpy(), 2.0 * float(expected_sum(lambda r: r + 1, N))),
          f"allreduce scale factors: {got.numpy()}")
    for what, fn in (("op and average", lambda: bps.allreduce(x, average=True, op=bps.Max)),
                     ("unknown op", lambda: bps.allreduce(x, op="Mean")),
                     ("Adasum", lambda: bps.allreduce(x, op=bps.Adasum))):
        try:
            fn()
            check(False, f"allreduce {what}: no error")
        except ValueError:
            check(True, what)


def t_broadcast():
    f = tf.function(lambda t, root: bps.broadcast(t, root), reduce_retracing=False)
    for root in range(N):
        for dt in (tf.float32, tf.bfloat16, tf.int64, tf.uint8):
            x = tf.cast(tf.fill([3], R + 1), dt)
            out = bps.broadcast(x, root, name=f"bc.{root}.{dt.name}")
            check(np.array_equal(out.numpy().astype(np.float64), [root + 1] * 3),
                  f"eager broadcast root {root} {dt.name}")
        g = tf.function(lambda t, rr=root: bps.broadcast(t, rr))(tf.fill([2], float(R)))
        check(np.array_equal(g.numpy(), [root, root]), f"graph broadcast root {root}")
    del f
    v = [tf.Variable(tf.fill([4], float(R)), name="bv0"),
         tf.Variable(tf.fill([2, 2], R), name="bv1"), tf.Variable(float(R * 10), name="bv2")]
    for root in range(N):
        for var, val in zip(v, (float(R), R, float(R * 10))):
            var.assign(tf.fill(var.shape, tf.cast(val, var.dtype)))
        bps.broadcast_variables(v, root)
        check(np.all(v[0].numpy() == root) and np.all(v[1].numpy() == root)
              and float(v[2].numpy()) == root * 10, f"broadcast_variables root {root}")
    # broadcast gradient: sum of upstream grads on the root, zero elsewhere
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        y = bps.broadcast(w * 1.0, 0, name="bc.grad")
        loss = tf.reduce_sum(y) * (R + 1)
    g = tape.gradient(loss, w).numpy()
    expect = float(expected_sum(lambda r: r + 1, N)) if R == 0 else 0.0
    check(np.allclose(g, expect), f"broadcast gradient {g} vs {expect}")


def t_push_pull_gradient():
    w = tf.Variable([1.0, 2.0, 3.0])
    with tf.GradientTape() as tape:
        y = bps.push_pull(w * (R + 1.0), op=bps.Sum, name="pp.grad")
        loss = tf.reduce_sum(y * (R + 1.0))
    g = tape.gradient(loss, w).numpy()
    # d/dw_r sum_q (sum_s w_s (s+1)) (q+1) = (r+1) * sum_q (q+1)
    expect = (R + 1) * float(expected_sum(lambda q: q + 1, N))
    check(np.allclose(g, expect), f"push_pull gradient {g} vs {expect}")


def data(n_per_rank, batch, seed=0):
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=(n_per_rank * N, 8)).astype(np.float32)
    yg = rng.integers(0, 3, size=(n_per_rank * N,)).astype(np.int64)
    # global batch k = concatenation of every rank's batch k
    idx = np.concatenate([np.arange(k * batch * N + R * batch, k * batch * N + (R + 1) * batch)
                          for k in range(n_per_rank // batch)])
    return xg, yg, xg[idx], yg[idx]


def make_model(seed, emb=False):
    keras.utils.set_random_seed(seed)
    if emb:
        return keras.Sequential([keras.Input(shape=(4,), dtype="int32"),
                                 keras.layers.Embedding(20, 3), keras.layers.Flatten(),
                                 keras.layers.Dense(3)])
    return keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(3)])


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def t_tape():
    B = 8
    xg, yg, xs, ys = data(32, B)
    ref, dist = make_model(7), make_model(7)
    opt_r, opt_d = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)

    @tf.function
    def step_dist(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, dist(xb))
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(loss, dist.trainable_variables)
        opt_d.apply_gradients(zip(grads, dist.trainable_variables))

    @tf.function
    def step_ref(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, ref(xb))
        grads = tape.gradient(loss, ref.trainable_variables)
        opt_r.apply_gradients(zip(grads, ref.trainable_variables))

    for k in range(4):
        step_dist(xs[k * B:(k + 1) * B], ys[k * B:(k + 1) * B])
        step_ref(xg[k * B * N:(k + 1) * B * N], yg[k * B * N:(k + 1) * B * N])
    ok = all(close(a, b, 1e-4, 1e-5) for a, b in zip(dist.get_weights(), ref.get_weights()))
    check(ok, "DistributedGradientTape equals single-process training on the global batch")


def t_keras_fit(tmpdir):
    B, E = 8, 2
    xg, yg, xs, ys = data(32, B, seed=1)
    ref = make_model(11)
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss=LOSS)
    ref.fit(xg, yg, batch_size=B * N, epochs=E, shuffle=False, verbose=0)
    dist = make_model(11)
    dist.compile(optimizer=bk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)),
                 loss=LOSS)
    dist.fit(xs, ys, batch_size=B, epochs=E, shuffle=False, verbose=0)
    ok = all(close(a, b, 1e-4, 1e-5) for a, b in zip(dist.get_weights(), ref.get_weights()))
    check(ok, "Keras DistributedOptimizer in model.fit equals single-process training")

    # load_model: a distributed optimizer with the saved state
    path = os.path.join(tmpdir, f"model_rank{R}.keras")
    dist.save(path)
    loaded = bk.load_model(path)
    check(_keras.is_distributed(loaded.optimizer), "load_model returns a distributed optimizer")
    check(all(close(a, b, 0, 0) for a, b in zip(loaded.optimizer.variables,
                                                dist.optimizer.variables)),
          "load_model restores the optimizer state")
    loaded.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
    check(same_on_all_ranks(np.concatenate([w.ravel() for w in loaded.get_weights()]),
                            "chk.loaded"), "loaded model trains identically on every rank")


def t_callbacks():
    B, E, W = 8, 2, 2
    xg, yg, xs, ys = data(32, B, seed=2)
    steps = len(xs) // B
    model = make_model(100 + R)  # different initial weights per rank
    model.compile(optimizer=bk.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9)),
                  loss=LOSS, metrics=["accuracy"])
    seen = {"lr": [], "mom": [], "raw": [], "avg": [], "w_after_first": None}

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen["lr"].append(float(keras.ops.convert_to_numpy(
                self.model.optimizer.learning_rate)))
            seen["mom"].append(float(self.model.optimizer.momentum))

        def on_train_batch_end(self, batch, logs=None):
            if seen["w_after_first"] is None:
                seen["w_after_first"] = np.concatenate(
                    [w.ravel() for w in self.model.get_weights()])

    class Raw(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen["raw"].append(dict(logs))

    class Avg(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen["avg"].append(dict(logs))

    model.fit(xs, ys, batch_size=B, epochs=E, shuffle=False, verbose=0,
              callbacks=[bk.callbacks.BroadcastGlobalVariablesCallback(0),
                         bk.callbacks.LearningRateWarmupCallback(initial_lr=0.2,
                                                                 warmup_epochs=W),
                         Record(), Raw(), bk.callbacks.MetricAverageCallback(), Avg()])
    expect = [0.2 / N * ((e + (b + 1) / steps) * (N - 1) / W + 1)
              for e in range(E) for b in range(steps)]
    check(close(seen["lr"], expect, 1e-5), f"warmup lr per batch {seen['lr']} vs {expect}")
    ratios = [0.9 * expect[0] / 0.2] + [0.9 * expect[i] / expect[i - 1]
                                        for i in range(1, len(expect))]
    check(close(seen["mom"], ratios, 1e-5), "momentum correction per batch")
    check(float(model.optimizer.momentum) == 0.9, "momentum restored")
    check(same_on_all_ranks(seen["w_after_first"], "chk.first"),
          "weights identical after the first batch (BroadcastGlobalVariablesCallback)")
    for e in range(E):
        keys = sorted(seen["raw"][e])
        raw = [seen["raw"][e][k] for k in keys]
        avg = [seen["avg"][e][k] for k in keys]
        mean = bps.push_pull(tf.constant(raw, tf.float64), name=f"chk.mean.{len(keys)}")
        check(close(avg, mean.numpy(), 1e-9), f"metrics averaged epoch {e}")
        check(same_on_all_ranks(avg, f"chk.avg.{len(keys)}"), f"metrics identical epoch {e}")
    check(same_on_all_ranks(np.concatenate([w.ravel() for w in model.get_weights()]),
                            "chk.final"), "weights identical at the end")


def t_embedding():
    model = make_model(200 + R, emb=True)
    model.compile(optimizer=bk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=LOSS)
    rng = np.random.default_rng(R)
    x = rng.integers(0, 20, size=(16, 4)).astype(np.int32)
    y = rng.integers(0, 3, size=(16,)).astype(np.int64)
    bk.broadcast_global_variables(model, 0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    check(same_on_all_ranks(np.concatenate([w.ravel() for w in model.get_weights()]),
                            "chk.emb"), "Embedding (IndexedSlices) model identical on all ranks")
    # the tape densifies the embedding's IndexedSlices gradient and averages it
    emb = model.layers[0].embeddings
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [R, 5]))
    g = bps.DistributedGradientTape(tape).gradient(loss, emb)
    expect = np.zeros(emb.shape)
    for r in range(N):
        expect[r] += 1.0 / N
    expect[5] += 1.0
    check(isinstance(g, tf.Tensor) and close(g.numpy(), expect), "IndexedSlices averaged")


def t_gather_scatter():
    """Horovod's allgather (uneven, several dtypes, eager and in tf.function, gradient),
    reducescatter (Sum, Average, rows that do not divide, gradient) and alltoall."""
    def rows_of(r, dt, rows):
        v = (np.arange(rows * 3) * 3 + r * 7) % 5
        return tf.cast(np.reshape(v if dt == tf.uint8 else v - 2, (rows, 3)), dt)

    graph_ag = tf.function(lambda t: bps.allgather(t, name="ag.graph"))
    for dt in DTYPES + [tf.bool]:
        mine = rows_of(R, dt, R + 1) if dt != tf.bool else tf.fill([R + 1, 3], R % 2 == 0)
        want = np.concatenate([(rows_of(r, dt, r + 1) if dt != tf.bool else
                                tf.fill([r + 1, 3], r % 2 == 0)).numpy() for r in range(N)])
        got = bps.allgather(mine, name=f"ag.{dt.name}")
        check(got.dtype == dt and np.array_equal(got.numpy(), want), f"allgather {dt.name}")
        if dt == tf.float32:
            check(np.array_equal(graph_ag(mine).numpy(), want), "allgather in tf.function")
    v = tf.Variable(tf.fill([R + 1, 2], 1.0))
    with tf.GradientTape() as tape:
        out = bps.allgather(v * float(R + 1), name="ag.grad")
        loss = tf.reduce_sum(out * tf.cast(tf.range(tf.shape(out)[0])[:, None], tf.float32))
    g = tape.gradient(loss, v).numpy()
    start = sum(k + 1 for k in range(R))
    want = np.repeat(np.arange(start, start + R + 1)[:, None], 2, 1) * float(R + 1)
    check(np.allclose(g, want), f"allgather gradient {g}")
    rows = 2 * N + 1
    counts = [rows // N + (1 if k < rows % N else 0) for k in range(N)]
    begin = sum(counts[:R])
    graph_rs = tf.function(lambda t: bps.reducescatter(t, name="rs.graph", op=bps.Sum))
    for dt in DTYPES:
        total = sum(rows_of(r, dt, rows).numpy().astype(np.float64) for r in range(N))
        got = bps.reducescatter(rows_of(R, dt, rows), name=f"rs.{dt.name}", op=bps.Sum)
        check(got.dtype == dt and got.shape == (counts[R], 3) and
              np.allclose(got.numpy().astype(np.float64), total[begin:begin + counts[R]]),
              f"reducescatter Sum {dt.name}")
        if dt == tf.float32:
            got = graph_rs(rows_of(R, dt, rows))
            check(np.allclose(got.numpy(), total[begin:begin + counts[R]]),
                  "reducescatter in tf.function")
            got = bps.reducescatter(rows_of(R, dt, rows), name="rs.avg")
            check(np.allclose(got.numpy(), total[begin:begin + counts[R]] / N),
                  "reducescatter Average")
    v = tf.Variable(tf.ones([rows, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(bps.reducescatter(v, name="rs.grad") * float(R + 1))
    g = tape.gradient(loss, v).numpy()
    want = np.concatenate([np.full((counts[k], 2), (k + 1) / N) for k in range(N)])
    check(np.allclose(g, want), f"reducescatter gradient {g}")
    try:
        bps.reducescatter(tf.ones([4]), op=bps.Max, name="rs.max")
        check(False, "reducescatter Max: no error")
    except ValueError:
        check(True, "reducescatter Max")
    outs = bps.grouped_allreduce([tf.fill([3], float(R)), tf.fill([2], R)], op=bps.Sum,
                                 name="g.ar")
    check(np.allclose(outs[0].numpy(), sum(range(N))) and
          outs[1].numpy().tolist() == [sum(range(N))] * 2, "grouped_allreduce")
    outs = bps.grouped_allgather([tf.fill([1], R), tf.fill([2, 2], float(R))], name="g.ag")
    check(outs[0].numpy().tolist() == list(range(N)) and outs[1].shape == (2 * N, 2),
          "grouped_allgather")
    outs = bps.grouped_reducescatter([tf.ones([N]), tf.ones([N, 2])], name="g.rs", op=bps.Sum)
    check(outs[0].numpy().tolist() == [float(N)] and outs[1].shape == (1, 2),
          "grouped_reducescatter")
    objs = bps.allgather_object(("r", R), name="obj")
    check(objs == [("r", k) for k in range(N)], f"allgather_object {objs}")
    graph_a2a = tf.function(lambda t, sp: bps.alltoall(t, splits=sp, name="a2a.graph"))
    for dt in (tf.float32, tf.int64, tf.bool):
        def block(i, j, dt=dt):
            x = np.full(((i + j) % 3, 2), 10 * i + j)
            return tf.cast(x % 2 == 0, dt) if dt == tf.bool else tf.cast(x, dt)
        mine = tf.concat([block(R, j) for j in range(N)], 0)
        splits = [(R + j) % 3 for j in range(N)]
        want = tf.concat([block(i, R) for i in range(N)], 0).numpy()
        out, received = bps.alltoall(mine, splits=splits, name=f"a2a.{dt.name}")
        check(np.array_equal(out.numpy(), want) and
              received.numpy().tolist() == [(i + R) % 3 for i in range(N)], f"alltoall {dt.name}")
        if dt == tf.float32:
            out, received = graph_a2a(mine, tf.constant(splits))
            check(np.array_equal(out.numpy(), want), "alltoall in tf.function")


def t_sync_batch_norm():
    """SyncBatchNormalization on every rank's batch (sizes differ) equals BatchNormalization on
    their concatenation: outputs, the input's gradient, the moving statistics."""
    def batch(r):
        rng = np.random.default_rng(50 + r)
        return rng.standard_normal((3 + r, 4, 4, 5)).astype(np.float32) * (r + 1) + r

    whole = np.concatenate([batch(r) for r in range(N)])
    start = sum(3 + r for r in range(R))
    weights = np.random.default_rng(7).standard_normal(whole.shape).astype(np.float32)
    ref = tf.keras.layers.BatchNormalization(momentum=0.9)
    x = tf.constant(whole)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ref(x, training=True)
        loss = tf.reduce_sum(y * weights)
    want_dx = tape.gradient(loss, x).numpy()[start:start + 3 + R]
    sync = bps.SyncBatchNormalization(momentum=0.9)
    mine = tf.constant(batch(R))
    with tf.GradientTape() as tape:
        tape.watch(mine)
        y_mine = sync(mine, training=True)
        loss = tf.reduce_sum(y_mine * weights[start:start + 3 + R])
    dx = tape.gradient(loss, mine).numpy()
    check(np.allclose(y_mine.numpy(), y.numpy()[start:start + 3 + R], atol=1e-4),
          "SyncBatchNormalization output")
    check(np.allclose(dx, want_dx, atol=1e-4), f"SyncBatchNormalization input gradient "
          f"{np.abs(dx - want_dx).max()}")
    check(np.allclose(sync.moving_mean.numpy(), ref.moving_mean.numpy(), atol=1e-5) and
          np.allclose(sync.moving_variance.numpy(), ref.moving_variance.numpy(), atol=1e-4),
          "SyncBatchNormalization moving statistics")
    check(np.allclose(sync(mine, training=False).numpy(), ref(mine, training=False).numpy(),
                      atol=1e-5), "SyncBatchNormalization inference")


def t_process_sets():
    """Horovod's process sets: the even and the odd ranks each run allreduce (eager and in
    tf.function), broadcast from every rank of the set, allgather, reducescatter, alltoall, a
    grouped allreduce, DistributedGradientTape(process_set=...) and a barrier among
    themselves; an operation of the other set is an error."""
    sets = [bps.add_process_set([k for k in range(N) if k % 2 == p]) for p in (0, 1)]
    ps = sets[R % 2]
    ranks, me, n = ps.ranks, ps.rank(), len(ps.ranks)

    def x(k, rows=4):
        return tf.cast(np.arange(rows * 2).reshape(rows, 2) * 3 + k * 7, tf.float32)

    total = sum(x(k).numpy() for k in ranks)
    got = bps.allreduce(x(R), op=bps.Sum, name="ps.ar", process_set=ps)
    check(np.array_equal(got.numpy(), total), "process set allreduce Sum")
    graph = tf.function(lambda t: bps.allreduce(t, name="ps.ar.graph", process_set=ps))
    check(close(graph(x(R)).numpy(), total / n), "process set allreduce Average in tf.function")
    for root in ranks:
        got = bps.broadcast(x(R), root, name="ps.bc", process_set=ps)
        check(np.array_equal(got.numpy(), x(root).numpy()), f"process set broadcast {root}")
    got = bps.allgather(x(R, me + 1), name="ps.ag", process_set=ps)
    check(np.array_equal(got.numpy(), np.concatenate([x(k, i + 1).numpy()
                                                      for i, k in enumerate(ranks)])),
          "process set allgather")
    rows = 2 * n + 1
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    got = bps.reducescatter(x(R, rows), op=bps.Sum, name="ps.rs", process_set=ps)
    begin = sum(counts[:me])
    check(np.array_equal(got.numpy(), sum(x(k, rows).numpy() for k in ranks)[begin:begin + counts[me]]),
          "process set reducescatter")
    out, received = bps.alltoall(x(R, n), name="ps.a2a", process_set=ps)
    check(np.array_equal(out.numpy(), np.concatenate([x(k, n).numpy()[me:me + 1] for k in ranks]))
          and received.numpy().tolist() == [1] * n, "process set alltoall")
    outs = bps.grouped_allreduce([x(R), x(R) * 2], op=bps.Sum, name="ps.gar", process_set=ps)
    check(np.array_equal(outs[1].numpy(), 2 * total), "process set grouped_allreduce")
    v = tf.Variable(tf.ones([3]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * float(R + 1))
    tape = bps.DistributedGradientTape(tape, process_set=ps)
    g = tape.gradient(loss, [v])[0].numpy()
    check(close(g, np.full(3, sum(k + 1 for k in ranks) / n)),
          f"DistributedGradientTape(process_set) {g}")
    bps.barrier(process_set=ps)
    try:
        bps.allreduce(tf.ones([2]), name="ps.other", process_set=sets[1 - R % 2])
        check(False, "an operation of the other set: no error")
    except ValueError:
        check(True, "an operation of the other set")


def t_join():
    """Horovod's join: rank 0 joins at once; the others' allreduce Average (the joined rank
    counts as zeros), allgather (no rows from it) and broadcast complete without it; join()
    returns the same rank everywhere, not 0."""
    if R == 0:
        last = bps.join()
    else:
        got = bps.allreduce(tf.fill([4], 6.0), name="join.ar")
        check(close(got.numpy(), np.full(4, 6.0 * (N - 1) / N)), f"join allreduce {got}")
        got = bps.allgather(tf.fill([R, 2], R), name="join.ag")
        want = np.concatenate([np.full((r, 2), r) for r in range(1, N)])
        check(np.array_equal(got.numpy(), want), "join allgather")
        got = bps.broadcast(tf.fill([3], float(R)), N - 1, name="join.bc")
        check(np.array_equal(got.numpy(), np.full(3, float(N - 1))), "join broadcast")
        last = bps.join()
    check(last != 0 and bps.allgather_object(last, name="join.last") == [last] * N,
          f"join() returned {last}")
    last = int(tf.function(bps.join)())  # inside tf.function: every rank joins at once
    check(0 <= last < N, f"join() in tf.function returned {last}")


def main():
    global R, N
    tmpdir = sys.argv[1]
    t0 = time.time()
    bps.init()
    R, N = bps.rank(), bps.size()
    run("push_pull", t_push_pull)
    run("allreduce ops", t_allreduce_ops)
    run("allgather and reducescatter", t_gather_scatter)
    run("sync batch norm", t_sync_batch_norm)
    if N > 1:
        run("process sets", t_process_sets)
        run("join", t_join)
    run("broadcast", t_broadcast)
    run("push_pull gradient", t_push_pull_gradient)
    run("tape", t_tape)
    run("keras fit", lambda: t_keras_fit(tmpdir))
    run("callbacks", t_callbacks)
    run("embedding", t_embedding)
    tag = "TF_WORKER_FAILED" if failures else "TF_WORKER_OK"
    print(f"{tag} rank={R} size={N} cases={cases[0]} time={time.time() - t0:.1f}s",
          flush=True)
    for f in failures[:20]:
        print("  - " + f.replace("\n", "\n    "), flush=True)
    bps.shutdown()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
