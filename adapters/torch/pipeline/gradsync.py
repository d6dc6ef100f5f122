"""Gradient synchronisation of a replicated stage through byteps' summation service.

The replicas of a stage sum their k-th backward's gradients with push_pull and divide by the
replica count (each replica's gradient is already its minibatch's mean), then step together.
byteps has no process groups: a push_pull round completes when every worker of the job has
pushed, so every worker that is not a replica of the stage pushes zeros for each of that
stage's rounds, from a thread of its own (:class:`ZeroContributor`) that keeps one round
ahead and never blocks the worker's own pipeline work. The names are declared on every rank,
stage by stage and layer by layer, so the default priority (earlier declared first) sends the
earlier layers' gradients first, as the next forward needs them first (docs/architecture.md §5).
"""

from __future__ import annotations

import threading
from typing import Dict, List, Sequence

import torch

from byteps import basics
from byteps.errors import BytePSError

_TORCH_DTYPE = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def stage_tensor_names(run: int, stage: int, param_names: Sequence[str]) -> List[str]:
    """The push_pull names of a stage's gradients: ``pipeline.<run>.s<stage>.<param>``."""
    return [f"pipeline.{run}.s{stage}.{n}" for n in param_names]


class _Tensors:
    """One stage's gradients as push_pull tensors: names, shapes, dtypes."""

    def __init__(self, names: Sequence[str], shapes: Sequence[torch.Size],
                 dtypes: Sequence[torch.dtype]):
        self.names = list(names)
        self.shapes = [list(s) for s in shapes]
        self.dtypes = list(dtypes)

    def start(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
              index: int = 0) -> list:
        """push_pull (sum) of tensors ``index``, ``index + 1``... from ``inputs`` into
        ``outputs``; their handles."""
        handles = []
        for name, shape, x, y in zip(self.names[index:], self.shapes[index:], inputs, outputs):
            nbytes = x.numel() * x.element_size()
            handles.append(basics.push_pull_async(name, x.data_ptr(), y.data_ptr(), nbytes,
                                                  _TORCH_DTYPE[x.dtype], shape, False))
        return handles


class ReplicaSync:
    """The gradient sum of one replica of a replicated stage. Each parameter's push_pull starts
    as soon as the backward has produced its gradient (:meth:`start`, from a tensor hook), so
    the summation of later layers overlaps the backward of earlier ones; :meth:`finish` starts
    what the backward did not reach (zeros) and waits."""

    def __init__(self, names: Sequence[str], params: Sequence[torch.Tensor], replicas: int):
        for p in params:
            if p.dtype not in _TORCH_DTYPE:
                raise BytePSError(f"pipeline: a {p.dtype} parameter cannot be synchronised")
        self.replicas = replicas
        self._t = _Tensors(names, [p.shape for p in params], [p.dtype for p in params])
        self._bufs = [torch.zeros_like(p, memory_format=torch.contiguous_format)
                      for p in params]
        self._handles: Dict[int, int] = {}

    def start(self, i: int, grad: torch.Tensor) -> None:
        """Starts summing parameter ``i``'s gradient (this replica's) of this round."""
        if i in self._handles:  # autograd hands a leaf its summed gradient once
            basics.wait(self._handles.pop(i))
            raise BytePSError(f"pipeline: parameter {self._t.names[i]} got two gradients in "
                              f"one backward")
        self._bufs[i].copy_(grad)
        self._handles[i] = self._t.start([self._bufs[i]], [self._bufs[i]], index=i)[0]

    def hook(self, i: int):
        """A tensor hook that starts parameter ``i``'s sum (for ``Tensor.register_hook``)."""
        def fn(grad):
            self.start(i, grad)
        return fn

    def finish(self) -> List[torch.Tensor]:
        """The replicas' mean gradient of every parameter; blocks until every worker has
        pushed this round."""
        for i, b in enumerate(self._bufs):
            if i not in self._handles:
                b.zero_()
                self._handles[i] = self._t.start([b], [b], index=i)[0]
        handles, self._handles = self._handles, {}
        for h in handles.values():
            basics.wait(h)
        return [b / self.replicas for b in self._bufs]

    def average(self, grads: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """The replicas' mean of ``grads`` (one per parameter, this replica's), all at once."""
        for i, g in enumerate(grads):
            self.start(i, g)
        return self.finish()


class ZeroContributor:
    """A thread pushing zeros for ``rounds`` rounds of a stage this worker does not run."""

    def __init__(self, names: Sequence[str], shapes: Sequence[torch.Size],
                 dtypes: Sequence[torch.dtype]):
        self._t = _Tensors(names, shapes, dtypes)
        self._zeros = [torch.zeros(s, dtype=d) for s, d in zip(shapes, dtypes)]
        self._out = [torch.empty(s, dtype=d) for s, d in zip(shapes, dtypes)]
        self._thread = None
        self.error: BaseException = None

    def start(self, rounds: int) -> None:
        def run():
            try:
                for _ in range(rounds):
                    for h in self._t.start(self._zeros, self._out):
                        basics.wait(h)
            except BaseException as exc:  # reported by join()
                self.error = exc
        self._thread = threading.Thread(target=run, name="pipeline-zero-push", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Waits for the rounds; raises the thread's error (or BytePSError after timeout)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise BytePSError(f"pipeline: the zero gradients of {self._t.names[0]}... "
                                  f"were not summed within {timeout} s")
            self._thread = None
        if self.error is not None:
            raise self.error


def declare_all(run: int, stages: Sequence[Dict]) -> Dict[int, List[str]]:
    """Declares, in one order on every rank, the gradient names of every replicated stage
    (``stages[s]`` = {"replicas": r, "params": [(name, shape, dtype)...]}); returns the names
    per stage index."""
    out = {}
    for s, st in enumerate(stages):
        if st["replicas"] <= 1 or not st["params"]:
            continue
        out[s] = stage_tensor_names(run, s, [n for n, _, _ in st["params"]])
        for name in out[s]:
            basics.declare(name)
    return out
