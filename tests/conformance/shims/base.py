"""The shim interface: what a semantic case may ask of a framework adapter.

A case (``cases.py``) is written once, against :class:`Shim`, in NumPy terms: it builds
rank-dependent NumPy inputs, turns them into framework tensors with :meth:`Shim.tensor`, calls
the byteps operation through the shim, and compares :meth:`Shim.to_numpy` of the result with
an expected value it computed itself. A shim is a thin translation layer, one per framework
(``torch_shim.py``, ``tensorflow_shim.py``, ...): it must not add semantics of its own (no
retries, no averaging, no error translation), so a conformance failure is the adapter's.

Dtypes are named by strings (``"float16"``, ``"bfloat16"``, ``"float32"``, ``"float64"``,
``"int8"``, ``"uint8"``, ``"int32"``, ``"int64"``). NumPy has no bfloat16: bfloat16 data travel
as float32 arrays holding bfloat16-representable values, and :meth:`Shim.to_numpy` returns
bfloat16 tensors as float32.

Capabilities: a framework that cannot express an operation (e.g. TensorFlow has no in-place
push_pull of an immutable ``tf.Tensor``) leaves the matching name out of
:attr:`Shim.capabilities`; cases that need it are reported as ``SKIP`` with the reason, and the
pytest driver checks that only cases needing a declared-missing capability are skipped.

The tiny model (for the optimizer cases) is defined here, in NumPy, so that every framework
trains exactly the same function from exactly the same initial weights::

    h   = tanh(x @ w1 + b1)                 x: (B, 4), w1: (4, 8), b1: (8,)
    out = h @ w2 + b2 [+ x[:, :1] * extra * extra_rows[:, None]]
                                            w2: (8, 2), b2: (2,), extra: (2,)
    loss = mean((out - y) ** 2)             mean over all B * 2 entries

``extra`` takes part only when a row mask ``extra_rows`` is given (used for "a parameter that
gets no gradient on some ranks": rank 0 passes a mask, the other ranks pass ``None`` so the
parameter is not used at all in their forward pass).
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

#: Every dtype name a shim may list in :attr:`Shim.dtypes`.
ALL_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})

#: Capability names (see :attr:`Shim.capabilities`).
CAPABILITIES = frozenset({
    "inplace",              # push_pull_inplace: the result lands in the argument itself
    "async",                # a native push_pull_async / poll / synchronize handle API
    "concurrent",           # several operations of one rank in flight at once (start/finish)
    "broadcast_object",     # broadcast of an arbitrary picklable Python object
    "fp16",                 # Compression.fp16
    "optimizer",            # a DistributedOptimizer-style wrapper (see optimizer_variants)
    "backward_passes",      # backward_passes_per_step > 1
    "compression",          # compression_params of the distributed optimizer (core compressors)
})

#: The model's parameters, in the order get_weights()/make_model() use.
PARAM_SHAPES: Dict[str, Tuple[int, ...]] = {
    "w1": (4, 8),
    "b1": (8,),
    "w2": (8, 2),
    "b2": (2,),
    "extra": (2,),
}
PARAM_NAMES: Tuple[str, ...] = tuple(PARAM_SHAPES)


def initial_weights(seed: int) -> Dict[str, np.ndarray]:
    """Deterministic float32 initial weights of the tiny model (same on every rank)."""
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * 0.5).astype(np.float32)
            for name, shape in PARAM_SHAPES.items()}


def numpy_forward(weights: Dict[str, np.ndarray], x: np.ndarray,
                  extra_rows: Optional[np.ndarray] = None) -> np.ndarray:
    """The model's forward pass in NumPy (documentation and shim self-checks)."""
    h = np.tanh(x @ weights["w1"] + weights["b1"])
    out = h @ weights["w2"] + weights["b2"]
    if extra_rows is not None:
        out = out + x[:, :1] * weights["extra"] * extra_rows[:, None]
    return out


