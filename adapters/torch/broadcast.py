"""Broadcast of parameters, optimizer state and Python objects (upstream
``byteps/torch/__init__.py``; Horovod semantics).

A broadcast is a push_pull sum in which every rank except the root contributes zeros, so the
sum is the root's value, bit for bit. Every rank must make the same broadcast calls in the same
order.
"""

from __future__ import annotations

import collections
import io
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle
import numpy as np
import torch

from byteps import collectives
from byteps.errors import InvalidArgumentError, InvalidTypeError

from . import ops

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object"]


def _check_root(root_rank: int) -> None:
    n = ops.size()
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or not 0 <= root_rank < n:
        raise InvalidArgumentError(f"root_rank must be an int in [0, {n}), got {root_rank!r}")


def _named_items(params) -> List[Tuple[str, Any]]:
    if isinstance(params, dict):
        return sorted(params.items(), key=lambda kv: str(kv[0]))
    if isinstance(params, torch.Tensor):
        raise InvalidArgumentError(
            "params must be a dict or a list of tensors / (name, tensor) tuples, "
            "not a single tensor")
    try:
        items = list(params)
    except TypeError:
        raise InvalidArgumentError(
            "params must be a dict, or a list of tensors or (name, tensor) tuples; "
            f"got {type(params).__name__}") from None
    out = []
    for i, item in enumerate(items):
        if isinstance(item, tuple) and len(item) == 2:
            out.append((str(item[0]), item[1]))
        else:
            # Upstream sent every unnamed tensor under one shared name (crashed on the second
            # size); a deterministic per-index name is the same on every rank.
            out.append((str(i), item))
    return out


def broadcast_parameters(params, root_rank: int, prefix: str = "Parameter.") -> None:
    """Overwrite, in place, every tensor in ``params`` with its value on ``root_rank``.

    Args:
        params: ``model.state_dict()``, any dict ``name -> tensor`` (processed in sorted key
            order), ``model.named_parameters()`` / a list of ``(name, tensor)`` tuples, or a list
            of tensors (named by their position). ``None`` values are skipped. Tensors may
            require grad (written without autograd) and be non-contiguous; dtypes as for
            push_pull (float16, bfloat16, float32, float64, int8, uint8, int32, int64).
        root_rank: the rank whose values everyone receives.
        prefix: name prefix of the reductions (``prefix + name``, plus a ``~k`` suffix when
            that name was broadcast before with another dtype or shape, e.g. a second model
            with the same parameter names); must differ from names in use concurrently.

    Non-root ranks zero their tensors and every rank runs an in-place sum (as upstream), all
    started asynchronously and then waited for. Blocks until done.

    Raises:
        InvalidArgumentError (a ValueError): bad ``params`` or ``root_rank``.
        InvalidTypeError (a TypeError): a value that is not a tensor, or has an unsupported dtype.
        byteps.errors.MismatchError: shapes or dtypes differ across ranks.
    """
    items = _named_items(params)
    _check_root(root_rank)
    for name, p in items:
        if p is not None and not isinstance(p, torch.Tensor):
            raise InvalidTypeError(f"broadcast_parameters: value of {name!r} is a "
                                   f"{type(p).__name__}, not a tensor")
        if p is not None:
            ops._check_tensor(p, "broadcast_parameters")
    is_root = ops.rank() == root_rank
    handles = []
    try:
        for name, p in items:
            if p is None:
                continue
            if not is_root:
                with torch.no_grad():
                    p.zero_()
            handles.append(ops.push_pull_async_inplace(
                p, average=False, name=ops._name_for(prefix + name, p.dtype, p.shape)))
    except BaseException:
        _drain(handles)
        raise
    errors = _drain(handles)
    if errors:
        raise errors[0]


def _drain(handles) -> list:
    """Synchronize every handle (so no buffer is left to the core); returns the errors."""
    errors = []
    for h in handles:
        try:
            ops.synchronize(h)
        except Exception as e:
            errors.append(e)
    return errors


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set=None) -> Any:
    """Send a picklable Python object from ``root_rank`` to every rank and return it.

    The root serialises ``obj`` with cloudpickle; the byte count goes out as an int64 tensor
    (name ``Size.<name>.sz``), then the bytes as a uint8 tensor (``Parameter.<name>.t``, with
    a ``~k`` suffix for each new byte count, since the core fixes a name's shape at first use).
    Every rank must call it with the same ``name``.

    Args:
        obj: any object cloudpickle can serialise (only the root's is used).
        root_rank: the sending rank (default 0).
        name: distinguishes concurrent/unrelated broadcasts; default ``type(obj).__name__``
            (as upstream; note non-root ranks may pass a different object, e.g. None, so give
            an explicit name when types can differ across ranks).
        process_set: a registered ``ProcessSet`` (Horovod's): only its ranks call it and
            ``root_rank`` is one of its (global) ranks; sent by two mesh broadcasts (the byte
            count, then the bytes; ``byteps.collectives.broadcast_start``). Default: every
            rank, by the push_pulls above.

    Returns:
        ``obj`` itself on the root; the unpickled copy elsewhere.

    Raises:
        InvalidArgumentError (a ValueError): bad ``root_rank``.
        byteps.errors.BytePSError subclasses: the underlying push_pull failed.
    """
    _check_root(root_rank)
    if name is None:
        name = type(obj).__name__
    is_root = ops.rank() == root_rank
    if process_set is not None and process_set.process_set_id != 0:
        payload = np.frombuffer(cloudpickle.dumps(obj) if is_root else b"", np.uint8)
        sz = collectives.broadcast_start(np.array([payload.size], np.int64), root_rank,
                                         f"Size.{name}", process_set=process_set).wait()
        buf = payload if is_root else np.zeros(int(sz[0]), np.uint8)
        data = collectives.broadcast_start(buf, root_rank, f"Object.{name}",
                                           process_set=process_set).wait()
        return obj if is_root else cloudpickle.loads(data.tobytes())
    if is_root:
        payload = cloudpickle.dumps(obj)
        sz = torch.tensor([len(payload)], dtype=torch.int64)
    else:
        payload = b""
        sz = torch.zeros(1, dtype=torch.int64)
    broadcast_parameters([("sz", sz)], root_rank, prefix=f"Size.{name}.")
    nbytes = int(sz.item())
    if is_root:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        buf = torch.zeros(nbytes, dtype=torch.uint8)
    broadcast_parameters([("t", buf)], root_rank, prefix=f"Parameter.{name}.")
    if is_root:
        return obj
    return cloudpickle.load(io.BytesIO(buf.numpy().tobytes()))


