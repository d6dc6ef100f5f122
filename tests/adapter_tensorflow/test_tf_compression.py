"""``compression_params`` of byteps.tensorflow and the Keras fronts in one process (a
single-process job through the real core, which compresses nothing there): bad dicts raise at
construction, fp16 selects the cast, ``momentum: nesterov`` moves the optimizer's momentum into
byteps (applied here to every gradient, so training equals Keras' own Nesterov SGD), and the
learning rate reaches the core. The two-level scheme itself: test_tf_multiprocess.py."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tensorflow

import keras  # noqa: E402

import byteps.tensorflow as bps  # noqa: E402
from byteps import _core  # noqa: E402
from byteps.errors import InvalidArgumentError, InvalidTypeError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _job():
    bps.init()
    yield
    bps.shutdown()


BAD = [
    ({"compressor": "twobit"}, InvalidArgumentError, "twobit"),
    ({"compressor": "topk"}, InvalidArgumentError, "needs 'k'"),
    ({"compressor": "onebit", "k": 3}, InvalidArgumentError, "onebit"),
    ({"compressor": "dithering", "k": 2, "partition": "log"}, InvalidArgumentError, "linear"),
    ({"compressor": "onebit", "momentum": "nesterov"}, InvalidArgumentError, "needs mu"),
    ({"compressor": "onebit", "scaling": "yes"}, InvalidTypeError, "scaling"),
    (["onebit"], InvalidTypeError, "dict"),
]

MAKERS = {
    "tape": lambda p: bps.DistributedGradientTape(tf.GradientTape(), compression_params=p),
    "keras": lambda p: bps.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                compression_params=p),
    "legacy": lambda p: bps.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), compression_params=p),
}


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize("params,exc,words", BAD, ids=[str(b[0]) for b in BAD])
def test_invalid_params_raise_at_construction(maker, params, exc, words):
    with pytest.raises(exc, match=words):
        MAKERS[maker](params)


def test_keras_fronts_take_compression_params():
    import byteps.keras as bk
    import byteps.tensorflow.keras as btk

    for front in (bk, btk):
        opt = front.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                         compression_params={"compressor": "onebit"})
        assert opt._bps_plan.kwargs == {"compressor_type": "onebit",
                                        "compressor_onebit_scaling": "false"}
        with pytest.raises(InvalidArgumentError):
            front.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                       compression_params={"compressor": "none"})


def test_fp16_selects_the_cast():
    tape = bps.DistributedGradientTape(tf.GradientTape(), compression_params={"fp16": True})
    assert tape._bps_compression is bps.Compression.fp16 and tape._bps_plan is None
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                   compression_params={"fp16": True, "compressor": "topk",
                                                       "k": 2})
    assert opt._bps_compression is bps.Compression.fp16 and opt._bps_plan is not None

    class Custom(bps.Compressor):
        pass

    with pytest.raises(InvalidArgumentError, match="fp16"):
        bps.DistributedGradientTape(tf.GradientTape(), compression=Custom,
                                    compression_params={"fp16": True})


def _problem():
    rng = np.random.default_rng(3)
    init = rng.standard_normal(6).astype(np.float32)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(4)]
    return init, grads


def _train(opt, name, init, grads, compiled):
    v = keras.Variable(init, name=name)

    def step(g):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(g * v)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step = tf.function(step) if compiled else step
    for g in grads:
        step(tf.constant(g))
    return v.numpy()


@pytest.mark.parametrize("compiled", [False, True])
def test_keras_nesterov_moves_the_momentum(compiled):
    init, grads = _problem()
    want = _train(keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True), "ref", init, grads,
                  compiled)
    with pytest.warns(UserWarning, match="momentum 0.9 is set to 0"):
        opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                       name=f"nag{compiled}",
                                       compression_params={"compressor": "onebit",
                                                           "momentum": "nesterov"})
    assert float(opt.momentum) == 0.0 and opt.get_config()["momentum"] == 0.0
    assert opt._bps_plan.mu == 0.9
    got = _train(opt, f"nag{compiled}", init, grads, compiled)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_tape_nesterov_with_mu_from_the_dict():
    init, grads = _problem()
    v = tf.Variable(init)
    params = {"compressor": "topk", "k": 1, "momentum": "nesterov", "momentum_mu": 0.5}
    ref, m = init.copy(), np.zeros(6, np.float32)
    for g in grads:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(g * v)
        tape = bps.DistributedGradientTape(tape, compression_params=params)
        (d,) = tape.gradient(loss, [v])
        v.assign_sub(0.1 * d)
        m = (np.float32(0.5) * m + g).astype(np.float32)
        ref = ref - np.float32(0.1) * (g + np.float32(0.5) * m)
    np.testing.assert_allclose(v.numpy(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True])
def test_learning_rate_reaches_the_core(compiled):
    init, grads = _problem()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=1, decay_rate=0.5)
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(schedule), name=f"lr{compiled}",
                                   compression_params={"compressor": "onebit",
                                                       "ef": "vanilla"})
    v = keras.Variable(init, name=f"lr{compiled}")

    def step(g):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(g * v)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step = tf.function(step) if compiled else step
    for i, g in enumerate(grads[:3]):
        step(tf.constant(g))
        # read when the step's reduction ran, i.e. at iterations == i
        assert _core.learning_rate() == pytest.approx(0.2 * 0.5 ** i, rel=1e-6)


def test_legacy_momentum_optimizer_moves_its_momentum():
    base = tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.8, use_nesterov=True)
    with pytest.warns(UserWarning, match="momentum 0.8 is set to 0"):
        opt = bps.DistributedOptimizer(base, compression_params={"compressor": "onebit",
                                                                 "momentum": "nesterov"})
    assert base._momentum == 0.0 and not base._use_nesterov and opt._bps_plan.mu == 0.8