class Batch:
    """One micro-batch: inputs ``x`` (B, 4), targets ``y`` (B, 2), both float32, and an
    optional float32 row mask ``extra_rows`` (B,) switching on the ``extra`` parameter."""

    __slots__ = ("x", "y", "extra_rows")

    def __init__(self, x: np.ndarray, y: np.ndarray, extra_rows: Optional[np.ndarray] = None):
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.y = np.ascontiguousarray(y, dtype=np.float32)
        self.extra_rows = (None if extra_rows is None
                           else np.ascontiguousarray(extra_rows, dtype=np.float32))

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """The batches stacked row-wise; a batch without a mask contributes zero mask rows
        (its forward pass did not use ``extra``), unless no batch has a mask."""
        xs = np.concatenate([b.x for b in batches])
        ys = np.concatenate([b.y for b in batches])
        if all(b.extra_rows is None for b in batches):
            return Batch(xs, ys)
        masks = [b.extra_rows if b.extra_rows is not None else np.zeros(len(b.x), np.float32)
                 for b in batches]
        return Batch(xs, ys, np.concatenate(masks))


class Shim:
    """Base class of the per-framework shims. Subclasses implement the methods that raise
    ``NotImplementedError``; the defaults of the others are written in terms of those."""

    #: Framework name, as on the command line of ``worker.py`` (``"torch"``, ``"tensorflow"``).
    name: str = "base"
    #: Dtype names the framework's adapter supports (subset of :data:`ALL_DTYPES`).
    dtypes: Tuple[str, ...] = ()
    #: Supported capabilities (subset of :data:`CAPABILITIES`).
    capabilities: FrozenSet[str] = frozenset()
    #: Why each missing capability is missing (printed in SKIP lines).
    missing_reasons: Dict[str, str] = {}
    #: The ways this framework reduces gradients in training (for the optimizer cases), e.g.
    #: ``("optimizer",)`` or ``("optimizer", "tape")``.
    optimizer_variants: Tuple[str, ...] = ()
    #: Variants that accept ``backward_passes_per_step > 1``.
    backward_passes_variants: Tuple[str, ...] = ()

    #: Re-exported so cases need not import this package.
    Batch = Batch
    initial_weights = staticmethod(initial_weights)

    def __init__(self) -> None:
        self.bps: Any = None      # the framework's byteps module, set by init()
        self.errors: Any = None   # byteps.errors

    # ---------------------------------------------------------------- lifecycle / basics
    def init(self) -> None:
        """Import the framework and its byteps module, call ``bps.init()``; set ``self.bps``
        and ``self.errors``."""
        raise NotImplementedError

    def shutdown(self) -> None:
        self.bps.shutdown()

    def rank(self) -> int:
        return int(self.bps.rank())

    def size(self) -> int:
        return int(self.bps.size())

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    # ---------------------------------------------------------------- tensors
    def tensor(self, array: np.ndarray, dtype: str) -> Any:
        """A framework tensor of dtype ``dtype`` holding ``array``'s values (exactly
        representable values only; a fresh, independent tensor)."""
        raise NotImplementedError

    def mutable(self, array: np.ndarray, dtype: str) -> Any:
        """A mutable container of ``array`` for the in-place cases (a tensor, a
        ``tf.Variable``...); default: :meth:`tensor`."""
        return self.tensor(array, dtype)

    def to_numpy(self, t: Any) -> np.ndarray:
        """A NumPy copy of ``t`` (bfloat16 as float32)."""
        raise NotImplementedError

    def dtype_of(self, t: Any) -> str:
        """``t``'s dtype name (one of :data:`ALL_DTYPES`)."""
        raise NotImplementedError

    def unsupported_tensor(self) -> Tuple[Any, str]:
        """A tensor of a dtype the adapter must refuse with ``TypeError`` (e.g. bool), and a
        description of it."""
        raise NotImplementedError

    # ---------------------------------------------------------------- collectives
    def push_pull(self, t: Any, average: bool, name: str) -> Any:
        """Synchronous out-of-place push_pull; returns the result tensor."""
        raise NotImplementedError

    def push_pull_inplace(self, t: Any, average: bool, name: str) -> Any:
        """Synchronous in-place push_pull: the result is written into ``t`` (capability
        ``inplace``); returns ``t``."""
        raise NotImplementedError

    def push_pull_async(self, t: Any, average: bool, name: str, inplace: bool = False) -> Any:
        """Start a push_pull; returns a handle (capability ``async``)."""
        raise NotImplementedError

    def poll(self, handle: Any) -> bool:
        raise NotImplementedError

    def synchronize(self, handle: Any) -> Any:
        """Wait for ``handle``; returns the result tensor."""
        raise NotImplementedError

    def start(self, t: Any, average: bool, name: str) -> Any:
        """Start an out-of-place push_pull without waiting (capability ``concurrent``); the
        operation must have reached the core when this returns. Default: the async API."""
        return self.push_pull_async(t, average, name)

    def finish(self, handle: Any) -> Any:
        """Wait for an operation begun by :meth:`start`; returns the result tensor."""
        return self.synchronize(handle)

    def push_pull_many(self, tensors: Sequence[Any], average: bool,
                       names: Sequence[str]) -> List[Any]:
        """Reduce all ``tensors`` with all operations in flight at once (default: start them
        all asynchronously, then wait in reverse order)."""
        handles = [self.push_pull_async(t, average, n) for t, n in zip(tensors, names)]
        results: List[Any] = [None] * len(handles)
        for i in reversed(range(len(handles))):
            results[i] = self.synchronize(handles[i])
        return results

    def push_pull_fp16(self, t: Any, average: bool, name: str) -> Any:
        """push_pull with ``compression=Compression.fp16`` (capability ``fp16``)."""
        raise NotImplementedError

    def fp16_round_trip(self, t: Any) -> Tuple[Any, Any]:
        """``(compressed, decompressed)`` through ``Compression.fp16``, no communication."""
        raise NotImplementedError

    def broadcast(self, t: Any, root: int, name: str) -> Any:
        """Broadcast ``t`` from ``root``; returns the broadcast value (a tensor or variable)."""
        raise NotImplementedError

    def broadcast_object(self, obj: Any, root: int, name: str) -> Any:
        """Broadcast a picklable object from ``root`` (capability ``broadcast_object``)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- Horovod's collectives
    # Each of these takes Horovod's ``process_set=`` (None: every rank).
    def allgather(self, t: Any, name: str, process_set=None) -> Any:
        """Horovod's ``allgather``: the ranks' ``t`` concatenated along the first dimension."""
        raise NotImplementedError

    def hvd_broadcast(self, t: Any, root: int, name: str, process_set=None) -> Any:
        """Horovod's ``broadcast`` (the adapter's function of that name): ``root``'s ``t``."""
        raise NotImplementedError

    def reducescatter(self, t: Any, name: str, average: bool, process_set=None) -> Any:
        """Horovod's ``reducescatter`` with op Sum (or Average): this rank's shard."""
        raise NotImplementedError

    def alltoall(self, t: Any, splits, name: str, process_set=None):
        """Horovod's ``alltoall`` with ``splits``: ``(output, received splits as a list, or
        None where the framework's function does not return them)``."""
        raise NotImplementedError

    def allreduce_sum(self, t: Any, name: str, process_set=None) -> Any:
        """Horovod's ``allreduce`` with op Sum."""
        raise NotImplementedError

    def join(self) -> int:
        """Horovod's ``join`` (the adapter's re-export of ``byteps.collectives.join``)."""
        return self.bps.join()

    def add_process_set(self, ranks):
        """Horovod's ``add_process_set`` (the adapter's re-export of
        ``byteps.process_sets.add_process_set``)."""
        return self.bps.add_process_set(ranks)

    # ---------------------------------------------------------------- tiny model
    def make_model(self, weights: Dict[str, np.ndarray]) -> Any:
        """A fresh model (trainable parameters named :data:`PARAM_NAMES`) holding
        ``weights``."""
        raise NotImplementedError

    def get_weights(self, model: Any) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def make_optimizer(self, model: Any, lr: float, momentum: float) -> Any:
        """The framework's plain (non-distributed) SGD with momentum for ``model``."""
        raise NotImplementedError

    def distributed_optimizer(self, model: Any, lr: float, momentum: float, variant: str,
                              compression: str = "none",
                              backward_passes_per_step: int = 1) -> Any:
        """A trainer object for ``variant`` (one of :attr:`optimizer_variants`) that averages
        gradients across ranks; ``compression`` is ``"none"`` or ``"fp16"``."""
        raise NotImplementedError

    def train_step(self, model: Any, optimizer: Any, micro_batches: Sequence[Batch]) -> None:
        """One optimizer step: accumulate (sum) the gradients of the mean-squared-error loss
        of every micro-batch, then apply them. ``optimizer`` is what :meth:`make_optimizer`
        (local training) or :meth:`distributed_optimizer` returned."""
        raise NotImplementedError

    def close_optimizer(self, optimizer: Any) -> None:
        """Release what a distributed optimizer holds (hooks), so the model can be reused."""
