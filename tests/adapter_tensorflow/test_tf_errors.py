"""byteps.tensorflow (and its Keras fronts) with bad arguments, through the real core (a
single-process job in this process): every exception is a ``byteps.BytePSError``, and
``except ValueError`` / ``except TypeError`` still catch it where they did before.
(A static check of the adapter's sources runs without TensorFlow: tests/test_errors.py.)"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tensorflow

from error_checks import check_raises  # noqa: E402

import byteps.tensorflow as bps  # noqa: E402
from byteps.errors import NotInitializedError  # noqa: E402

_check = check_raises


@pytest.fixture(scope="module")
def job():
    bps.shutdown()
    yield
    bps.shutdown()


def test_before_init(job):
    bps.shutdown()
    for fn in (bps.size, bps.rank, bps.local_size, bps.local_rank,
               lambda: bps.declare("tf.e.x"),
               lambda: bps.push_pull(tf.ones([2]), name="tf.e.x"),
               lambda: bps.broadcast(tf.ones([2]), 0),
               lambda: bps.broadcast_object(1, 0)):
        assert isinstance(_check(fn, RuntimeError), NotInitializedError)


def _keras_sgd(**kwargs):
    import keras
    return keras.optimizers.SGD(**kwargs)


def _distributed_sgd():
    return bps.DistributedOptimizer(_keras_sgd())


X = [1.0, 2.0]

CASES = [
    ("list", lambda: bps.push_pull([1.0, 2.0], name="tf.e.a"), TypeError),
    ("numpy", lambda: bps.push_pull(np.ones(3, np.float32), name="tf.e.a"), TypeError),
    ("bool", lambda: bps.push_pull(tf.constant([True]), name="tf.e.a"), TypeError),
    ("string", lambda: bps.push_pull(tf.constant(["a"]), name="tf.e.a"), TypeError),
    ("int16", lambda: bps.push_pull(tf.constant([1], tf.int16), name="tf.e.a"), TypeError),
    ("ragged", lambda: bps.push_pull(tf.ragged.constant([[1.0], [2.0, 3.0]]), name="tf.e.a"),
     TypeError),
    ("sparse", lambda: bps.push_pull(tf.sparse.from_dense(tf.eye(2)), name="tf.e.a"),
     TypeError),
    ("op-and-average", lambda: bps.push_pull(tf.constant(X), average=True, op=bps.Sum),
     ValueError),
    ("op-adasum", lambda: bps.push_pull(tf.constant(X), op=bps.Adasum), ValueError),
    ("op-unknown", lambda: bps.push_pull(tf.constant(X), op="Mean"), ValueError),
    ("name-empty", lambda: bps.push_pull(tf.ones([1]), name=""), ValueError),
    ("scope-int", lambda: bps.push_pull(tf.ones([1]), scope=3), TypeError),
    ("declare-int", lambda: bps.declare(3), TypeError),
    ("broadcast-root", lambda: bps.broadcast(tf.ones([1]), 1), ValueError),
    ("broadcast_variables-root", lambda: bps.broadcast_variables([tf.Variable(1.0)], -1),
     ValueError),
    ("broadcast_variables-tensor", lambda: bps.broadcast_variables([tf.ones([1])], 0),
     TypeError),
    ("broadcast_object-root", lambda: bps.broadcast_object({"a": 1}, root_rank=1), ValueError),
    ("tape-not-a-tape", lambda: bps.DistributedGradientTape(object()), TypeError),
    ("tape-adasum", lambda: bps.DistributedGradientTape(tf.GradientTape(), op=bps.Adasum),
     ValueError),
    ("optimizer-not-optimizer", lambda: bps.DistributedOptimizer(object()), TypeError),
    ("optimizer-adasum", lambda: bps.DistributedOptimizer(_keras_sgd(), op=bps.Adasum),
     ValueError),
    ("optimizer-twice", lambda: bps.DistributedOptimizer(_distributed_sgd()), ValueError),
    ("optimizer-bpps", lambda: bps.DistributedOptimizer(_keras_sgd(),
                                                        backward_passes_per_step=0), ValueError),
    ("optimizer-legacy-bpps", lambda: bps.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=2),
     ValueError),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_arguments(job, case):
    _, fn, flavour = case
    bps.init()
    _check(fn, flavour)
    np.testing.assert_array_equal(bps.push_pull(tf.constant(X), average=False,
                                                name="tf.e.after").numpy(), X)


@pytest.mark.parametrize("front", ["byteps.keras", "byteps.tensorflow.keras"])
def test_keras_fronts(job, front):
    import importlib
    k = importlib.import_module(front)
    bps.init()
    _check(lambda: k.broadcast_global_variables(0), TypeError)
    _check(lambda: k.callbacks.LearningRateScheduleCallback(0.1), ValueError)
    _check(lambda: k.broadcast(np.arange(3), 1), ValueError)
    _check(lambda: k.push_pull(object()), TypeError)
    _check(lambda: k.push_pull([True, False]), TypeError)
