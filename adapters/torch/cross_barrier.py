"""``byteps.torch.cross_barrier``: training without a global barrier between iterations
(ByteScheduler's "crossing the barrier", SOSP'19; upstream ``byteps/torch/cross_barrier.py``).

Use it in place of :func:`byteps.torch.DistributedOptimizer`::

    import byteps.torch.cross_barrier as bps
    bps.init()
    optimizer = bps.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 num_steps=total_steps)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    for batch in data:
        optimizer.zero_grad()
        loss_fn(model(batch)).backward()
        optimizer.step()

How it works (only when :func:`byteps.torch.size` > 1):

* When a parameter's gradient has been accumulated ``backward_passes_per_step`` times, its
  gradient hook starts an asynchronous in-place push_pull (average) of it, with a priority by
  position in the optimizer (the first parameter, usually the input layer, first) and marks
  the parameter *busy*.
* One background thread waits (blocking in the core, not polling) for the reductions in
  flight, the most urgent one (highest priority) first. For each finished one it writes the
  averaged gradient into ``p.grad``, applies that parameter's update with the optimizer's own
  ``step`` over that single parameter (the wrapped optimizer's class, hyper-parameters of the
  parameter's group and the shared ``optimizer.state``), zeroes ``p.grad`` and marks the
  parameter ready.
* A forward pre-hook on every module of ``model`` that owns parameters waits until its own
  parameters are ready. So the next forward pass starts while later layers are still being
  reduced: communication overlaps the rest of the backward pass *and* the next forward pass.
* :meth:`step` starts the reductions whose hooks did not fire (unused parameters contribute
  zeros) and returns without waiting. After ``num_steps`` training steps it waits for the
  last updates, stops the thread and removes the hooks; the optimizer then works as a
  synchronous :func:`~byteps.torch.DistributedOptimizer`.

After every completed step the parameters equal those of synchronous data-parallel training
with the same optimizer (the update of each parameter is the optimizer's own arithmetic).
"""

from __future__ import annotations

import atexit
import inspect
import logging
import sys
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from byteps.errors import (
    BytePSError,
    InternalError,
    InvalidArgumentError,
    InvalidTypeError,
    UsageError,
)
from byteps.sync import async_train

from . import ops
from .broadcast import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
from .ops import (
    byteps_push_pull,
    declare,
    init,
    is_initialized,
    local_rank,
    local_size,
    poll,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_inplace,
    rank,
    shutdown,
    size,
    synchronize,
)
from .optimizer import DistributedOptimizer, _DistributedOptimizer, _unhooked

push_pull = sys.modules["byteps.torch"].push_pull  # the package is initialised before this

__all__ = [
    "CrossBarrier",
    "SUPPORTED_OPTIMIZERS",
    # re-exported so that ``import byteps.torch.cross_barrier as bps`` works as upstream
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "declare", "push_pull", "byteps_push_pull", "push_pull_async", "push_pull_async_inplace", "push_pull_inplace", "poll",
    "synchronize", "Compression", "DistributedOptimizer", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object",
]

_log = logging.getLogger("byteps.torch.cross_barrier")

#: Optimizer classes whose update is applied one parameter at a time (exact classes: a
#: subclass may couple parameters in its ``step``). Upstream: SGD, Adam and RMSprop.
SUPPORTED_OPTIMIZERS: Tuple[type, ...] = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW,
                                          torch.optim.RMSprop)

#: Seconds the idle background thread sleeps between checks that byteps is still running.
_IDLE_CHECK_S = 1.0

_live: weakref.WeakSet = weakref.WeakSet()
_exit_hook_registered = False


def _close_all_at_exit() -> None:
    for opt in list(_live):
        try:
            opt.close()
        except Exception as e:  # at exit: report, never raise
            _log.warning("CrossBarrier.close() at exit: %s", e)


