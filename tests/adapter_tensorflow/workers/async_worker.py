"""One rank of the asynchronous byteps.tensorflow checks (BYTEPS_ENABLE_ASYNC=1, under the
launcher). Prints ``TF_ASYNC_OK rank=<r>`` when every check passed (exit 0), else raises.

* Keras DistributedOptimizer, eager ``apply_gradients`` with known gradients (rank r: (r + 1) *
  ones, SGD lr 0.125, K steps): every rank starts from rank 0's weights (the others' differ),
  and once all have stepped the servers hold rank 0's initial value minus lr * K * (1 + 2 + ...)
  (sums of deltas, not averages), read with ``pull_parameters``;
* the same through a ``tf.compat.v1.train.GradientDescentOptimizer`` (legacy wrapper);
* ``model.fit`` (compiled train function): it trains (loss decreases) and, after all meet,
  every rank reads identical weights.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import byteps.tensorflow as bps
from byteps.sync import async_train

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402

K, LR = 6, 0.125


def barrier(tag):
    bps.push_pull(tf.zeros([1]), average=False, name=f"barrier.{tag}")


def main():
    bps.init()
    assert async_train.enabled()
    rank, size = bps.rank(), bps.size()
    total = LR * K * sum(r + 1 for r in range(size))

    # Keras optimizer, eager.
    w = keras.Variable(np.full((3, 2), 10.0 + rank, np.float32), name="w")
    b = keras.Variable(np.full((2,), -5.0 - rank, np.float32), name="b")
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(LR), name="KnownKeras")
    for _ in range(K):
        opt.apply_gradients([(tf.fill(v.shape, float(rank + 1)), v) for v in (w, b)])
    barrier("keras")
    bps.pull_parameters(opt)
    np.testing.assert_allclose(w.numpy(), 10.0 - total, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), -5.0 - total, rtol=1e-6)

    # Legacy optimizer, eager.
    v = tf.Variable(np.full((4,), 3.0 + rank, np.float32), name="v")
    legacy = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR),
                                      name="KnownLegacy")
    for _ in range(K):
        legacy.apply_gradients([(tf.fill(v.shape, float(rank + 1)), v)])
    barrier("legacy")
    bps.pull_parameters([v], scope=legacy._bps_scope)
    np.testing.assert_allclose(v.numpy(), 3.0 - total, rtol=1e-6)

    # model.fit: the compiled train function exchanges deltas.
    keras.utils.set_random_seed(100 + rank)  # different starts: rank 0's is used
    x = np.random.default_rng(rank).standard_normal((256, 8)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, 8).astype(np.float32)[:, None]).astype(np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    fit_opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.05), name="Fit")
    model.compile(optimizer=fit_opt, loss="mse")
    hist = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    barrier("fit")
    bps.pull_parameters(fit_opt)
    mine = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    ref = bps.broadcast(tf.constant(mine), root_rank=0, name="fit.weights").numpy()
    assert mine.tobytes() == ref.tobytes(), "ranks read different parameters"
    print(f"TF_ASYNC_OK rank={rank} loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
