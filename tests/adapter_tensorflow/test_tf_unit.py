"""In-process tests of byteps.tensorflow (a single-process job, size 1, through the real core):
argument validation, op/average resolution, push_pull/broadcast semantics eagerly and in
tf.function for every supported dtype, gradients, the tape, the optimizers, the Keras fronts.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tensorflow

import byteps.tensorflow as bps  # noqa: E402
from byteps.errors import NotInitializedError  # noqa: E402

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.uint8, tf.int32,
          tf.int64]


@pytest.fixture(scope="module", autouse=True)
def _job():
    bps.init()
    yield
    bps.shutdown()


def test_not_initialized_then_reinit():
    bps.shutdown()
    try:
        for fn in (bps.size, bps.rank, bps.local_size, bps.local_rank):
            with pytest.raises(NotInitializedError):
                fn()
        with pytest.raises(NotInitializedError):
            bps.push_pull(tf.ones([2]), name="unit.noinit")
        with pytest.raises(NotInitializedError):
            bps.broadcast(tf.ones([2]), 0)
    finally:
        bps.init()
    assert bps.size() == 1 and bps.rank() == 0 and bps.is_initialized()


def test_exports():
    for name in ["init", "shutdown", "size", "rank", "local_size", "local_rank", "push_pull",
                 "broadcast", "broadcast_variables", "DistributedOptimizer",
                 "DistributedGradientTape", "Compression", "Average", "Sum", "Adasum",
                 "broadcast_object"]:
        assert hasattr(bps, name), name
    assert (bps.Average, bps.Sum, bps.Adasum) == ("Average", "Sum", "Adasum")


@pytest.mark.parametrize("bad", [[1.0, 2.0], np.ones(3, np.float32), 3.0, "x", None])
def test_non_tensor_rejected(bad):
    with pytest.raises(TypeError, match="expected a tf.Tensor"):
        bps.push_pull(bad, name="unit.bad")


@pytest.mark.parametrize("value", [tf.constant([True]), tf.constant(["a"]),
                                   tf.constant([1 + 2j]), tf.constant([1], tf.int16)])
def test_unsupported_dtype(value):
    with pytest.raises(TypeError, match="supported dtypes: float16, bfloat16"):
        bps.push_pull(value, name="unit.dtype")


def test_ragged_and_sparse_rejected():
    with pytest.raises(TypeError, match="RaggedTensor"):
        bps.push_pull(tf.ragged.constant([[1.0], [2.0, 3.0]]), name="unit.ragged")
    with pytest.raises(TypeError, match="SparseTensor"):
        bps.push_pull(tf.sparse.from_dense(tf.eye(2)), name="unit.sparse")


def test_op_average_resolution():
    x = tf.constant([1.0, 2.0])
    with pytest.raises(ValueError, match="not both"):
        bps.push_pull(x, average=True, op=bps.Sum)
    with pytest.raises(ValueError, match="Adasum"):
        bps.push_pull(x, op=bps.Adasum)
    with pytest.raises(ValueError, match="unknown op"):
        bps.push_pull(x, op="Mean")  # Max, Min, Product are ops now (docs/collectives.md)
    with pytest.raises(ValueError, match="Adasum"):
        bps.DistributedGradientTape(tf.GradientTape(), op=bps.Adasum)
    with pytest.raises(ValueError, match="Adasum"):
        bps.DistributedOptimizer(tf.keras.optimizers.SGD(), op=bps.Adasum)
    np.testing.assert_array_equal(bps.push_pull(x, average=False).numpy(), [1.0, 2.0])


def test_bad_root_and_name():
    with pytest.raises(ValueError, match="root_rank"):
        bps.broadcast(tf.ones([1]), 1)
    with pytest.raises(ValueError, match="root_rank"):
        bps.broadcast_variables([tf.Variable(1.0)], -1)
    with pytest.raises(ValueError, match="name"):
        bps.push_pull(tf.ones([1]), name="")
    with pytest.raises(TypeError, match="expected tf.Variable"):
        bps.broadcast_variables([tf.ones([1])], 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_size_one_semantics(dtype):
    x = tf.cast(tf.reshape(tf.range(12), [3, 4]), dtype)
    for op in (bps.Average, bps.Sum):
        y = bps.push_pull(x, op=op, name=f"unit.{dtype.name}")
        assert y.dtype == dtype and y.shape == x.shape
        np.testing.assert_array_equal(y.numpy(), x.numpy())
    f = tf.function(lambda t: (bps.push_pull(t, op=bps.Sum), bps.broadcast(t, 0)))
    s, b = f(x)
    assert s.shape == x.shape and b.shape == x.shape  # static shapes survive numpy_function
    np.testing.assert_array_equal(s.numpy(), x.numpy())
    np.testing.assert_array_equal(b.numpy(), x.numpy())
    # 0-d and empty tensors
    np.testing.assert_array_equal(bps.push_pull(tf.cast(7, dtype)).numpy(), 7)
    assert bps.push_pull(tf.zeros([0, 3], dtype)).shape == (0, 3)


def test_name_reuse_with_other_shape_and_dynamic_shape():
    for n in (2, 5, 2):
        np.testing.assert_array_equal(bps.push_pull(tf.ones([n]), name="unit.reuse").numpy(),
                                      np.ones(n))
    f = tf.function(lambda t: bps.push_pull(t),
                    input_signature=[tf.TensorSpec([None], tf.float32)])
    for n in (3, 4):
        np.testing.assert_array_equal(f(tf.ones([n])).numpy(), np.ones(n))


def test_gradient_of_push_pull_and_broadcast():
    v = tf.Variable([1.0, 2.0, 3.0])
    with tf.GradientTape(persistent=True) as tape:
        y = bps.push_pull(v * 2.0, name="unit.grad")
        b = bps.broadcast(v * 3.0, 0, name="unit.bgrad")
        loss = tf.reduce_sum(y * y) + tf.reduce_sum(b)
    np.testing.assert_allclose(tape.gradient(loss, v).numpy(), 8.0 * v.numpy() + 3.0)

    @tf.function
    def g():
        with tf.GradientTape() as t:
            out = tf.reduce_sum(bps.push_pull(v, op=bps.Sum) ** 2)
        return t.gradient(out, v)

    np.testing.assert_allclose(g().numpy(), 2.0 * v.numpy())


def test_compression_fp16():
    x = tf.constant([1.5, -2.25], tf.float32)
    c, ctx = bps.Compression.fp16.compress(x)
    assert c.dtype == tf.float16 and ctx == tf.float32
    y = bps.push_pull(x, compression=bps.Compression.fp16, name="unit.fp16")
    assert y.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    i = tf.constant([1, 2])
    assert bps.Compression.fp16.compress(i)[0] is i
    assert bps.Compression.none.compress(x) == (x, None)


def test_broadcast_variables_and_tape_with_indexed_slices():
    emb = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [6, 2]), name="emb")
    w = tf.Variable(tf.ones([2]), name="w")
    assert bps.broadcast_variables([emb, w], 0) is None
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [1, 3]) * w)
    raw = None
    tape2 = bps.DistributedGradientTape(tape, sparse_as_dense=False)
    grads = tape2.gradient(loss, [emb, w])
    assert isinstance(grads[0], tf.Tensor)  # IndexedSlices densified
    raw = np.zeros([6, 2], np.float32)
    raw[[1, 3]] = 1.0
    np.testing.assert_array_equal(grads[0].numpy(), raw)
    with pytest.raises(TypeError, match="GradientTape"):
        bps.DistributedGradientTape(object())


def test_tape_in_tf_function_and_none_gradients():
    a = tf.Variable(2.0, name="a")
    unused = tf.Variable(1.0, name="unused")

    @tf.function
    def step():
        with bps.DistributedGradientTape(tf.GradientTape()) as tape:
            loss = a * a
        return tape.gradient(loss, {"a": a, "u": unused})

    out = step()
    # a source without a gradient contributes zeros and gets the reduced tensor (so ranks
    # that disagree on which parameters have gradients push the same names)
    assert out["u"] is not None and float(out["u"]) == 0.0
    assert float(out["a"]) == 4.0


def test_keras_optimizer_keeps_config_and_state():
    import keras

    from byteps.tensorflow import _keras
    v = keras.Variable(np.ones(3, np.float32))
    opt = keras.optimizers.SGD(learning_rate=0.5, momentum=0.9, clipnorm=1.0)
    opt.apply([tf.ones(3)], [v])
    dist = bps.DistributedOptimizer(opt)
    assert type(dist).__name__ == "SGD" and isinstance(dist, keras.optimizers.SGD)
    assert _keras.is_distributed(dist) and not _keras.is_distributed(opt)
    cfg = dist.get_config()
    assert cfg["momentum"] == 0.9 and isinstance(cfg["momentum"], float)
    assert cfg["clipnorm"] == 1.0
    for a, b in zip(dist.variables, opt.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="already distributed"):
        bps.DistributedOptimizer(dist)
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        bps.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        bps.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    acc = bps.DistributedOptimizer(keras.optimizers.Adam(), backward_passes_per_step=2)
    assert not acc.gradient_accumulation_steps  # local aggregation, not Keras' averaging
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        bps.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2),
                                 backward_passes_per_step=2)
    # the distributed update equals the plain one at size 1 (inside tf.function too)
    ref_v = keras.Variable(np.ones(3, np.float32))
    ref = keras.optimizers.SGD(learning_rate=0.5, momentum=0.9)
    d_v = keras.Variable(np.ones(3, np.float32))
    d = bps.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.5, momentum=0.9))
    ref.build([ref_v])
    d.build([d_v])
    ref_step = tf.function(lambda g: ref.apply_gradients([(g, ref_v)]))
    step = tf.function(lambda g: d.apply_gradients([(g, d_v)]))
    for g in ([1.0, 2.0, 3.0], [0.5, -1.0, 0.0]):
        ref_step(tf.constant(g))
        step(tf.constant(g))
    np.testing.assert_allclose(np.asarray(d_v), np.asarray(ref_v), rtol=1e-6)
    # momentum correction reaches the compiled update
    d.momentum.assign(0.0)
    before = np.asarray(d_v).copy()
    step(tf.constant([0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(d_v), before)


def test_keras_optimizer_none_gradient_gets_zeros():
    import keras
    v = keras.Variable(np.ones(3, np.float32), name="v")
    u = keras.Variable(np.ones(2, np.float32), name="u")
    d = bps.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    seen = []
    orig = bps.ops.push_pull_gradients

    def spy(grads, names, *args, **kwargs):
        out = orig(grads, names, *args, **kwargs)
        seen.append((list(names), [g is None for g in out]))
        return out

    bps.ops.push_pull_gradients = spy
    try:
        d.apply_gradients([(tf.ones(3), v), (None, u)])
    finally:
        bps.ops.push_pull_gradients = orig
    assert len(seen) == 1 and len(seen[0][0]) == 2 and seen[0][1] == [False, False]
    np.testing.assert_allclose(np.asarray(v), 0.9)
    np.testing.assert_array_equal(np.asarray(u), [1.0, 1.0])  # a zero gradient: unchanged


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("make", ["sgd", "adam"])
def test_backward_passes_per_step_sums_locally(compiled, make):
    import keras

    def new_opt():
        if make == "sgd":
            return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
        return keras.optimizers.Adam(learning_rate=0.01)

    passes = 3
    v = keras.Variable(np.ones(3, np.float32), name="v")
    u = keras.Variable(np.ones(2, np.float32), name="u")
    d = bps.DistributedOptimizer(new_opt(), backward_passes_per_step=passes)
    ref_v = keras.Variable(np.ones(3, np.float32))
    ref_u = keras.Variable(np.ones(2, np.float32))
    ref = new_opt()
    calls = []
    orig = bps.ops._push_pull_many

    def counting(tensors, bases, *args, **kwargs):
        calls.append(list(bases))
        return orig(tensors, bases, *args, **kwargs)

    def raw_step(g, h):
        return d.apply_gradients([(g, v), (h, u)])

    step = tf.function(raw_step) if compiled else raw_step
    rng = np.random.default_rng(0)
    bps.ops._push_pull_many = counting
    try:
        for k in range(2):
            gs = [rng.standard_normal(3).astype(np.float32) for _ in range(passes)]
            for j, g in enumerate(gs):
                # u has no gradient on the middle pass: the sum still covers the others
                step(tf.constant(g), None if j == 1 else tf.constant(g[:2]))
                if j < passes - 1:
                    # nothing is applied before the last pass
                    assert int(d.iterations) == k
            total = np.sum(gs, axis=0)
            total_u = gs[0][:2] + gs[2][:2]
            ref.apply_gradients([(tf.constant(total), ref_v), (tf.constant(total_u), ref_u)])
            np.testing.assert_allclose(np.asarray(v), np.asarray(ref_v), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(np.asarray(u), np.asarray(ref_u), rtol=1e-6, atol=1e-7)
            assert int(d.iterations) == int(ref.iterations) == k + 1
    finally:
        bps.ops._push_pull_many = orig
    if not compiled:  # one communication per `passes` calls (graph mode: traced once)
        assert len(calls) == 2, calls
    names = [str(x.path) for x in d.variables]
    assert names[-3:] == [f"{d.name}/v_bps_grad_accumulator",
                          f"{d.name}/u_bps_grad_accumulator", f"{d.name}/bps_backward_passes"]
    for acc in d.variables[-3:-1]:
        np.testing.assert_array_equal(np.asarray(acc), 0.0)


def test_backward_passes_per_step_in_model_fit():
    import keras
    x = np.random.default_rng(1).random((64, 4)).astype(np.float32)
    y = np.random.default_rng(2).random((64, 1)).astype(np.float32)

    def fit(opt):
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(optimizer=opt, loss="mse")
        m.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        return m

    m = fit(bps.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2))
    assert int(m.optimizer.iterations) == 4  # 8 batches, one update per 2
    # the same as the plain SGD on the pair sums: twice the rate, averaged gradient pairs
    ref = fit(keras.optimizers.SGD(0.2, gradient_accumulation_steps=2))
    for a, b in zip(m.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_broadcast_object_size_one():
    obj = {"a": [1, 2.5, None], "f": (lambda z: z + 1)}
    assert bps.broadcast_object(obj, root_rank=0, name="unit.obj") is obj
    assert bps.broadcast_object(obj) is obj
    with pytest.raises(ValueError, match="root_rank"):
        bps.broadcast_object(obj, root_rank=1)


def test_legacy_optimizer():
    v = tf.Variable([1.0, 2.0])
    opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    opt.minimize(lambda: tf.reduce_sum(v * v), var_list=[v])
    np.testing.assert_allclose(v.numpy(), [0.0, 0.0])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                 backward_passes_per_step=2)


def test_keras_fronts():
    import byteps.keras as bk
    import byteps.tensorflow.keras as tk
    for front in (bk, tk):
        np.testing.assert_array_equal(front.push_pull([1.0, 2.0]), [1.0, 2.0])
        np.testing.assert_array_equal(front.broadcast(np.arange(3), 0), [0, 1, 2])
        for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback",
                     "LearningRateScheduleCallback", "LearningRateWarmupCallback"):
            assert hasattr(front.callbacks, name)
        with pytest.raises(TypeError, match="global variables"):
            front.broadcast_global_variables(0)
    cb = bk.callbacks.LearningRateScheduleCallback(lambda e: 0.5)  # upstream order
    assert cb.initial_lr is None and cb.multiplier(3) == 0.5
    with pytest.raises(ValueError, match="multiplier"):
        bk.callbacks.LearningRateScheduleCallback(0.1)
