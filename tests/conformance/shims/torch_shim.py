"""Shim for ``byteps.torch`` (CPU tensors)."""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import numpy as np

from .base import ALL_DTYPES, PARAM_NAMES, Batch, Shim


class TorchShim(Shim):
    name = "torch"
    dtypes = ALL_DTYPES
    capabilities = frozenset({"inplace", "async", "concurrent", "broadcast_object", "fp16", "optimizer",
                              "backward_passes", "compression"})
    optimizer_variants = ("optimizer",)
    backward_passes_variants = ("optimizer",)

    def init(self) -> None:
        import torch

        import byteps.errors
        import byteps.torch as bps

        torch.set_num_threads(1)
        self.torch = torch
        self.bps = bps
        self.errors = byteps.errors
        self._dtypes = {
            "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8,
            "int32": torch.int32, "int64": torch.int64,
        }
        self._names = {v: k for k, v in self._dtypes.items()}
        bps.init()

    # ---------------------------------------------------------------- tensors
    def tensor(self, array: np.ndarray, dtype: str) -> Any:
        arr = np.asarray(array)
        if dtype == "bfloat16":
            return self.torch.tensor(arr.astype(np.float32)).to(self.torch.bfloat16)
        return self.torch.tensor(arr.astype(dtype))

    def to_numpy(self, t: Any) -> np.ndarray:
        t = t.detach()
        if t.dtype == self.torch.bfloat16:
            t = t.float()
        return t.numpy().copy()

    def dtype_of(self, t: Any) -> str:
        return self._names.get(t.dtype, str(t.dtype))

    def unsupported_tensor(self) -> Tuple[Any, str]:
        return self.torch.ones(3, dtype=self.torch.bool), "torch.bool"

    # ---------------------------------------------------------------- collectives
    def push_pull(self, t: Any, average: bool, name: str) -> Any:
        return self.bps.push_pull(t, average=average, name=name)

    def push_pull_inplace(self, t: Any, average: bool, name: str) -> Any:
        return self.bps.push_pull_inplace(t, average=average, name=name)

    def push_pull_async(self, t: Any, average: bool, name: str, inplace: bool = False) -> Any:
        if inplace:
            return self.bps.push_pull_async_inplace(t, average=average, name=name)
        return self.bps.push_pull_async(t, average=average, name=name)

    def poll(self, handle: Any) -> bool:
        return bool(self.bps.poll(handle))

    def synchronize(self, handle: Any) -> Any:
        return self.bps.synchronize(handle)

    def push_pull_fp16(self, t: Any, average: bool, name: str) -> Any:
        return self.bps.push_pull(t, average=average, name=name,
                                  compression=self.bps.Compression.fp16)

    def fp16_round_trip(self, t: Any) -> Tuple[Any, Any]:
        comp = self.bps.Compression.fp16
        compressed, ctx = comp.compress(t)
        return compressed, comp.decompress(compressed, ctx)

    def broadcast(self, t: Any, root: int, name: str) -> Any:
        out = t.clone()
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
        out, received = self.bps.alltoall(t, splits=splits, name=name,
                                          process_set=process_set)
        return out, received.tolist()

    # ---------------------------------------------------------------- tiny model
    def make_model(self, weights: Dict[str, np.ndarray]) -> Any:
        torch = self.torch
        model = torch.nn.ParameterDict({
            n: torch.nn.Parameter(torch.tensor(weights[n], dtype=torch.float32))
            for n in PARAM_NAMES
        })
        return model

    def get_weights(self, model: Any) -> Dict[str, np.ndarray]:
        return {n: model[n].detach().numpy().copy() for n in PARAM_NAMES}

    def _loss(self, model: Any, b: Batch) -> Any:
        torch = self.torch
        x = torch.from_numpy(b.x)
        y = torch.from_numpy(b.y)
        h = torch.tanh(x @ model["w1"] + model["b1"])
        out = h @ model["w2"] + model["b2"]
        if b.extra_rows is not None:
            mask = torch.from_numpy(b.extra_rows)
            out = out + x[:, :1] * model["extra"] * mask[:, None]
        return ((out - y) ** 2).mean()

    def make_optimizer(self, model: Any, lr: float, momentum: float) -> Any:
        return self.torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)

    def distributed_optimizer(self, model: Any, lr: float, momentum: float, variant: str,
                              compression: str = "none",
                              backward_passes_per_step: int = 1,
                              compression_params=None) -> Any:
        assert variant == "optimizer", variant
        comp = {"none": self.bps.Compression.none, "fp16": self.bps.Compression.fp16}[compression]
        base = self.make_optimizer(model, lr, momentum)
        return self.bps.DistributedOptimizer(
            base, named_parameters=list(model.named_parameters()), compression=comp,
            backward_passes_per_step=backward_passes_per_step,
            compression_params=compression_params)

    def gradients(self, weights: Dict[str, np.ndarray], b: Batch):
        model = self.make_model(weights)
        self._loss(model, b).backward()
        return {n: None if model[n].grad is None else model[n].grad.numpy().copy()
                for n in PARAM_NAMES}

    def train_step(self, model: Any, optimizer: Any, micro_batches: Sequence[Batch]) -> None:
        optimizer.zero_grad()
        for b in micro_batches:
            self._loss(model, b).backward()
        optimizer.step()

    def close_optimizer(self, optimizer: Any) -> None:
        remove = getattr(optimizer, "_bps_remove_hooks", None)
        if remove is not None:
            remove()