def _register_exit_hook() -> None:
    """Close every live CrossBarrier at interpreter exit. Registered after ``init()`` (which
    registers byteps' shutdown), so it runs before the core shuts down (atexit runs last
    registered first)."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_close_all_at_exit)
        _exit_hook_registered = True


def _ctor_kwargs(cls: type, defaults: Dict[str, Any]) -> Dict[str, Any]:
    """The entries of ``defaults`` that ``cls``'s constructor accepts."""
    params = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in defaults.items() if k in params}


class _Pending:
    __slots__ = ("p", "handle", "ctx", "priority", "hyper")

    def __init__(self, p: torch.Tensor, handle: int, ctx: Any, priority: int,
                 hyper: Dict[str, Any]):
        self.p = p
        self.handle = handle
        self.ctx = ctx
        self.priority = priority
        self.hyper = hyper  # the group's hyper-parameters when the reduction started


class _CrossBarrier(_DistributedOptimizer):
    """Methods copied, over :class:`_DistributedOptimizer`'s, into the dynamic subclass built
    by :func:`CrossBarrier`. Never instantiated directly."""

    def __init__(self, params, model, named_parameters, compression, backward_passes_per_step,
                 compression_params, num_steps, defaults):
        if async_train.enabled():
            raise UsageError("CrossBarrier reduces gradients synchronously; in asynchronous "
                             "training (BYTEPS_ENABLE_ASYNC=1) use DistributedOptimizer, which "
                             "exchanges parameter deltas with the servers (docs/async.md)")
        self._xb_running = False  # the gradient hooks read it from here on
        _DistributedOptimizer.__init__(self, params, named_parameters, compression,
                                       backward_passes_per_step, compression_params)
        self._xb_num_steps = num_steps
        self._xb_steps = 0  # completed training steps
        self._xb_cv = threading.Condition()
        self._xb_busy: set = set()  # parameters reduced or updated right now
        self._xb_pending: List[_Pending] = []
        self._xb_started: set = set()  # parameters whose reduction started this step
        self._xb_error: Optional[BaseException] = None
        self._xb_stop = False
        self._xb_exited = False
        self._xb_thread: Optional[threading.Thread] = None
        self._xb_pre_hooks: List[Any] = []
        managed = [p for p in self._bps_params if p.requires_grad]
        self._xb_group = {p: g for g in self.param_groups for p in g["params"]}
        # One optimizer of the wrapped class per parameter: its step() is the update of that
        # parameter alone; state and hyper-parameters come from this optimizer at each update.
        kwargs = _ctor_kwargs(self._bps_base, defaults)
        self._xb_single = {p: self._bps_base([p], **kwargs) for p in managed}
        guarded = set()
        if self._size > 1:
            for module in model.modules():
                own = [p for p in module.parameters(recurse=False) if p in self._xb_single]
                if own:
                    guarded.update(own)
                    self._xb_pre_hooks.append(
                        module.register_forward_pre_hook(self._xb_make_pre_hook(own)))
        # Parameters no module of `model` owns: nothing waits for them before a forward pass,
        # so step() waits for their updates.
        self._xb_unguarded = [p for p in managed if p not in guarded]
        if self._size > 1:
            self._xb_running = True
            self._xb_thread = threading.Thread(target=self._xb_loop, daemon=True,
                                               name=f"byteps-cross-barrier-{ops.rank()}")
            self._xb_thread.start()
            _live.add(self)
            _register_exit_hook()

    # ------------------------------------------------------------------ training thread
    def _xb_raise_if_failed(self) -> None:
        e = self._xb_error
        if e is None:
            return
        text = f"CrossBarrier (rank {ops.rank()}): a background gradient reduction or " \
               f"update failed: {e}"
        if isinstance(e, BytePSError):
            try:
                err = type(e)(text)
            except Exception:  # pragma: no cover - an exception class with another signature
                err = InternalError(text)
        else:
            err = InternalError(text)
        raise err from e

    def _xb_make_pre_hook(self, own: List[torch.Tensor]):
        def pre_hook(module, args):
            if not self._xb_running:
                return None
            with self._xb_cv:
                while self._xb_error is None and any(p in self._xb_busy for p in own):
                    self._xb_cv.wait()
            self._xb_raise_if_failed()
            return None
        return pre_hook

    def _make_hook(self):
        base_hook = _DistributedOptimizer._make_hook(self)

        def hook(p: torch.Tensor) -> None:
            if not self._xb_running:
                return base_hook(p)
            self._xb_raise_if_failed()
            if p in self._xb_started:
                if p in self._xb_busy:
                    raise UsageError(
                        f"CrossBarrier: the gradient of {self._parameter_names[p]!r} was "
                        "computed again while its reduction was in flight: the parameter was "
                        "used in a forward pass without going through a module of `model` that "
                        "owns it (its forward pre-hook waits for the update)")
                raise UsageError(
                    "Gradients were computed more than backward_passes_per_step "
                    f"({self.backward_passes_per_step}) times before optimizer.step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally.")
            self._delay[p] -= 1
            if self._delay[p] <= 0:
                self._xb_start(p)
        return hook

    def _xb_start(self, p: torch.Tensor) -> None:
        """Start the reduction of ``p``'s gradient and hand it to the background thread."""
        with self._xb_cv:
            self._xb_busy.add(p)
        self._xb_started.add(p)
        try:
            handle, ctx = self._push_pull_grad_async(p)
        except BaseException:
            with self._xb_cv:
                self._xb_busy.discard(p)
                self._xb_cv.notify_all()
            raise
        # Hyper-parameters as they are now: an LR scheduler stepped after step() must not
        # change the update of a gradient of this step that is still being reduced.
        hyper = {k: v for k, v in self._xb_group[p].items() if k != "params"}
        with self._xb_cv:
            if not self._xb_exited:
                self._xb_pending.append(_Pending(p, handle, ctx, self._priorities[p], hyper))
                self._xb_cv.notify_all()
                return
            self._xb_busy.discard(p)
        # The background thread has ended (a failure, or byteps was shut down): release the
        # handle here and report.
        try:
            ops.synchronize(handle)
        except Exception:
            pass
        self._xb_raise_if_failed()
        raise UsageError("CrossBarrier: the background thread has ended (byteps was shut "
                         "down); create a new optimizer after init()")

    def _xb_wait_for(self, params) -> None:
        with self._xb_cv:
            while self._xb_error is None and any(p in self._xb_busy for p in params):
                self._xb_cv.wait()
        self._xb_raise_if_failed()

    def synchronize(self) -> None:
        """While crossing the barrier: wait until every reduction started so far has been
        applied to its parameter (no new reduction is started), e.g. before reading or
        saving the parameters outside a forward pass. Otherwise as
        :meth:`byteps.torch.DistributedOptimizer.synchronize`.

        Raises:
            the background thread's failure, as the same typed ``BytePSError`` class (any
            other exception as ``InternalError``).
        """
        if not self._xb_running:
            return _DistributedOptimizer.synchronize(self)
        self._xb_wait_for(list(self._xb_single))
        return None

    def step(self, closure=None):
        """Finish this step's part of the training loop, without waiting for the updates.

        Runs ``closure`` first if given (its backward pass belongs to this step), starts the
        reduction of every parameter whose gradient hook did not fire (it contributes a zero
        gradient, so no rank waits for it) and returns; the updates are applied in the
        background. Parameters that no module of ``model`` owns are waited for here. The
        ``num_steps``-th training step waits for all updates and ends the background thread
        (:meth:`close`).

        A ``step()`` before the first training step with no backward pass since the
        optimizer was built is the wrapped optimizer's plain local ``step`` (upstream's "step
        0", e.g. creating the optimizer state) and not a training step. With one worker
        (``size() == 1``) every call is the plain step.

        Returns:
            ``closure()``'s result, or None.

        Raises:
            the background thread's failure (typed ``BytePSError``); ``UsageError`` after
            the background thread ended because byteps was shut down.
        """
        if not self._xb_running:
            return _DistributedOptimizer.step(self, closure)
        self._xb_raise_if_failed()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hooked = bool(self._xb_started) or any(
            self._delay[p] != self.backward_passes_per_step for p in self._xb_single)
        if not hooked and self._xb_steps == 0:
            _unhooked(self._bps_base.step)(self)
            return loss
        for p in self._xb_single:
            if p not in self._xb_started:
                self._xb_start(p)
        self._xb_started = set()
        for p in self._bps_params:
            self._delay[p] = self.backward_passes_per_step
        self._bps_lr_sent = False
        self._xb_steps += 1
        if self._xb_unguarded:
            self._xb_wait_for(self._xb_unguarded)
        if self._xb_steps >= self._xb_num_steps:
            self.close()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op while crossing the barrier once training has started (the background
        thread zeroes each gradient after its update; as upstream); otherwise as
        ``torch.optim.Optimizer.zero_grad``."""
        if self._xb_running and (self._xb_steps > 0 or self._xb_started):
            return None
        return _DistributedOptimizer.zero_grad(self, set_to_none=set_to_none)

    def state_dict(self):
        """As ``torch.optim.Optimizer.state_dict``, after waiting for the updates in flight."""
        if self._xb_running:
            self._xb_wait_for(list(self._xb_single))
        return self._bps_base.state_dict(self)

    def close(self) -> None:
        """Wait for the updates in flight, end the background thread and remove the forward
        pre-hooks; from then on the optimizer is a synchronous
        :func:`~byteps.torch.DistributedOptimizer`. Called by the ``num_steps``-th
        :meth:`step` and at interpreter exit; idempotent.

        Raises:
            the background thread's failure, if there was one (typed ``BytePSError``).
        """
        thread = self._xb_thread
        if thread is not None:
            with self._xb_cv:
                self._xb_stop = True
                self._xb_cv.notify_all()
            if thread is not threading.current_thread():
                thread.join()
            self._xb_thread = None
        if self._xb_running:
            self._xb_running = False
            for h in self._xb_pre_hooks:
                h.remove()
            self._xb_pre_hooks = []
            for p in self._bps_params:
                self._delay[p] = self.backward_passes_per_step
            _live.discard(self)
        self._xb_raise_if_failed()

    # ---------------------------------------------------------------- background thread
    def _xb_loop(self) -> None:
        while True:
            with self._xb_cv:
                while not self._xb_pending and not self._xb_stop and self._xb_error is None:
                    if not self._xb_cv.wait(_IDLE_CHECK_S) and not ops.is_initialized():
                        self._xb_stop = True  # byteps was shut down: nothing can come
                if not self._xb_pending:  # stopped, failed (and drained) or shut down
                    self._xb_exited = True
                    self._xb_cv.notify_all()
                    return
                # The reduction the next forward pass needs soonest (earliest layer) first.
                item = max(self._xb_pending, key=lambda it: it.priority)
                self._xb_pending.remove(item)
                failed = self._xb_error is not None
            try:
                output = ops.synchronize(item.handle)  # blocks, GIL released
                if not failed:
                    self._xb_apply(item, output)
            except BaseException as e:  # surfaces in the training thread
                _log.debug("CrossBarrier: %s failed: %s", self._grad_names.get(item.p), e)
                with self._xb_cv:
                    if self._xb_error is None:
                        self._xb_error = e
            finally:
                with self._xb_cv:
                    self._xb_busy.discard(item.p)
                    if self._xb_error is not None:
                        # Nothing more will be applied: wake every waiter; drain the rest.
                        self._xb_busy.clear()
                    self._xb_cv.notify_all()

    def _xb_apply(self, item: _Pending, output: torch.Tensor) -> None:
        """Averaged gradient -> ``p.grad``, the parameter's update, ``p.grad`` zeroed."""
        p = item.p
        result = self._compression.decompress(output, item.ctx)
        with torch.no_grad():
            if result is not p.grad:
                p.grad.copy_(result)
            if p in self._bps_nag:  # Nesterov momentum the core did not apply
                m = self._bps_nag[p]
                if m is None:
                    m = self._bps_nag[p] = torch.zeros_like(p.grad)
                m.mul_(self._bps_mu).add_(p.grad)
                p.grad.add_(m, alpha=self._bps_mu)
        single = self._xb_single[p]
        single.param_groups[0].update(item.hyper)
        single.state = self.state  # shared (load_state_dict replaces the dict)
        _unhooked(type(single).step)(single)
        with torch.no_grad():
            p.grad.zero_()


