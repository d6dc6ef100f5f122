"""``DistributedOptimizer``: averages gradients across workers before each optimizer step
(upstream ``byteps/torch/__init__.py`` ``_DistributedOptimizer``, Horovod semantics).

How it works: every parameter gets a ``register_post_accumulate_grad_hook``. When a
parameter's gradient has been accumulated ``backward_passes_per_step`` times, the hook starts an
asynchronous in-place push_pull (average) of the (compressed) gradient under the name
``"Gradient.<name>"``, so communication overlaps with the rest of the backward pass.
:meth:`synchronize` starts the parameters whose hook did not fire, waits for all of them and
writes the averaged gradients into ``p.grad``; :meth:`step` calls it and then the wrapped
optimizer's own ``step``.

In asynchronous training (``BYTEPS_ENABLE_ASYNC=1``, docs/async.md) no gradient is reduced:
:meth:`step` runs the wrapped optimizer locally and exchanges each parameter's delta for the
servers' current parameters (``byteps.torch._async``).

With ``compression_params`` (upstream's MXNet dict, see :mod:`byteps.sync.compression`) every
gradient is declared with the core's compressor kwargs before its first push_pull, the
optimizer's learning rate is handed to the core (error feedback) before each step's first
push_pull, and ``momentum: nesterov`` moves the optimizer's momentum into the core.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

import byteps.sync.compression as core_compression
from byteps import basics as _basics
from byteps.errors import InvalidArgumentError, InvalidTypeError, UsageError
from byteps.sync import async_train

from . import _async, _gradients, gather_scatter, ops
from ._gradients import name_parameters as _name_parameters
from ._gradients import resolve_compression as _resolve_compression
from ._horovod_options import HorovodOptions
from .compression import Compression

__all__ = ["DistributedOptimizer", "_DistributedOptimizer"]

_ZERO_GRAD_ERROR = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(); the gradients are still being reduced. Call zero_grad() before "
    "backward() or after step()."
)


def _unhooked(fn):
    """The optimizer's ``step`` without torch's hook/profiling wrapper (which our own ``step``
    already went through), so user step hooks do not run twice."""
    if getattr(fn, "hooked", False) and hasattr(fn, "__wrapped__"):
        return fn.__wrapped__
    return fn


def _optimizer_momentum(param_groups: List[dict]) -> Optional[float]:
    """The optimizer's momentum (the same in every group), or None if it has none or 0.

    Raises:
        InvalidArgumentError: the groups have different momenta (one mu for the core).
    """
    values = {float(g["momentum"]) for g in param_groups if "momentum" in g}
    if len(values) > 1:
        raise InvalidArgumentError(
            "compression_params momentum 'nesterov': the parameter groups have different "
            f"momenta {sorted(values)}; the core applies one mu (give 'momentum_mu')")
    mu = values.pop() if values else 0.0
    return mu or None


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods copied into the dynamic subclass built by :func:`DistributedOptimizer`.

    Never instantiated directly. ``_bps_base`` is the wrapped optimizer's class.
    """

    _bps_base = torch.optim.Optimizer
    _bps_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 compression_params=None, horovod: Optional[HorovodOptions] = None):
        self._bps_base.__init__(self, params)
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise InvalidArgumentError(
                f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}"
            )
        self._compression = _resolve_compression(compression, compression_params)
        optimizer_mu = None
        if isinstance(compression_params, Mapping) and "momentum" in compression_params \
                and "momentum_mu" not in compression_params:
            optimizer_mu = _optimizer_momentum(self.param_groups)
        # The core's compressor kwargs of every floating gradient ({}: no core compression).
        self._bps_kwargs = core_compression.compression_kwargs(compression_params, optimizer_mu)
        self._bps_mu = core_compression.nesterov_mu(self._bps_kwargs)
        self._bps_lr_sent = False
        self._parameter_names = _name_parameters(named_parameters, self.param_groups)
        self._bps_params = list(self._parameter_names)
        # Earlier parameters (usually nearer the input) are needed first by the next forward
        # pass: give them higher priority (ByteScheduler). Explicit, never 0 (= core default).
        self._priorities = {p: -(i + 1) for i, p in enumerate(self._bps_params)}
        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {p: backward_passes_per_step for p in self._bps_params}
        self._handles: Dict[torch.Tensor, Tuple[int, Any]] = {}
        self._hook_handles: List[Any] = []
        self._synchronized = False
        self._should_synchronize = True
        self._size = ops.size()  # raises NotInitializedError before init()
        # Horovod's op, gradient_predivide_factor, groups, sparse_as_dense and process set.
        self._hvd = horovod or HorovodOptions.make()
        if self._hvd.process_set is not None:
            self._size = self._hvd.process_set.size()
        self._hvd.bind(self._bps_params, compression_params, self._size)
        # Asynchronous training: no gradient is reduced; step() exchanges parameter deltas.
        self._bps_async_params = None
        if async_train.enabled():
            if compression is not Compression.none or compression_params:
                raise InvalidArgumentError(
                    "DistributedOptimizer in asynchronous training (BYTEPS_ENABLE_ASYNC=1) "
                    "pushes parameter deltas uncompressed: compression and compression_params "
                    "are not supported")
            self._grad_names, self._bps_nag = {}, {}
            self._bps_async_params = _async.AsyncParameters(
                [(self._parameter_names[p], p) for p in self._bps_params])
            return
        # One name per gradient, fixed dtype/shape (a second optimizer over another model
        # with the same parameter names gets "~k"-suffixed names, see ops._name_for), all
        # declared up front: same keys on every rank whatever order the hooks fire in.
        self._grad_names, wire = _gradients.declare_gradients(
            self._bps_params, self._parameter_names, "Gradient.", self._compression,
            self._bps_kwargs, self._hvd.process_set)
        # Nesterov momentum of the gradients the core does not compress (too small, not
        # floating, or a job that is not distributed): applied here after the reduction
        # (upstream MXNet's Compression.nag). Their momentum buffers, by parameter.
        self._bps_nag: Dict[torch.Tensor, Optional[torch.Tensor]] = {}
        if self._bps_mu is not None:
            for p in _gradients.uncompressed_by_core(self._grad_names, wire):
                self._bps_nag[p] = None
            self._move_momentum_to_core()
        if self._size > 1:
            self._register_hooks()

    def _move_momentum_to_core(self) -> None:
        """Set every group's momentum to 0 (and nesterov off): the core's Nesterov momentum
        (and :meth:`_apply_nag` for uncompressed gradients) replaces it, as upstream's MXNet
        trainer removed ``momentum`` from the optimizer's parameters."""
        changed = [g["momentum"] for g in self.param_groups if g.get("momentum")]
        for g in self.param_groups:
            if "momentum" in g:
                g["momentum"] = 0.0
            if g.get("nesterov"):
                g["nesterov"] = False
        if changed:
            warnings.warn(
                f"compression_params momentum 'nesterov' (mu={self._bps_mu}): the optimizer's "
                f"momentum {changed[0]} is set to 0; byteps applies Nesterov momentum to the "
                "gradients instead (in the core before compressing, or after the reduction for "
                "gradients the core does not compress)", stacklevel=4)

    def _apply_nag(self) -> None:
        """Nesterov momentum of the uncompressed gradients: ``m = mu*m + g; g += mu*m``."""
        mu = self._bps_mu
        with torch.no_grad():
            for p, m in self._bps_nag.items():
                if p.grad is None:
                    continue
                if m is None:
                    m = self._bps_nag[p] = torch.zeros_like(p.grad)
                m.mul_(mu).add_(p.grad)
                p.grad.add_(m, alpha=mu)

    def _send_learning_rate(self) -> None:
        """Hand the current learning rate to the core once per step, before its first
        push_pull (error feedback's correction uses it; upstream wrote it to ``lr.s``)."""
        if self._bps_kwargs and not self._bps_lr_sent:
            _basics.set_learning_rate(float(self.param_groups[0]["lr"]))
            self._bps_lr_sent = True

    # ---------------------------------------------------------------- hooks and reduction
    def _register_hooks(self) -> None:
        for p in self._bps_params:
            if p.requires_grad:
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook()))

    def _make_hook(self):
        def hook(p: torch.Tensor) -> None:
            if p in self._handles:
                raise UsageError(
                    "Gradients were computed more than backward_passes_per_step "
                    f"({self.backward_passes_per_step}) times before optimizer.step() or "
                    "optimizer.synchronize(). Increase backward_passes_per_step to accumulate "
                    "gradients locally."
                )
            self._delay[p] -= 1
            if self._delay[p] <= 0:
                for q in self._hvd.ready(p):  # p, or its whole group once all are ready
                    self._handles[q] = self._push_pull_grad_async(q)
        return hook

    def _push_pull_grad_async(self, p: torch.Tensor) -> Tuple[int, Any]:
        if p.grad is None:
            # No gradient on this rank (the parameter was not used): contribute zeros, so the
            # ranks that did compute one are not left waiting.
            p.grad = torch.zeros_like(p, memory_format=torch.preserve_format).detach()
        if p.grad.is_sparse:
            if not self._hvd.sparse_as_dense:  # Horovod: indices and values allgathered
                g = p.grad.coalesce()
                name = self._grad_names[p]
                ps = self._hvd.process_set
                return ("sparse", gather_scatter.allgather_async(
                    g.indices().t().contiguous(), name=f"{name}.indices", process_set=ps),
                    gather_scatter.allgather_async(g.values().contiguous(),
                                                   name=f"{name}.values", process_set=ps)), None
            p.grad = p.grad.to_dense()
        self._send_learning_rate()
        if self._hvd.prescale != 1.0:
            with torch.no_grad():
                p.grad.mul_(self._hvd.prescale)
        compressed, ctx = self._compression.compress(p.grad)
        handle = ops.push_pull_async_inplace(
            compressed, average=self._hvd.average, name=self._grad_names[p],
            priority=self._priorities[p], process_set=self._hvd.process_set,
        )
        return handle, ctx

    def synchronize(self) -> None:
        """Finish the gradient reduction: start push_pull for every parameter whose hook has
        not fired this step (a parameter without a gradient contributes zeros), wait for all,
        and write the averaged gradients (decompressed) into ``p.grad``.

        Call it before modifying gradients (e.g. clipping), then call :meth:`step` inside
        :meth:`skip_synchronize`. All ranks must call it (it is a collective).

        Raises:
            the first byteps error of any reduction (after waiting for all of them).
        """
        if self._bps_async_params is not None:
            return  # asynchronous training: gradients stay local
        if self._size > 1:
            for p in self._bps_params:
                if p.requires_grad and p not in self._handles:
                    self._handles[p] = self._push_pull_grad_async(p)
        self._hvd.reset()
        first_error: Optional[BaseException] = None
        handles, self._handles = self._handles, {}
        for p, (handle, ctx) in handles.items():
            try:
                if isinstance(handle, tuple):  # a sparse gradient's indices and values
                    indices, values = ops.synchronize(handle[1]), ops.synchronize(handle[2])
                    p.grad = self._hvd.sparse_result(indices, values, p.shape)
                    continue
                output = ops.synchronize(handle)
            except Exception as e:  # keep draining, so no buffer is left to the core
                first_error = first_error or e
                continue
            result = self._compression.decompress(output, ctx)
            with torch.no_grad():
                if result is not p.grad:
                    p.grad.copy_(result)
                if self._hvd.postscale != 1.0:
                    p.grad.mul_(self._hvd.postscale)
        for p in self._bps_params:
            self._delay[p] = self.backward_passes_per_step
        self._synchronized = True
        self._bps_lr_sent = False
        if first_error is not None:
            raise first_error
        if self._bps_nag:
            self._apply_nag()

    @contextmanager
    def skip_synchronize(self):
        """Context manager: :meth:`step` inside it does not call :meth:`synchronize`.

        For use after an explicit ``optimizer.synchronize()``, e.g.::

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated locally before a reduction starts
        (resets the per-parameter countdowns)."""
        if not isinstance(passes, int) or passes < 1:
            raise InvalidArgumentError(
                f"backward_passes_per_step must be an int >= 1, got {passes!r}")
        self.backward_passes_per_step = passes
        for p in self._bps_params:
            self._delay[p] = passes

    # ------------------------------------------------------------------ Optimizer overrides
    def step(self, closure=None):
        """Synchronize the gradients (unless inside :meth:`skip_synchronize`), then run the
        wrapped optimizer's ``step(closure)``. A ``closure``'s backward pass runs after the
        reduction, so its gradients are not averaged (as upstream/Horovod).

        In asynchronous training (``BYTEPS_ENABLE_ASYNC=1``): the parameters' first step pulls
        the servers' initial value (rank 0's), then the wrapped optimizer steps with the local
        gradients, each parameter's delta is pushed (summed into the servers' parameters) and
        the servers' current value becomes the parameter; no other worker is waited for
        (unless ``BYTEPS_ASYNC_MAX_STALENESS`` holds this one back)."""
        if self._bps_async_params is not None:
            return self._bps_async_params.step(
                lambda: _unhooked(self._bps_base.step)(self, closure))
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(); the gradients are reduced a second time. Use "
                    "'with optimizer.skip_synchronize(): optimizer.step()'.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return _unhooked(self._bps_base.step)(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``torch.optim.Optimizer.zero_grad``.

        Raises:
            UsageError (a RuntimeError): gradients are still being reduced (called between
                ``backward()`` and ``step()``/``synchronize()``).
        """
        if self._handles:
            raise UsageError(_ZERO_GRAD_ERROR)
        return self._bps_base.zero_grad(self, set_to_none=set_to_none)

    def _bps_remove_hooks(self) -> None:
        """Detach the gradient hooks (the optimizer then only reduces in synchronize())."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         compression_params=None, op=None,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False, process_set=None):
    """Wrap a torch optimizer so gradients are averaged over all workers before each step.

    Returns an instance of a dynamic subclass of ``optimizer``'s class (so ``isinstance``
    checks, ``state_dict()``, LR schedulers on the same ``param_groups`` keep working) that
    shares ``optimizer``'s parameter groups and state.

    Args:
        optimizer: the torch optimizer to wrap (any ``torch.optim.Optimizer`` whose
            constructor accepts its ``param_groups`` as first argument).
        named_parameters: ``model.named_parameters()`` (a sequence of ``(name, tensor)``
            tuples, names unique). The names key the reductions (``"Gradient.<name>"``); they
            must be the same on every rank. If None, parameters are named ``noname.<i>`` by
            position across all groups (upstream numbered per group and could collide).
        compression: ``Compression.none`` (default) or ``Compression.fp16`` (gradients travel
            as float16 and are cast back into ``p.grad``).
        backward_passes_per_step: number of ``backward()`` calls whose gradients are
            accumulated locally before they are reduced; gradients are summed over the passes
            (not divided) and averaged over workers.
        compression_params: gradient compression by the core, upstream's MXNet dict (keys
            ``compressor``, ``ef``, ``momentum``, ``momentum_mu``, ``scaling``, ``k``,
            ``seed``, ``partition``, ``normalize``, ``fp16``; see
            :func:`byteps.sync.compression.compression_kwargs`), e.g. ``{"compressor": "onebit",
            "ef": "vanilla", "scaling": True}``. Default None: no compression. Every
            float16/32/64 gradient is declared with it; the core compresses those of at least
            ``BYTEPS_MIN_COMPRESS_BYTES`` bytes in a distributed job, and a step then applies
            ``C(sum_i C(g_i / size))`` (each worker compresses its share of the average, the
            server compresses the sum). Every rank must pass the same dict (else
            ``MismatchError`` on every rank at the first reduction). ``"fp16": True`` selects
            ``Compression.fp16`` as well. The learning rate of ``param_groups[0]`` is handed
            to the core before each step's first reduction (error feedback scales its residual
            by previous_lr / lr). ``"momentum": "nesterov"`` takes mu from ``momentum_mu`` or
            else the optimizer's ``momentum`` (one value for all groups), sets the optimizer's
            momentum to 0 (and ``nesterov`` off; a warning says so), and applies Nesterov
            momentum ``m = mu*m + g; g += mu*m`` to each gradient instead: in the core before
            compressing, or here after the reduction for the gradients the core does not
            compress (upstream MXNet's ``Compression.nag``). Weight decay stays in the
            optimizer (without momentum).
        op: Horovod's: ``Average`` (default) or ``Sum`` of the gradients over the ranks
            (``Adasum`` is refused, naming it).
        gradient_predivide_factor: Horovod's: with Average, each gradient is divided by it
            before the sum and the sum multiplied by ``factor / size()`` after (the same
            average, split to keep float16 sums in range); a number > 0, default 1.0; another
            value with Sum is an error, as in Horovod.
        num_groups, groups: Horovod's grouping: ``groups`` a number of groups or a list of
            lists of parameters (a parameter in none is a group of its own), ``num_groups``
            the older form of the number. The parameters are split into that many consecutive
            groups; a group's reductions start together, when the last of its gradients is
            ready (each is still its own scheduled push_pull). Default: no grouping.
        sparse_as_dense: Horovod's: a sparse gradient (``nn.Embedding(sparse=True)``) is made
            dense and reduced as the others. Default False: its indices and values are
            allgathered (``byteps.torch.allgather``) and ``p.grad`` becomes the sparse sum
            (divided by ``size()`` for Average), as Horovod does.
        process_set: Horovod's: a registered ``ProcessSet`` whose ranks alone construct and
            step this optimizer; the gradients are averaged over them (default: every rank).

    Every rank must construct it with the same parameters. Gradients are averaged (divided by
    :func:`byteps.torch.size`). With one worker no communication happens.

    With ``BYTEPS_ENABLE_ASYNC=1`` (asynchronous training, docs/async.md) gradients are not
    reduced: :meth:`step` steps locally and exchanges each parameter's delta for the servers'
    parameters under ``"AsyncParam.<name>"`` (``compression``/``compression_params`` must be
    left at their defaults); :func:`byteps.torch.pull_parameters` reads them.

    Raises:
        InvalidArgumentError (a ValueError): ``named_parameters`` is not a sequence of ``(str,
            tensor)`` tuples, has duplicate names or misses optimizer parameters;
            ``backward_passes_per_step < 1``; the optimizer is already distributed; an
            invalid ``compression_params`` (unknown key or value, missing ``k`` or mu, see
            :func:`byteps.sync.compression.compression_kwargs`) or ``"fp16": True`` with another
            ``compression`` than none/fp16.
        InvalidTypeError (a TypeError): ``optimizer`` is not a ``torch.optim.Optimizer``; a
            ``compression_params`` value of the wrong type.
        byteps.errors.NotInitializedError: before ``byteps.torch.init()``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidTypeError("optimizer must be a torch.optim.Optimizer, got "
                               f"{type(optimizer).__name__}")
    if getattr(optimizer, "_bps_distributed", False):
        raise InvalidArgumentError("optimizer is already a byteps DistributedOptimizer")
    namespace = {k: v for k, v in _DistributedOptimizer.__dict__.items()
                 if k not in ("__dict__", "__weakref__")}
    namespace["_bps_base"] = optimizer.__class__
    namespace["__qualname__"] = optimizer.__class__.__qualname__
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), namespace)
    horovod = HorovodOptions.make(op, gradient_predivide_factor, num_groups, groups,
                                  sparse_as_dense, process_set)
    dist = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               compression_params, horovod)
    # Keep any state the optimizer already has (e.g. momentum after a few local steps).
    for p, st in optimizer.state.items():
        dist.state[p] = st
    return dist