def _init_optimizer_state(optimizer) -> None:
    """Create the state of every parameter that has none, as upstream/Horovod: give it a zero
    gradient and run the wrapped optimizer's own ``step`` (never the distributed one, which
    would be a collective). Parameters that already have state get no gradient, so their state
    is untouched; parameter values and gradients are restored afterwards (upstream left the
    zero gradients and, with weight decay, a changed parameter)."""
    needs = [p for g in optimizer.param_groups for p in g["params"]
             if p.requires_grad and not optimizer.state.get(p)]
    if not needs:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved_grads = {p: p.grad for p in params}
    saved_data = {p: p.detach().clone() for p in needs}
    try:
        for p in params:
            p.grad = torch.zeros_like(p) if p in saved_data else None
        base = getattr(optimizer, "_bps_base", None)
        if getattr(optimizer, "_bps_distributed", False) and base is not None:
            from .optimizer import _unhooked
            _unhooked(base.step)(optimizer)
        else:
            optimizer.step()
    finally:
        with torch.no_grad():
            for p, data in saved_data.items():
                p.copy_(data)
        for p in params:
            p.grad = saved_grads[p]


def broadcast_optimizer_state(optimizer, root_rank: int, prefix: str = "Parameter.") -> None:
    """Make ``optimizer``'s state and hyper-parameters on every rank equal to ``root_rank``'s.

    Works for plain torch optimizers and :func:`DistributedOptimizer` wrappers, on CPU
    (upstream built ``.cuda()`` tensors here and failed without a GPU). Parameters without state
    first get it created (zero gradient + one step of the wrapped optimizer, as upstream; the
    parameters themselves are left unchanged). Then tensor state (e.g. ``momentum_buffer``,
    ``exp_avg``, ``exp_avg_sq``, tensor ``step``) is broadcast in place under
    ``prefix + "<state name>.<occurrence>"``, and non-tensor state plus every param-group
    option (lr, betas, weight_decay, ...) travel in one :func:`broadcast_object` and are written
    back. Call it on every rank, with the same parameters, after
    :func:`broadcast_parameters`.

    Raises:
        InvalidArgumentError (a ValueError): ``torch.optim.LBFGS`` (its state cannot be broadcast),
            bad ``root_rank``.
        byteps.errors.MismatchError: state shapes differ across ranks.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise InvalidArgumentError("cannot broadcast torch.optim.LBFGS state")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidTypeError("optimizer must be a torch.optim.Optimizer, got "
                               f"{type(optimizer).__name__}")
    _check_root(root_rank)
    _init_optimizer_state(optimizer)

    tensors: List[Tuple[str, torch.Tensor]] = []
    scalars: Dict[str, Any] = {}
    where: Dict[str, Tuple] = {}
    occurrences: Dict[str, int] = collections.defaultdict(int)
    for gi, group in enumerate(optimizer.param_groups):
        for option, value in sorted(group.items()):
            if option == "params":
                continue
            key = f"option.{option}.{gi}"
            scalars[key] = value
            where[key] = ("option", gi, option)
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            for sname in sorted(state, key=str):
                value = state[sname]
                occurrences[sname] += 1
                key = f"{sname}.{occurrences[sname]}"
                if isinstance(value, torch.Tensor):
                    tensors.append((key, value))
                else:
                    scalars["state." + key] = value
                    where["state." + key] = ("state", p, sname)

    broadcast_parameters(tensors, root_rank, prefix=prefix)
    scalars = broadcast_object(scalars, root_rank, name=prefix + "optimizer_state")
    for key, value in scalars.items():
        loc = where.get(key)
        if loc is None:
            continue
        if loc[0] == "option":
            optimizer.param_groups[loc[1]][loc[2]] = value
        else:
            optimizer.state[loc[1]][loc[2]] = value
