"""One rank of the asynchronous byteps.mxnet check (BYTEPS_ENABLE_ASYNC=1, under the launcher).

A DistributedTrainer (SGD, lr 0.125) over a weight whose gradient is known (loss = sum(w * (r +
1)) on rank r, so the gradient is (r + 1) * ones), K steps per rank, every rank starting from
its own value: the servers start from rank 0's, add every step's delta (sums, not averages), and
once all ranks have stepped ``pull_parameters`` reads rank 0's initial value minus lr * K *
(1 + 2 + ...) on every rank. A second, bias-free Dense layer trains on a regression task (loss
decreases). The Module API's DistributedOptimizer, driven as a Module's updater does, gives the
same sums. Prints ``MXNET_ASYNC_OK rank=<r>`` (exit 0), else raises.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import byteps.mxnet as bps
from byteps.sync import async_train

K, LR = 6, 0.125


def barrier(tag):
    x = mx.nd.zeros((1,))
    bps.byteps_push_pull(x, name=f"barrier.{tag}", is_average=False)
    x.wait_to_read()


def main():
    bps.init()
    assert async_train.enabled()
    rank, size = bps.rank(), bps.size()
    w = gluon.Parameter("w", shape=(3, 2), init=mx.init.Constant(10.0 + rank))
    w.initialize(ctx=mx.cpu())
    trainer = bps.DistributedTrainer([w], "sgd", {"learning_rate": LR})
    for _ in range(K):
        with autograd.record():
            loss = (w.data() * float(rank + 1)).sum()
        loss.backward()
        trainer.step(1)
    barrier("known")
    bps.pull_parameters(trainer)
    total = LR * K * sum(r + 1 for r in range(size))
    np.testing.assert_allclose(w.data().asnumpy(), 10.0 - total, rtol=1e-6)

    # The Module API's DistributedOptimizer, driven as a Module's updater does.
    opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=LR, rescale_grad=1.0))
    v = mx.nd.full((4,), 3.0 + rank)
    state = opt.create_state(0, v)
    for _ in range(K):
        opt.update(0, v, mx.nd.full((4,), float(rank + 1)), state)
    barrier("module")
    z = mx.nd.zeros((4,))
    bps.byteps_push_pull(z, name="AsyncParam.optimizer.weight_0", is_average=False)
    np.testing.assert_allclose(z.asnumpy(), 3.0 - total, rtol=1e-6)

    net = gluon.nn.Dense(1, in_units=4, use_bias=False)
    net.initialize(mx.init.Constant(0.1 * (rank + 1)), ctx=mx.cpu())
    tr2 = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    rng = np.random.default_rng(rank)
    target = np.array([[1.0], [-2.0], [0.5], [0.0]], np.float32)
    losses = []
    for _ in range(40):
        x = mx.nd.array(rng.standard_normal((16, 4)).astype(np.float32))
        y = mx.nd.dot(x, mx.nd.array(target))
        with autograd.record():
            loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        tr2.step(1)
        losses.append(float(loss.asscalar()))
    assert losses[-1] < 0.2 * losses[0], losses
    barrier("fit")
    bps.pull_parameters(tr2)
    mine = net.weight.data().asnumpy()
    ref = mine.copy() if rank == 0 else np.zeros_like(mine)
    ref_nd = mx.nd.array(ref)
    bps.byteps_push_pull(ref_nd, name="fit.weights", is_average=False)
    assert mine.tobytes() == ref_nd.asnumpy().tobytes(), "ranks read different parameters"
    print(f"MXNET_ASYNC_OK rank={rank} loss {losses[0]:.3f} -> {losses[-1]:.4f}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
