"""Data-parallel custom training loop on scikit-learn's digits with
``bps.DistributedGradientTape`` inside a ``tf.function``.

Run::

    bpslaunch --workers 2 --servers 1 python examples/tensorflow/tape_digits.py

Each rank trains on its shard of a fixed split; the tape averages the gradients across ranks;
after the first step every rank takes rank 0's variables (model and optimizer state) with
``bps.broadcast_variables``. At the end every rank checks that its weights equal rank 0's and
prints the test accuracy.
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

import byteps.tensorflow as bps

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

EPOCHS = 12
BATCH = 32
LR = 0.05


def main() -> None:
    t0 = time.time()
    bps.init()
    rank, size = bps.rank(), bps.size()
    tf.keras.utils.set_random_seed(4321 + rank)  # different initial weights per rank

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype("float32"), y.astype("int64"), test_size=0.25, random_state=0, stratify=y)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std[std < 1e-3] = 1.0
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    opt = tf.keras.optimizers.SGD(learning_rate=LR, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return bps.push_pull(loss, name="tape_digits.loss")

    # Every rank runs the same number of steps per epoch (the shards differ by at most one).
    steps = len(x_train) // size // BATCH
    rng = np.random.default_rng(rank)
    first = True
    for epoch in range(EPOCHS):
        order = rng.permutation(len(x_shard))
        total = 0.0
        for s in range(steps):
            idx = order[s * BATCH:(s + 1) * BATCH]
            total += float(train_step(tf.constant(x_shard[idx]), tf.constant(y_shard[idx])))
            if first:
                bps.broadcast_variables(model.variables + list(opt.variables), root_rank=0)
                first = False
        print(f"[rank {rank}] epoch {epoch + 1}: mean loss {total / steps:.4f}", flush=True)

    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes()
                                     for w in model.get_weights())).digest()
    mine = tf.constant(np.frombuffer(digest, dtype=np.uint8))
    root = bps.broadcast(mine, 0, name="tape_digits.weights_hash")
    if not np.array_equal(root.numpy(), mine.numpy()):
        raise RuntimeError(f"rank {rank}: weights differ from rank 0's")
    pred = np.argmax(model(x_test, training=False).numpy(), axis=1)
    acc = float(np.mean(pred == y_test))
    print(f"[rank {rank}] weights identical on all {size} workers; "
          f"wall time {time.time() - t0:.1f} s", flush=True)
    print(f"final test accuracy: {acc:.3f}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