def CrossBarrier(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 named_parameters=None, compression=Compression.none,
                 backward_passes_per_step: int = 1, num_steps: int = 10 ** 6,
                 compression_params=None):
    """Wrap ``optimizer`` for data-parallel training without a barrier between iterations.

    Like :func:`byteps.torch.DistributedOptimizer` (whose naming, compression and gradient
    hooks it uses), but each parameter is updated as soon as its averaged gradient arrives,
    and each module's forward pass waits only for its own parameters (see the module
    docstring). Returns an instance of a dynamic subclass of ``optimizer``'s class sharing its
    parameter groups and state.

    Args:
        model: the ``torch.nn.Module`` being trained; every module of it that owns parameters
            of ``optimizer`` gets a forward pre-hook.
        optimizer: a ``torch.optim.SGD`` (momentum, dampening, nesterov, weight_decay),
            ``Adam`` (weight_decay, amsgrad), ``AdamW`` or ``RMSprop`` (exactly these classes:
            :data:`SUPPORTED_OPTIMIZERS`); any hyper-parameters, several groups, LR schedulers.
        named_parameters: ``model.named_parameters()``, as for ``DistributedOptimizer``.
        compression: ``Compression.none`` (default) or ``Compression.fp16``.
        backward_passes_per_step: backward passes accumulated locally per step (default 1).
        num_steps: number of training steps; the ``num_steps``-th :meth:`step` waits for the
            last updates and ends the background thread. Default ``10**6`` (as upstream).
        compression_params: the core's gradient compression, as for ``DistributedOptimizer``.

    Raises:
        InvalidArgumentError (a ValueError): an optimizer class other than
            :data:`SUPPORTED_OPTIMIZERS` (upstream raised ``ValueError`` in its background
            thread); ``num_steps`` < 1; the ``DistributedOptimizer`` argument errors.
        InvalidTypeError (a TypeError): ``model`` is not a ``torch.nn.Module``, ``optimizer``
            not a ``torch.optim.Optimizer``.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    if not isinstance(model, torch.nn.Module):
        raise InvalidTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidTypeError("optimizer must be a torch.optim.Optimizer, got "
                               f"{type(optimizer).__name__}")
    if getattr(optimizer, "_bps_distributed", False):
        raise InvalidArgumentError("optimizer is already a byteps DistributedOptimizer or "
                                   "CrossBarrier; pass the plain torch optimizer")
    if type(optimizer) not in SUPPORTED_OPTIMIZERS:
        names = ", ".join(f"torch.optim.{c.__name__}" for c in SUPPORTED_OPTIMIZERS)
        raise InvalidArgumentError(
            f"CrossBarrier supports {names} (it applies the update one parameter at a time); "
            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}")
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise InvalidArgumentError(f"num_steps must be an int >= 1, got {num_steps!r}")
    namespace = {k: v for k, v in _DistributedOptimizer.__dict__.items()
                 if k not in ("__dict__", "__weakref__")}
    namespace.update({k: v for k, v in _CrossBarrier.__dict__.items()
                      if k not in ("__dict__", "__weakref__")})
    base = optimizer.__class__
    namespace["_bps_base"] = base
    namespace["__qualname__"] = base.__qualname__
    cls = type(base.__name__, (base,), namespace)
    wrapped = cls(optimizer.param_groups, model, named_parameters, compression,
                  backward_passes_per_step, compression_params, num_steps,
                  dict(optimizer.defaults))
    for p, st in optimizer.state.items():
        wrapped.state[p] = st
    return wrapped
