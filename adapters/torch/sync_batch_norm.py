"""``SyncBatchNorm``: batch normalization whose statistics cover the batch of every rank
(Horovod's ``horovod.torch.SyncBatchNorm``, torch's ``nn.SyncBatchNorm``), over the core's
push_pull.

In training, each forward sums three things over all ranks in one push_pull (float64, per
channel: the count of values, their sum, the sum of their squares, made from this rank's mean
and biased variance as ``torch.batch_norm_update_stats`` computes them), so every rank
normalises with the mean and biased variance of the concatenated batch (``torch.batch_norm``
with those as its statistics); the running statistics are updated
with that mean and the unbiased variance, as ``torch.nn.BatchNorm*d`` on the concatenated
batch would. Backward sums ``Σ dy`` and ``Σ dy·x̂`` per channel over the ranks (one more
push_pull; this rank's two from ``native_batch_norm_backward`` in one pass) for the input's
gradient; the weight's and bias's gradients stay this rank's own, as
torch and Horovod return them (the optimizer then averages them like every gradient). In eval
mode, or with one rank, it is ``torch.nn.functional.batch_norm``.

Every rank must call the module the same number of times in the same order: its push_pulls
have two names per module (``<name>.stats``, ``<name>.grad``), given in creation order.
"""

from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from byteps.errors import InvalidArgumentError

from .ops import push_pull_async_inplace, size, synchronize

_instances = itertools.count()


def _sum_over_ranks(t: torch.Tensor, name: str) -> torch.Tensor:
    """In place: ``t`` (float64, contiguous) summed over every rank."""
    return synchronize(push_pull_async_inplace(t, average=False, name=name))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Element-wise work in the input's precision (float32 for float16/bfloat16); the
    per-channel moments and their sums over the ranks in float64."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, name):
        c = x.size(1)
        work = x.detach() if x.dtype in (torch.float32, torch.float64) else x.detach().float()
        count = x.numel() // c
        stats = torch.zeros(1 + 2 * c, dtype=torch.float64)
        stats[0] = count
        if count:  # this rank's mean and biased variance (torch's fused per-channel kernel)
            mean, var = torch.batch_norm_update_stats(work, None, None, 0.0)
            mean64 = mean.double()
            stats[1:1 + c] = count * mean64
            stats[1 + c:] = count * (var.double() + mean64 * mean64)
        stats = _sum_over_ranks(stats, name + ".stats")
        n = stats[0].item()
        if n < 2:
            raise InvalidArgumentError(f"SyncBatchNorm: {int(n)} value(s) per channel over all "
                                       "ranks; batch normalization in training needs at least 2")
        mean = stats[1:1 + c] / n
        var = (stats[1 + c:] / n - mean * mean).clamp_min(0.0)  # biased, for normalising
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((var * n / (n - 1)).to(running_var.dtype),
                                                   alpha=momentum)
        invstd64 = torch.rsqrt(var + eps)
        # (x − mean)·σ⁻¹·w + bias with the job's mean and variance: torch's batch_norm with
        # them as its statistics (one fused pass over x)
        wd = work.dtype
        y = torch.batch_norm(work, None if weight is None else weight.detach().to(wd),
                             None if bias is None else bias.detach().to(wd), mean.to(wd),
                             var.to(wd), False, 0.0, eps, False)
        ctx.save_for_backward(work, mean, invstd64, weight)
        ctx.meta = (n, name, [1, c] + [1] * (x.dim() - 2), bias is not None)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        work, mean, invstd, weight = ctx.saved_tensors  # mean, invstd: float64 per channel
        n, name, shape, has_bias = ctx.meta
        dyw = dy.to(work.dtype)
        if work.numel():  # Σ dy and Σ dy·x̂ per channel in one fused pass (torch's kernel)
            _, dy_xhat, dy_sum = torch.ops.aten.native_batch_norm_backward(
                dyw, work, None, None, None, mean.to(work.dtype), invstd.to(work.dtype), True,
                0.0, [False, True, True])
            local_dy, local_dy_xhat = dy_sum.double(), dy_xhat.double()
        else:  # (the kernel divides by the count)
            local_dy = local_dy_xhat = torch.zeros(mean.numel(), dtype=torch.float64)
        sums = _sum_over_ranks(torch.cat([local_dy, local_dy_xhat]), name + ".grad")
        c = mean.numel()
        mean_dy, mean_dy_xhat = sums[:c] / n, sums[c:] / n
        # dx = s·(dy − mean_dy − x̂·mean_dy_xhat), s = w·σ⁻¹: dy·s + x·k + k0 per channel
        s_ = invstd if weight is None else invstd * weight.detach().double()
        k = -s_ * invstd * mean_dy_xhat
        k0 = -s_ * mean_dy - k * mean
        dx = torch.addcmul(k0.to(work.dtype).view(shape), work, k.to(work.dtype).view(shape))
        dx.addcmul_(dyw, s_.to(work.dtype).view(shape))
        grad_weight = local_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = local_dy.to(weight.dtype) if has_bias and weight is not None else None
        return dx.to(dy.dtype), grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of all ranks (Horovod's ``SyncBatchNorm``; torch's
    ``nn.SyncBatchNorm``): a drop-in for ``nn.BatchNorm1d/2d/3d``.

    Args:
        num_features: C, the channels of an input of shape (N, C, ...) (at least 2-d).
        eps: added to the variance (default 1e-5).
        momentum: of the running statistics (default 0.1; ``None``: a cumulative average).
        affine: learn a weight and a bias per channel (default True).
        track_running_stats: keep running mean and variance (default True).
        name: prefix of this module's push_pull names (default: ``byteps.syncbn.<k>``, k
            counting the modules made in this process, so every rank must create them in the
            same order).

    Raises (forward):
        byteps.errors.InvalidArgumentError: an input of fewer than 2 dimensions, or a training
            batch with fewer than 2 values per channel over all ranks.
        the push_pull's errors (a dead peer, ranks calling it differently, a timeout), on every
            rank.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 name: Optional[str] = None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._byteps_name = name or f"byteps.syncbn.{next(_instances)}"

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise InvalidArgumentError(f"SyncBatchNorm: expected an input of at least 2 "
                                       f"dimensions (N, C, ...), got {x.dim()}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        if not self.training or size() == 1:
            use_batch = self.training or not self.track_running_stats
            return torch.nn.functional.batch_norm(
                x, self.running_mean if not self.training or self.track_running_stats else None,
                self.running_var if not self.training or self.track_running_stats else None,
                self.weight, self.bias, use_batch, momentum, self.eps)
        return _SyncBatchNormFunction.apply(
            x, self.weight, self.bias,
            self.running_mean if self.track_running_stats else None,
            self.running_var if self.track_running_stats else None,
            self.eps, momentum, self._byteps_name)
