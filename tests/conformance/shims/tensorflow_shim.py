"""Shim for ``byteps.tensorflow`` (TensorFlow 2, eager, Keras 3 optimizers).

How the generic operations map onto the TensorFlow API:

* tensors are ``tf.constant``; the "mutable" container of the in-place cases is a
  ``tf.Variable`` (a ``tf.Tensor`` is immutable): ``push_pull_inplace(v)`` is
  ``v.assign(bps.push_pull(v, ...))``, the pattern a TensorFlow user writes;
* there is no handle API (capability ``async`` missing, as upstream). Operations in flight
  at once (``concurrent``) are eager ``bps.push_pull`` calls on Python threads (the core's wait
  releases the GIL); their names are declared up front with ``bps.declare`` in program order,
  because threads reach the core in a nondeterministic order and keys follow declaration
  order. :meth:`start` waits 0.5 s after starting the thread so the operation has reached the
  core before it returns;
* the distributed-training variants are ``"optimizer"`` (``bps.DistributedOptimizer`` of a
  Keras 3 SGD, driven by ``apply_gradients`` per micro-batch) and ``"tape"``
  (``bps.DistributedGradientTape`` + a plain Keras SGD). ``backward_passes_per_step`` goes to
  the optimizer variant (the tape has no such argument);
* ``broadcast_object`` is ``bps.broadcast_object`` (cloudpickle, as Horovod's).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .base import ALL_DTYPES, PARAM_NAMES, Batch, Shim


class TensorFlowShim(Shim):
    name = "tensorflow"
    dtypes = ALL_DTYPES
    capabilities = frozenset({"inplace", "concurrent", "broadcast_object", "fp16", "optimizer",
                              "backward_passes", "compression"})
    missing_reasons = {
        "async": "byteps.tensorflow has no push_pull_async/poll/synchronize handle API "
                 "(upstream neither); concurrency is covered through threads",
    }
    optimizer_variants = ("optimizer", "tape")
    backward_passes_variants = ("optimizer",)

    def init(self) -> None:
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(2)
        except RuntimeError:  # already initialised
            pass
        import keras

        import byteps.errors
        import byteps.tensorflow as bps

        self.tf = tf
        self.keras = keras
        self.bps = bps
        self.errors = byteps.errors
        bps.init()

    # ---------------------------------------------------------------- tensors
    def tensor(self, array: np.ndarray, dtype: str) -> Any:
        tf = self.tf
        arr = np.asarray(array)
        if dtype == "bfloat16":
            return tf.cast(tf.constant(arr.astype(np.float32)), tf.bfloat16)
        return tf.constant(arr.astype(dtype))

    def mutable(self, array: np.ndarray, dtype: str) -> Any:
        return self.tf.Variable(self.tensor(array, dtype), trainable=False)

    def to_numpy(self, t: Any) -> np.ndarray:
        a = np.asarray(t.numpy())
        if t.dtype == self.tf.bfloat16:
            a = a.astype(np.float32)
        return a.copy()

    def dtype_of(self, t: Any) -> str:
        return t.dtype.name

    def unsupported_tensor(self) -> Tuple[Any, str]:
        return self.tf.constant([True, False, True]), "tf.bool"

    # ---------------------------------------------------------------- collectives
    def _op(self, average: bool) -> str:
        return self.bps.Average if average else self.bps.Sum

    def push_pull(self, t: Any, average: bool, name: str) -> Any:
        return self.bps.push_pull(t, op=self._op(average), name=name)

    def push_pull_inplace(self, t: Any, average: bool, name: str) -> Any:
        t.assign(self.bps.push_pull(t, op=self._op(average), name=name))
        return t

    def start(self, t: Any, average: bool, name: str) -> Any:
        self.bps.declare(name)
        fut: Future = Future()

        def run():
            try:
                fut.set_result(self.push_pull(t, average, name))
            except BaseException as e:
                fut.set_exception(e)

        threading.Thread(target=run, name=f"start:{name}", daemon=True).start()
        time.sleep(0.5)
        if fut.done() and fut.exception() is not None:
            raise fut.exception()
        return fut

    def finish(self, handle: Any) -> Any:
        return handle.result()

    def push_pull_many(self, tensors: Sequence[Any], average: bool,
                       names: Sequence[str]) -> List[Any]:
        for name in names:  # keys follow declaration order: declare before threads race
            self.bps.declare(name)
        results: List[Any] = [None] * len(tensors)
        errors: List[BaseException] = []
        barrier = threading.Barrier(len(tensors))

        def run(i):
            try:
                barrier.wait(timeout=60)
                results[i] = self.push_pull(tensors[i], average, names[i])
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,), daemon=True)
                   for i in range(len(tensors))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        return results

    def push_pull_fp16(self, t: Any, average: bool, name: str) -> Any:
        return self.bps.push_pull(t, op=self._op(average), name=name,
                                  compression=self.bps.Compression.fp16)

    def fp16_round_trip(self, t: Any) -> Tuple[Any, Any]:
        comp = self.bps.Compression.fp16
        compressed, ctx = comp.compress(t)
        return compressed, comp.decompress(compressed, ctx)

    def broadcast(self, t: Any, root: int, name: str) -> Any:
        return self.bps.broadcast(t, root, name="conf.bcast." + name)

    def broadcast_object(self, obj: Any, root: int, name: str) -> Any:
        return self.bps.broadcast_object(obj, root_rank=root, name=name)

    def allgather(self, t: Any, name: str, process_set=None) -> Any:
        return self.bps.allgather(t, name=name, process_set=process_set)

    def hvd_broadcast(self, t: Any, root: int, name: str, process_set=None) -> Any:
        return self.bps.broadcast(t, root, name=name, process_set=process_set)

    def reducescatter(self, t: Any, name: str, average: bool, process_set=None) -> Any:
        return self.bps.reducescatter(t, name=name, op=self._op(average),
                                      process_set=process_set)

    def allreduce_sum(self, t: Any, name: str, process_set=None) -> Any:
        return self.bps.allreduce(t, op=self.bps.Sum, name=name, process_set=process_set)

    def alltoall(self, t: Any, splits, name: str, process_set=None):
        out, received = self.bps.alltoall(t, splits=splits, name=name,
                                          process_set=process_set)
        return out, received.numpy().tolist()

    # ---------------------------------------------------------------- tiny model
    def make_model(self, weights: Dict[str, np.ndarray]) -> Any:
        return {n: self.keras.Variable(initializer=np.array(weights[n], np.float32), name=n,
                                       dtype="float32")
                for n in PARAM_NAMES}

    def get_weights(self, model: Any) -> Dict[str, np.ndarray]:
        return {n: np.array(model[n].numpy()) for n in PARAM_NAMES}

    def _loss(self, model: Any, b: Batch) -> Any:
        tf = self.tf
        x = tf.constant(b.x)
        h = tf.tanh(tf.matmul(x, model["w1"]) + model["b1"])
        out = tf.matmul(h, model["w2"]) + model["b2"]
        if b.extra_rows is not None:
            out = out + x[:, :1] * model["extra"] * tf.constant(b.extra_rows)[:, None]
        return tf.reduce_mean(tf.square(out - tf.constant(b.y)))

    def _grads(self, model: Any, b: Batch, distributed_tape=None, compression_params=None):
        tf = self.tf
        variables = [model[n] for n in PARAM_NAMES]
        with tf.GradientTape() as tape:
            loss = self._loss(model, b)
        if distributed_tape is not None:
            tape = self.bps.DistributedGradientTape(tape, compression=distributed_tape,
                                                    compression_params=compression_params)
        return tape.gradient(loss, variables), variables

    def gradients(self, weights: Dict[str, np.ndarray], b: Batch):
        grads, _ = self._grads(self.make_model(weights), b)
        return {n: None if g is None else np.array(g.numpy())
                for n, g in zip(PARAM_NAMES, grads)}

    def make_optimizer(self, model: Any, lr: float, momentum: float) -> Any:
        return ("plain", self.keras.optimizers.SGD(learning_rate=lr, momentum=momentum))

    def distributed_optimizer(self, model: Any, lr: float, momentum: float, variant: str,
                              compression: str = "none",
                              backward_passes_per_step: int = 1,
                              compression_params=None) -> Any:
        comp = {"none": self.bps.Compression.none, "fp16": self.bps.Compression.fp16}[compression]
        base = self.keras.optimizers.SGD(learning_rate=lr, momentum=momentum)
        if variant == "optimizer":
            return ("optimizer", self.bps.DistributedOptimizer(
                base, compression=comp, backward_passes_per_step=backward_passes_per_step,
                compression_params=compression_params))
        if variant == "tape":
            assert backward_passes_per_step == 1, "DistributedGradientTape: no accumulation"
            return ("tape", (base, comp, compression_params))
        raise ValueError(f"unknown variant {variant!r}")

    def train_step(self, model: Any, optimizer: Any, micro_batches: Sequence[Batch]) -> None:
        kind, opt = optimizer
        if kind == "plain":
            # local reference: sum the micro-batch gradients, apply once
            total, variables = None, None
            for b in micro_batches:
                grads, variables = self._grads(model, b)
                total = grads if total is None else [
                    g if t is None else (t if g is None else t + g)
                    for t, g in zip(total, grads)]
            pairs = [(g, v) for g, v in zip(total, variables) if g is not None]
            opt.apply_gradients(pairs)
        elif kind == "optimizer":
            # apply_gradients per micro-batch: the distributed optimizer
            # (backward_passes_per_step = len(micro_batches)) sums them locally and
            # communicates and applies on the last one only.
            for b in micro_batches:
                grads, variables = self._grads(model, b)
                opt.apply_gradients(zip(grads, variables))
        elif kind == "tape":
            assert len(micro_batches) == 1, "tape variant: one micro-batch per step"
            base, comp, params = opt
            grads, variables = self._grads(model, micro_batches[0], distributed_tape=comp,
                                           compression_params=params)
            base.apply_gradients(zip(grads, variables))
        else:
            raise ValueError(kind)
