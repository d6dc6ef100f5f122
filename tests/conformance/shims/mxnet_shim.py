"""Shim for ``byteps.mxnet`` (MXNet 1.x NDArrays on the CPU, Gluon for the tiny model).

How the generic operations map onto the MXNet API:

* ``byteps_push_pull`` is in place and asynchronous through MXNet's engine: a synchronous
  push_pull is ``byteps_push_pull`` then ``wait_to_read`` (which raises the operation's error
  as its ``byteps.errors`` class); out-of-place operations work on a ``copy()``;
* there is no handle API (capability ``async`` missing, as upstream), and operations that
  share a name are ordered by the engine instead of refused (``concurrent`` missing). Many
  operations in flight at once (``push_pull_many``) are many engine operations pushed before
  the first wait;
* the distributed-training variants are ``"trainer"`` (``bps.DistributedTrainer``, Gluon) and
  ``"optimizer"`` (``bps.DistributedOptimizer`` driven by ``mx.optimizer.get_updater``, the
  way the Module API drives it). Several micro-batches per step use Gluon's own accumulation
  (``grad_req='add'``), which the trainer supports;
* ``broadcast_object`` is ``bps.broadcast_object`` (cloudpickle, as Horovod's).
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .base import PARAM_NAMES, Batch, Shim

_models = itertools.count()


class MXNetShim(Shim):
    name = "mxnet"
    dtypes = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")
    capabilities = frozenset({"inplace", "broadcast_object", "fp16", "optimizer",
                              "backward_passes"})
    missing_reasons = {
        "async": "byteps.mxnet has no push_pull_async/poll/synchronize handle API (upstream "
                 "neither): byteps_push_pull is asynchronous through MXNet's engine",
        "concurrent": "byteps.mxnet orders operations that share a name through MXNet's engine "
                      "(the second waits for the first), so a duplicate in-flight name cannot "
                      "be refused; many names in flight are covered by push_pull_many",
        "compression": "MXNet's compression_params are DistributedTrainer's, with upstream's "
                       "scaling of every gradient by 1/(batch size x size) first: checked "
                       "against their own NumPy reference in tests/adapter_mxnet",
    }
    optimizer_variants = ("trainer", "optimizer")
    backward_passes_variants = ("trainer",)

    def init(self) -> None:
        import mxnet as mx

        import byteps.errors
        import byteps.mxnet as bps

        self.mx = mx
        self.bps = bps
        self.errors = byteps.errors
        bps.init()

    # ---------------------------------------------------------------- tensors
    def tensor(self, array: np.ndarray, dtype: str) -> Any:
        return self.mx.nd.array(np.asarray(array).astype(dtype), dtype=dtype)

    def to_numpy(self, t: Any) -> np.ndarray:
        return np.array(t.asnumpy(), copy=True)

    def dtype_of(self, t: Any) -> str:
        return np.dtype(t.dtype).name

    def unsupported_tensor(self) -> Tuple[Any, str]:
        return self.mx.nd.array([1, 0, 1], dtype="bool"), "bool NDArray"

    # ---------------------------------------------------------------- collectives
    def push_pull(self, t: Any, average: bool, name: str) -> Any:
        out = t.copy()
        self.bps.byteps_push_pull(out, name=name, is_average=average)
        out.wait_to_read()
        return out

    def push_pull_inplace(self, t: Any, average: bool, name: str) -> Any:
        self.bps.byteps_push_pull(t, name=name, is_average=average)
        t.wait_to_read()
        return t

    def push_pull_many(self, tensors: Sequence[Any], average: bool,
                       names: Sequence[str]) -> List[Any]:
        outs = [t.copy() for t in tensors]
        for out, name in zip(outs, names):
            self.bps.byteps_push_pull(out, name=name, is_average=average)
        for out in reversed(outs):
            out.wait_to_read()
        return outs

    def push_pull_fp16(self, t: Any, average: bool, name: str) -> Any:
        comp = self.bps.Compression.fp16
        compressed, ctx = comp.compress(t)
        if compressed is t:
            compressed = t.copy()
        self.bps.byteps_push_pull(compressed, name=name, is_average=average)
        out = comp.decompress(compressed, ctx)
        out.wait_to_read()
        return out

    def fp16_round_trip(self, t: Any) -> Tuple[Any, Any]:
        comp = self.bps.Compression.fp16
        compressed, ctx = comp.compress(t)
        return compressed, comp.decompress(compressed, ctx)

    def broadcast(self, t: Any, root: int, name: str) -> Any:
        out = t.copy()
        self.bps.broadcast_parameters([(name, out)], root_rank=root, prefix="conf.bcast.")
        return out

    def broadcast_object(self, obj: Any, root: int, name: str) -> Any:
        return self.bps.broadcast_object(obj, root_rank=root, name=name)

    def allgather(self, t: Any, name: str, process_set=None) -> Any:
        return self.bps.allgather(t, name=name, process_set=process_set)

    def hvd_broadcast(self, t: Any, root: int, name: str, process_set=None) -> Any:
        return self.bps.broadcast(t, root, name=name, process_set=process_set)

    def reducescatter(self, t: Any, name: str, average: bool, process_set=None) -> Any:
        return self.bps.reducescatter(t, name=name,
                                      op=self.bps.Average if average else self.bps.Sum,
                                      process_set=process_set)

    def allreduce_sum(self, t: Any, name: str, process_set=None) -> Any:
        return self.bps.allreduce(t, op=self.bps.Sum, name=name, process_set=process_set)

    def alltoall(self, t: Any, splits, name: str, process_set=None):
        return (self.bps.alltoall(t, splits=splits, name=name, process_set=process_set),
                None)  # MXNet's: the output

    # ---------------------------------------------------------------- tiny model
    def make_model(self, weights: Dict[str, np.ndarray]) -> Any:
        mx = self.mx
        params = mx.gluon.ParameterDict(prefix=f"model{next(_models)}_")
        for n in PARAM_NAMES:
            p = params.get(n, shape=weights[n].shape, dtype=np.float32)
            p.initialize(ctx=mx.cpu())
            p.set_data(mx.nd.array(weights[n], dtype=np.float32))
        return params

    def _param(self, model: Any, n: str) -> Any:
        return model[model.prefix + n]

    def get_weights(self, model: Any) -> Dict[str, np.ndarray]:
        return {n: self._param(model, n).data().asnumpy().copy() for n in PARAM_NAMES}

    def _loss(self, model: Any, b: Batch) -> Any:
        nd = self.mx.nd
        w = {n: self._param(model, n).data() for n in PARAM_NAMES}
        x, y = nd.array(b.x), nd.array(b.y)
        h = nd.tanh(nd.dot(x, w["w1"]) + w["b1"])
        out = nd.dot(h, w["w2"]) + w["b2"]
        if b.extra_rows is not None:
            mask = nd.array(b.extra_rows).reshape((-1, 1))
            out = out + nd.broadcast_mul(x[:, :1] * mask, w["extra"].reshape((1, -1)))
        return nd.mean(nd.square(out - y))

    def make_optimizer(self, model: Any, lr: float, momentum: float) -> Any:
        trainer = self.mx.gluon.Trainer(model, "sgd", {"learning_rate": lr,
                                                       "momentum": momentum}, kvstore=None)
        return ("trainer", trainer)

    def distributed_optimizer(self, model: Any, lr: float, momentum: float, variant: str,
                              compression: str = "none",
                              backward_passes_per_step: int = 1) -> Any:
        mx, bps = self.mx, self.bps
        if variant == "trainer":
            params = {"fp16": True} if compression == "fp16" else None
            return ("trainer", bps.DistributedTrainer(
                model, "sgd", {"learning_rate": lr, "momentum": momentum},
                compression_params=params))
        if variant == "optimizer":
            assert backward_passes_per_step == 1, "optimizer variant: one micro-batch per step"
            comp = {"none": bps.Compression.none, "fp16": bps.Compression.fp16}[compression]
            opt = bps.DistributedOptimizer(
                mx.optimizer.SGD(learning_rate=lr, momentum=momentum), compression=comp)
            return ("updater", mx.optimizer.get_updater(opt))
        raise ValueError(f"unknown variant {variant!r}")

    def train_step(self, model: Any, optimizer: Any, micro_batches: Sequence[Batch]) -> None:
        autograd = self.mx.autograd
        params = [self._param(model, n) for n in PARAM_NAMES]
        kind, opt = optimizer
        accumulate = len(micro_batches) > 1
        for p in params:
            p.grad_req = "add" if accumulate else "write"
            if accumulate or kind == "updater":
                # The updater path stands for the Module API, whose executor writes every
                # gradient on every step: a parameter this rank does not use must hold zeros,
                # not the previous step's averaged gradient.
                p.zero_grad()
        for b in micro_batches:
            with autograd.record():
                loss = self._loss(model, b)
            loss.backward()
        if kind == "trainer":
            # The loss is already a mean; `extra` gets no gradient when no batch uses it.
            opt.step(1, ignore_stale_grad=True)
        else:
            for i, p in enumerate(params):
                opt(i, p.grad(), p.data())
        for p in params:
            p.data().wait_to_read()
