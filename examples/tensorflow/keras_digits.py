"""Data-parallel Keras 3 training on scikit-learn's digits with byteps.

Run::

    bpslaunch --workers 2 --servers 1 python examples/tensorflow/keras_digits.py

Each rank trains on its shard of a fixed split with ``model.fit``; gradients are averaged by
``bps.DistributedOptimizer``, rank 0's initial weights are broadcast after the first batch,
the learning rate warms up from ``lr / size`` to ``lr`` and the per-epoch metrics are averaged
across ranks (so every rank prints the same numbers). At the end every rank checks that its
weights are identical to rank 0's and prints the test accuracy.
"""

from __future__ import annotations

import hashlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.tensorflow.keras as bps

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

EPOCHS = 12
BATCH = 32
LR = 0.05


def main() -> None:
    t0 = time.time()
    bps.init()
    rank, size = bps.rank(), bps.size()
    tf.keras.utils.set_random_seed(1234 + rank)  # different initial weights per rank on purpose

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype("float32"), y.astype("int64"), test_size=0.25, random_state=0, stratify=y)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std[std < 1e-3] = 1.0  # constant pixels (in the training split)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    opt = bps.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=LR, momentum=0.9))
    model.compile(optimizer=opt,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    class PrintMetrics(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            text = " ".join(f"{k}={v:.4f}" for k, v in sorted((logs or {}).items()))
            print(f"[rank {rank}] epoch {epoch + 1}: {text}", flush=True)

    steps = int(np.ceil(len(x_shard) / BATCH))
    model.fit(x_shard, y_shard, batch_size=BATCH, epochs=EPOCHS, shuffle=True, verbose=0,
              validation_data=(x_test, y_test),
              callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0),
                         bps.callbacks.MetricAverageCallback(),
                         bps.callbacks.LearningRateWarmupCallback(
                             initial_lr=LR, warmup_epochs=3, steps_per_epoch=steps),
                         PrintMetrics()])

    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes()
                                     for w in model.get_weights())).digest()
    mine = np.frombuffer(digest, dtype=np.uint8)
    root = bps.broadcast(mine, 0, name="keras_digits.weights_hash")  # a NumPy array
    if not np.array_equal(root, mine):
        raise RuntimeError(f"rank {rank}: weights differ from rank 0's")
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    print(f"[rank {rank}] weights identical on all {size} workers; "
          f"wall time {time.time() - t0:.1f} s", flush=True)
    print(f"final test accuracy: {acc:.3f}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
