"""``DistributedDataParallel``: a module wrapper that averages gradients over all workers
during ``backward()`` (upstream ``byteps/torch/parallel/distributed.py``; the interface of
``torch.nn.parallel.DistributedDataParallel`` where it applies).

How it works:

* construction broadcasts the wrapped module's ``state_dict()`` from rank 0 and declares one
  reduction per parameter that requires grad (``"DDP<k>.Gradient.<name>"``, ``k`` counting
  the wrappers made in this process);
* a ``register_post_accumulate_grad_hook`` on each such parameter starts an asynchronous
  in-place push_pull (average) of its gradient as soon as autograd has accumulated it, with a
  priority by position (the module's first parameter, needed first by the next forward pass,
  runs first);
* the first hook of a backward pass queues a callback at the end of that pass
  (``Variable._execution_engine.queue_callback``, as torch DDP): it deals with the parameters
  that got no gradient, waits for every reduction and writes the averages into ``p.grad``, so
  they are final when ``loss.backward()`` returns;
* a forward pass with gradients enabled broadcasts the module's buffers from rank 0 first
  (``broadcast_buffers``).
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.autograd import Variable

import byteps.sync.compression as core_compression
from byteps.errors import InvalidArgumentError, InvalidTypeError, UsageError
from byteps.sync import async_train

from .. import _gradients, ops
from ..broadcast import broadcast_parameters
from ..compression import Compression

__all__ = ["DistributedDataParallel"]

_instances = itertools.count()
_NAME = "DistributedDataParallel"


def _graph_task_id() -> Optional[int]:
    """The id of the autograd graph task running this hook (None where torch lacks it)."""
    fn = getattr(torch._C, "_current_graph_task_id", None)
    return fn() if fn is not None else None


def _check_bool(value: Any, arg: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{_NAME}: {arg} must be a bool, got {type(value).__name__} "
                               f"{value!r}")
    return value


def _device_of(entry: Any, arg: str) -> torch.device:
    """A ``device_ids``/``output_device`` entry (int = CUDA index, str, torch.device)."""
    if isinstance(entry, torch.device):
        return entry
    if isinstance(entry, int) and not isinstance(entry, bool):
        return torch.device("cuda", entry)
    if isinstance(entry, str):
        try:
            return torch.device(entry)
        except RuntimeError:
            raise InvalidArgumentError(f"{_NAME}: {arg}: invalid device {entry!r}") from None
    raise InvalidTypeError(f"{_NAME}: {arg} entries must be an int, str or torch.device, got "
                           f"{type(entry).__name__} {entry!r}")


# torch DDP arguments this wrapper does not implement: (argument, accepted value, why).
_UNSUPPORTED = (
    ("process_group", None, "byteps reduces over all workers of the job; there are no "
     "process groups"),
    ("bucket_cap_mb", None, "byteps reduces each gradient on its own as it becomes ready "
     "(large tensors are split by BYTEPS_PARTITION_BYTES); there are no buckets"),
    ("gradient_as_bucket_view", False, "there are no buckets"),
    ("static_graph", False, "use find_unused_parameters=True for parameters unused in some "
     "iterations; reentrant activation checkpointing is not supported"),
    ("delay_all_reduce_named_params", None, "every gradient is reduced during backward"),
    ("param_to_hook_all_reduce", None, "every gradient is reduced during backward"),
    ("mixed_precision", None, "use compression=Compression.fp16 to reduce in float16"),
    ("device_mesh", None, "byteps reduces over all workers of the job"),
    ("skip_all_reduce_unused_params", False, "every rank reduces every parameter each step"),
)


class DistributedDataParallel(torch.nn.Module):
    """Data-parallel training of ``module`` over all byteps workers: every rank runs the
    forward and backward pass on its own batch, and the gradients in ``p.grad`` are averaged
    over all ranks when ``loss.backward()`` returns; then every rank applies the same
    optimizer step (a plain ``torch.optim`` optimizer; do not also wrap it in
    ``DistributedOptimizer``).

    Usage (one process per worker, started by ``bpslaunch``)::

        import byteps.torch as bps
        from byteps.torch.parallel import DistributedDataParallel as DDP
        bps.init()
        model = DDP(model)                       # parameters broadcast from rank 0
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()   # p.grad averaged over all ranks
            optimizer.step()

    Every rank must make the same calls: construct its wrappers in the same order, run the same
    number of backward passes (each one is a collective, unless inside :meth:`no_sync`), and
    forward passes with gradients enabled when ``broadcast_buffers`` (each is a collective).

    Args:
        module: the ``torch.nn.Module`` to train, with every parameter and buffer on one
            device: the CPU, or one CUDA device (moved there before wrapping, as with torch
            DDP; the gradients then go through the core's copy stages, docs/gpu.md). Dtypes
            float16, bfloat16, float32, float64 for gradients; buffers also int8, uint8,
            int32, int64. Parameters must not be added, removed or have their
            ``requires_grad`` changed after wrapping.
        device_ids: None or ``[]``, or one entry (int CUDA index, str or ``torch.device``) as
            upstream's single-GPU mode (``[bps.local_rank()]``). A CUDA module: the entry must
            be its device (``InvalidArgumentError`` otherwise). A CPU module: an entry naming
            another device is accepted with a ``UserWarning`` that it has no effect, so
            scripts written for GPUs run unchanged on CPU.
        broadcast_buffers: broadcast the module's buffers (e.g. BatchNorm running statistics)
            from rank 0 at the start of every forward pass that runs with gradients enabled
            and outside :meth:`no_sync`. Default True.
        compression: ``Compression.none`` (default) or ``Compression.fp16`` (gradients
            travel as float16 and are cast back into ``p.grad``).
        find_unused_parameters: default False: a parameter that requires grad but gets no
            gradient in a backward pass raises ``UsageError`` at the end of that pass. True:
            such a parameter contributes its current ``p.grad`` (zeros if None) to the
            average, so every rank reduces the same gradients each step; one extra small
            reduction per step counts the ranks that had a gradient, and a parameter that had
            none on every rank keeps ``p.grad`` None (as torch DDP).
        compression_params: gradient compression by the core, upstream's MXNet dict, as for
            :func:`byteps.torch.DistributedOptimizer` (see
            :func:`byteps.sync.compression.compression_kwargs`). Differences, since there is no
            optimizer: ``"momentum": "nesterov"`` needs ``"momentum_mu"`` (the optimizer's own
            momentum should then be 0; this wrapper applies Nesterov momentum to the gradients
            the core does not compress), and error feedback gets no learning rate (its
            previous_lr / lr correction is 1; call ``byteps.basics.set_learning_rate(lr)``
            before the backward pass when the learning rate changes).
        output_device: None, or a device, accepted with a warning when it is not the module's
            device (torch DDP uses it only to gather outputs of modules spanning several
            devices).
        dim: 0 only (torch DDP scattered inputs along it in its removed multi-device mode).
        init_sync: broadcast the ``state_dict()`` from rank 0 at construction. Default True.
        check_reduction: accepted (deprecated in torch); the reduction is always checked.
        process_group, bucket_cap_mb, gradient_as_bucket_view, static_graph,
        delay_all_reduce_named_params, param_to_hook_all_reduce, mixed_precision, device_mesh,
        skip_all_reduce_unused_params: torch DDP options this wrapper does not implement;
            only their defaults are accepted.

    Attributes:
        module: the wrapped module (``state_dict()`` keys are ``"module.<name>"``, as torch
            DDP and upstream).
        device: the ``torch.device`` its parameters and buffers are on (the CPU for a module
            without any).

    Raises:
        InvalidTypeError (a TypeError): ``module`` is not a ``torch.nn.Module``; it is on a
            device other than the CPU or CUDA; a flag that is not a bool; a bad device entry;
            a ``compression`` without compress()/decompress().
        InvalidArgumentError (a ValueError): parameters or buffers on several devices; several
            ``device_ids``, or one that is not a CUDA module's device; ``dim != 0``; a torch
            DDP option other than its default among those not implemented; invalid
            ``compression_params``.
        byteps.errors.NotInitializedError: before ``byteps.torch.init()``.
        byteps.errors.MismatchError, PeerLostError, BytePSTimeoutError: from the broadcast.

    Differences from upstream: unused parameters are detected (upstream waited forever or
    needed an explicit :meth:`synchronize`); the end of the backward pass is found per
    wrapper by the autograd engine's callback, not by a process-wide gradient counter (which
    broke with several models). Differences from torch DDP: see ``docs/torch.md``.
    """

    def __init__(self, module: torch.nn.Module, device_ids=None, broadcast_buffers: bool = True,
                 compression=Compression.none, find_unused_parameters: bool = False, *,
                 compression_params=None, output_device=None, dim: int = 0,
                 init_sync: bool = True, check_reduction: bool = False, process_group=None,
                 bucket_cap_mb=None, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, delay_all_reduce_named_params=None,
                 param_to_hook_all_reduce=None, mixed_precision=None, device_mesh=None,
                 skip_all_reduce_unused_params: bool = False):
        super().__init__()
        if async_train.enabled():
            raise UsageError(f"{_NAME} averages gradients synchronously; in asynchronous "
                             "training (BYTEPS_ENABLE_ASYNC=1) use DistributedOptimizer, which "
                             "exchanges parameter deltas with the servers (docs/async.md)")
        if not isinstance(module, torch.nn.Module):
            raise InvalidTypeError(f"{_NAME}: module must be a torch.nn.Module, got "
                                   f"{type(module).__name__}")
        given = dict(process_group=process_group, bucket_cap_mb=bucket_cap_mb,
                     gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
                     delay_all_reduce_named_params=delay_all_reduce_named_params,
                     param_to_hook_all_reduce=param_to_hook_all_reduce,
                     mixed_precision=mixed_precision, device_mesh=device_mesh,
                     skip_all_reduce_unused_params=skip_all_reduce_unused_params)
        for arg, default, why in _UNSUPPORTED:
            if given[arg] is not default and given[arg] != default:
                raise InvalidArgumentError(
                    f"{_NAME}: {arg}={given[arg]!r} is not supported by byteps ({why}); "
                    f"leave it at its default {default!r}")
        self.broadcast_buffers = _check_bool(broadcast_buffers, "broadcast_buffers")
        self.find_unused_parameters = _check_bool(find_unused_parameters,
                                                  "find_unused_parameters")
        init_sync = _check_bool(init_sync, "init_sync")
        _check_bool(check_reduction, "check_reduction")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise InvalidTypeError(f"{_NAME}: dim must be an int, got {type(dim).__name__}")
        if dim != 0:
            raise InvalidArgumentError(
                f"{_NAME}: dim={dim} is not supported: each process runs the module on its "
                "whole input (inputs are not scattered); leave dim at 0")
        self.dim = dim
        devices = {t.device for t in itertools.chain(module.parameters(), module.buffers())}
        if len(devices) > 1:
            raise InvalidArgumentError(
                f"{_NAME}: the module's parameters and buffers are on several devices "
                f"({sorted(str(d) for d in devices)}); byteps runs one device per process: move "
                "the module to one (module.to(device))")
        self.device = devices.pop() if devices else torch.device("cpu")
        if self.device.type not in ("cpu", "cuda"):
            raise InvalidTypeError(
                f"{_NAME}: the module is on {self.device}; byteps.torch reduces CPU and CUDA "
                "tensors")
        self.device_ids = self._check_devices(device_ids, output_device, self.device)
        self.output_device = output_device
        self.module = module

        self._compression = _gradients.resolve_compression(compression, compression_params)
        self._bps_kwargs = core_compression.compression_kwargs(compression_params, None)
        self._size = ops.size()  # raises NotInitializedError before init()
        self._rank = ops.rank()
        self._prefix = f"DDP{next(_instances)}."

        named = list(module.named_parameters())
        names = _gradients.name_parameters(named, [{"params": [p for _, p in named]}])
        self._parameter_names: Dict[torch.Tensor, str] = names
        # The parameters reduced (those that require grad), in module order.
        self._params: List[torch.Tensor] = [p for _, p in named if p.requires_grad]
        # Earlier parameters (nearer the input) are needed first by the next forward pass:
        # higher priority (larger runs first; explicit, never 0 = the core's default).
        self._priorities = {p: -(i + 1) for i, p in enumerate(self._params)}
        self._grad_names, wire = _gradients.declare_gradients(
            self._params, names, self._prefix + "Gradient.", self._compression,
            self._bps_kwargs)
        mu = core_compression.nesterov_mu(self._bps_kwargs)
        self._nag_mu = mu
        # Nesterov momentum buffers of the gradients the core does not compress.
        self._nag: Dict[torch.Tensor, Optional[torch.Tensor]] = {}
        if mu is not None:
            self._nag = {p: None for p in _gradients.uncompressed_by_core(self._grad_names,
                                                                           wire)}
        self._used_name = None
        if self.find_unused_parameters and self._params:
            self._used_name = ops._name_for(self._prefix + "used", torch.int32,
                                            (len(self._params),))
            ops.declare(self._used_name)

        # Per backward pass: parameter -> (handle, ctx, tensor reduced); whether the end-of-pass
        # callback is queued, and for which graph task.
        self._handles: Dict[torch.Tensor, Tuple[int, Any, torch.Tensor]] = {}
        self._callback_queued = False
        self._pending_task: Optional[int] = None
        self._require_backward_grad_sync = True  # False inside no_sync()
        self._sync_next_backward = True  # captured by each forward pass

        if init_sync and module.state_dict():
            broadcast_parameters(module.state_dict(), root_rank=0,
                                 prefix=self._prefix + "Parameter.")
        self_ref = weakref.ref(self)  # the module's hooks must not keep this wrapper alive
        self._hook_handles = [p.register_post_accumulate_grad_hook(_make_hook(self_ref, p))
                              for p in self._params]

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _check_devices(device_ids, output_device, module_device: torch.device) -> List[Any]:
        if device_ids is None:
            device_ids = []
        if isinstance(device_ids, (str, torch.device)) or not isinstance(device_ids,
                                                                         (list, tuple)):
            raise InvalidTypeError(f"{_NAME}: device_ids must be None or a list with one entry, "
                                   f"got {type(device_ids).__name__} {device_ids!r}")
        if len(device_ids) > 1:
            raise InvalidArgumentError(
                f"{_NAME}: device_ids must contain at most one entry (one device per process, "
                f"as upstream), got {list(device_ids)}")
        entries = [("device_ids", d) for d in device_ids]
        if output_device is not None:
            entries.append(("output_device", output_device))
        for arg, entry in entries:
            dev = _device_of(entry, arg)
            if module_device.type == "cuda":
                if dev.type == "cuda" and dev.index is None:  # "cuda": the current device
                    dev = torch.device("cuda", torch.cuda.current_device())
                if dev != module_device and arg == "device_ids":
                    raise InvalidArgumentError(
                        f"{_NAME}: device_ids={list(device_ids)!r} names {dev}, but the module "
                        f"is on {module_device}: pass [{module_device.index}] (one device per "
                        "process, bps.local_rank())")
                if dev != module_device:
                    warnings.warn(f"{_NAME}: {arg}={entry!r} ({dev}) is not the module's "
                                  f"device ({module_device}); outputs stay where the module "
                                  "puts them", UserWarning, stacklevel=3)
            elif dev.type != "cpu":
                warnings.warn(
                    f"{_NAME}: {arg}={entry!r} ({dev}) has no effect: the module is on the CPU "
                    "(move it to the device first, as with torch DDP, to train there)",
                    UserWarning, stacklevel=3)
        return list(device_ids)

    # --------------------------------------------------------------------------- public API
    def forward(self, *inputs, **kwargs):
        """Broadcast the buffers from rank 0 (when ``broadcast_buffers``, gradients are
        enabled and not inside :meth:`no_sync`), then return ``module(*inputs, **kwargs)``.

        Raises:
            the errors of :func:`byteps.torch.broadcast_parameters` (e.g. ``InvalidTypeError``
            for a bool buffer, ``MismatchError`` when the buffers' element counts differ
            across ranks).
        """
        if self._callback_queued:
            self._abandon()  # the previous backward pass was aborted by an error
        if torch.is_grad_enabled():
            self._sync_next_backward = self._require_backward_grad_sync
            if self.broadcast_buffers and self._require_backward_grad_sync:
                buffers = [b for _, b in self.module.named_buffers() if b is not None]
                if buffers and self._size > 1:
                    self._broadcast_buffers(buffers)
        return self.module(*inputs, **kwargs)

    def _broadcast_buffers(self, buffers: List[torch.Tensor]) -> None:
        """Rank 0's buffers to every rank, coalesced as torch DDP does: the buffers of one
        dtype are flattened into one tensor, broadcast in one push_pull, and copied back (a
        model with BatchNorm has three buffers per layer; one operation per dtype instead of
        one per buffer). Buffers whose element counts differ across ranks make the flattened
        lengths differ: ``MismatchError`` from the core."""
        groups: Dict[torch.dtype, List[torch.Tensor]] = {}
        for b in buffers:
            groups.setdefault(b.dtype, []).append(b)
        flats = [(str(dtype).replace("torch.", ""), torch.cat([b.detach().reshape(-1)
                                                               for b in group]), group)
                 for dtype, group in groups.items()]
        broadcast_parameters([(name, flat) for name, flat, _ in flats], root_rank=0,
                             prefix=self._prefix + "Buffers.")
        with torch.no_grad():
            for _, flat, group in flats:
                offset = 0
                for b in group:
                    b.copy_(flat[offset:offset + b.numel()].view_as(b))
                    offset += b.numel()

    @contextmanager
    def no_sync(self):
        """Context manager: backward passes of forward passes run inside it do not reduce;
        gradients accumulate locally in ``p.grad``, and the first backward pass of a forward
        pass outside it reduces the accumulated gradients (torch DDP semantics)::

            with ddp.no_sync():
                ddp(x1).sum().backward()    # local only
            ddp(x2).sum().backward()        # p.grad = average over ranks of (g1 + g2)
        """
        old = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = old

    def synchronize(self) -> None:
        """Finish the current gradient reduction now (upstream's method): reduce the
        parameters without a gradient (or raise for them, see ``find_unused_parameters``),
        wait, and write the averages into ``p.grad``.

        The end of each backward pass does this already, so calling it after
        ``loss.backward()`` does nothing; it is kept for upstream scripts, which needed it
        when some layers were skipped in the forward pass.

        Raises:
            UsageError: parameters without a gradient and ``find_unused_parameters=False``.
            the first error of any reduction (after waiting for all of them).
        """
        if self._callback_queued:
            self._finish_backward()

    # ------------------------------------------------------------------ reduction machinery
    def _grad_ready(self, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook of parameter ``p``: start its reduction."""
        if not self._sync_next_backward:
            return
        task = _graph_task_id()
        if self._callback_queued and task is not None and task != self._pending_task:
            # A nested backward pass inside the pending one (reentrant activation
            # checkpointing), or a backward pass retried without a new forward pass after
            # an error: its end would be taken for the end of the outer pass.
            raise UsageError(
                f"{_NAME} (rank {self._rank}): a backward pass started while another one of "
                "this wrapper is unfinished. Reentrant activation checkpointing is not "
                "supported (use torch.utils.checkpoint with use_reentrant=False); after an "
                "error in backward(), run a new forward pass before the next backward()")
        if not self._callback_queued:
            Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
            self._pending_task = task
        if p in self._handles:
            raise UsageError(
                f"{_NAME} (rank {self._rank}): the gradient of {self._parameter_names[p]!r} was "
                "accumulated twice in one backward pass")
        try:
            self._handles[p] = self._start(p, p.grad)
        except BaseException:
            self._abandon()
            raise

    def _start(self, p: torch.Tensor, grad: torch.Tensor) -> Tuple[int, Any, torch.Tensor]:
        compressed, ctx = self._compression.compress(grad)
        handle = ops.push_pull_async_inplace(compressed, average=True,
                                             name=self._grad_names[p],
                                             priority=self._priorities[p])
        return handle, ctx, grad

    def _end_of_backward(self) -> None:
        """Autograd engine callback at the end of a backward pass."""
        if self._callback_queued:
            self._finish_backward()

    def _finish_backward(self) -> None:
        self._callback_queued = False
        self._pending_task = None
        missing = [p for p in self._params if p not in self._handles]
        missing_set = set(missing)  # tensors hash by identity
        used_handle = None
        used_count = None
        first_error: Optional[BaseException] = None
        try:
            if self._used_name is not None:  # every step: the same names on every rank
                used_count = torch.tensor(
                    [0 if (p in missing_set and p.grad is None) else 1 for p in self._params],
                    dtype=torch.int32)
            # Every rank reduces the same names each step: a parameter without a gradient
            # contributes its p.grad, or zeros (also when that is an error here, so the ranks
            # that did compute it are not left waiting).
            for p in missing:
                grad = p.grad if p.grad is not None else torch.zeros_like(p).detach()
                self._handles[p] = self._start(p, grad)
            if used_count is not None:
                used_handle = ops.push_pull_async_inplace(used_count, average=False,
                                                          name=self._used_name)
        except BaseException as e:  # keep draining, so no buffer is left to the core
            first_error = e
        errors = self._drain(used_handle)
        first_error = first_error or (errors[0] if errors else None)
        if first_error is not None:
            raise first_error
        if missing and not self.find_unused_parameters:
            names = sorted(self._parameter_names[p] for p in missing)
            raise UsageError(
                f"{_NAME} (rank {self._rank}): parameter(s) {names} received no gradient in "
                "this backward pass (not used to compute the loss). Pass "
                f"find_unused_parameters=True to {_NAME} to reduce them as zeros, or set "
                "requires_grad=False on parameters that are never trained")
        if self._nag:
            self._apply_nag()

    def _drain(self, used_handle: Optional[int]) -> List[BaseException]:
        """Wait for every reduction in flight and write the results into ``p.grad`` (a
        parameter whose gradient was None gets it only if some rank had one); returns the
        errors."""
        errors: List[BaseException] = []
        used = None
        if used_handle is not None:
            try:
                used = ops.synchronize(used_handle)
            except Exception as e:
                errors.append(e)
        index = {p: i for i, p in enumerate(self._params)}
        handles, self._handles = self._handles, {}
        for p, (handle, ctx, _grad) in handles.items():
            try:
                output = ops.synchronize(handle)
            except Exception as e:
                errors.append(e)
                continue
            result = self._compression.decompress(output, ctx)
            with torch.no_grad():
                if p.grad is None:
                    if used is not None and int(used[index[p]]) > 0:
                        p.grad = result
                elif result is not p.grad:
                    p.grad.copy_(result)
        return errors

    def _abandon(self) -> None:
        """Forget a backward pass that was aborted by an error: wait for its reductions (so the
        core releases their buffers); their results and errors are dropped (the error that
        aborted the pass was raised already)."""
        self._callback_queued = False
        self._pending_task = None
        handles, self._handles = self._handles, {}
        for handle, _, _ in handles.values():
            try:
                ops.synchronize(handle)
            except Exception:
                pass

    def _apply_nag(self) -> None:
        """Nesterov momentum of the gradients the core does not compress:
        ``m = mu*m + g; g += mu*m`` (as :class:`byteps.torch.DistributedOptimizer`)."""
        mu = self._nag_mu
        with torch.no_grad():
            for p, m in self._nag.items():
                if p.grad is None:
                    continue
                if m is None:
                    m = self._nag[p] = torch.zeros_like(p.grad)
                m.mul_(mu).add_(p.grad)
                p.grad.add_(m, alpha=mu)

    def extra_repr(self) -> str:
        return (f"broadcast_buffers={self.broadcast_buffers}, "
                f"find_unused_parameters={self.find_unused_parameters}, "
                f"compression={getattr(self._compression, '__name__', self._compression)}")


def _make_hook(self_ref, p: torch.Tensor):
    def hook(_param: torch.Tensor) -> None:
        ddp = self_ref()
        if ddp is not None:
            ddp._grad_ready(p)
    return hook
