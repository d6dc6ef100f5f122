"""The pipeline runtime: one stage replica per worker process (byteps.torch.pipeline).

Every worker of a byteps job (``bpslaunch``) builds the same model and the same :class:`Plan`;
its rank picks its stage and replica (``Plan.stage_of_rank``). Activations go forward and their
gradients backward over the job's p2p channel (:mod:`byteps.p2p`); the replicas of a stage sum
their gradients with push_pull (:mod:`.gradsync`); each replica runs the 1F1B order of
:mod:`.schedule` with the weight versions of :mod:`.versions`.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call

from byteps import basics
from byteps.errors import BytePSError, InvalidArgumentError, UsageError
from byteps.p2p import Channel

from . import schedule as sched
from .gradsync import ReplicaSync, ZeroContributor, declare_all
from .partitioner import Plan
from .profiler import layers_of
from .transport import recv_tensor, send_tensor
from .versions import WeightVersions

_runs = itertools.count()


class PipelineTrainer:
    """This worker's stage of a pipeline-parallel model.

    Args:
        model: the whole model, an ``nn.Sequential`` or a list of modules, built alike on every
            rank (same seed, or broadcast its parameters first); the stage keeps its layers.
        plan: the :class:`Plan` (the same on every rank: :func:`.plan_for` makes one).
        loss_fn: ``loss_fn(output, target) -> scalar`` (mean over the minibatch), on the last
            stage.
        optimizer_fn: ``optimizer_fn(parameters) -> torch.optim.Optimizer`` for the stage's
            parameters (e.g. ``lambda p: torch.optim.SGD(p, lr=0.1)``).
        weight_stashing: the backward of a minibatch uses the weights its forward used
            (default True); False: the current weights (its forward is recomputed).
        vertical_sync: a minibatch uses, at every stage, the version matching the input stage's
            (default False; needs ``weight_stashing``).
        channel: a :class:`byteps.p2p.Channel` of this job (default: ``Channel.for_job()``,
            collective); closed by :meth:`close` only when made here.
        timeout: seconds any one receive may wait (default the channel's, ``BYTEPS_TIMEOUT``).

    Collective: every rank constructs its trainer in the same order relative to its other
    push_pulls (the gradient names of the replicated stages are declared here). Needs
    ``byteps.init()`` with ``byteps.size() == plan.workers``.
    """

    def __init__(self, model, plan: Plan, loss_fn: Callable, optimizer_fn: Callable, *,
                 weight_stashing: bool = True, vertical_sync: bool = False,
                 channel: Optional[Channel] = None, timeout: Optional[float] = None):
        if vertical_sync and not weight_stashing:
            raise InvalidArgumentError("pipeline: vertical_sync needs weight_stashing")
        if basics.size() != plan.workers:
            raise InvalidArgumentError(f"pipeline: the plan is for {plan.workers} workers, the "
                                       f"job has {basics.size()}")
        layers = layers_of(model)
        if plan.stages[-1].last != len(layers) - 1:
            raise InvalidArgumentError(f"pipeline: the plan covers {plan.stages[-1].last + 1} "
                                       f"layers, the model has {len(layers)}")
        self.plan = plan
        self.rank = basics.rank()
        self.stage, self.replica = plan.stage_of_rank(self.rank)
        self.replicas = [s.replicas for s in plan.stages]
        self.num_stages = len(plan.stages)
        self.is_first = self.stage == 0
        self.is_last = self.stage == self.num_stages - 1
        me = plan.stages[self.stage]
        self.module = nn.Sequential(*layers[me.first:me.last + 1])
        self.loss_fn = loss_fn
        self.stashing = weight_stashing
        self.vertical_sync = vertical_sync
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self.optimizer = optimizer_fn([p for _, p in named])
        self.versions = WeightVersions(named, weight_stashing, vertical_sync)
        self._named = named
        self.run = next(_runs)
        # every stage's parameters, in order, for the names every rank declares
        described = []
        for st in plan.stages:
            part = nn.Sequential(*layers[st.first:st.last + 1])
            described.append({"replicas": st.replicas,
                              "params": [(n, p.shape, p.dtype)
                                         for n, p in part.named_parameters() if p.requires_grad]})
        names = declare_all(self.run, described)
        self._sync = None
        if self.stage in names:
            self._sync = ReplicaSync(names[self.stage], [p for _, p in named], me.replicas)
        self._zero = {s: ZeroContributor(names[s], [sh for _, sh, _ in described[s]["params"]],
                                         [dt for _, _, dt in described[s]["params"]])
                      for s in names if s != self.stage}
        self._own_channel = channel is None
        self.channel = Channel.for_job(timeout=timeout) if channel is None else channel
        self.timeout = self.channel.timeout if timeout is None else float(timeout)
        self._epoch_base = 0  # global minibatch index of this epoch's first
        self._sends: List = []

    # ----------------------------------------------------------------------------- helpers --
    def _peer(self, stage: int, m: int) -> int:
        st = self.plan.stages[stage]
        return st.ranks[sched.replica_of(m, st.replicas)]

    def _tags(self, kind_head: int, kind_data: int, m: int):
        g = self._epoch_base + m
        return sched.tag(self.run, kind_head, g), sched.tag(self.run, kind_data, g)

    def _reap(self, block: bool = False) -> None:
        keep = []
        for op in self._sends:
            if block or op.done():
                op.wait(self.timeout)
            else:
                keep.append(op)
        self._sends = keep

    # --------------------------------------------------------------------------- one epoch --
    def train_epoch(self, batches: Sequence) -> Dict:
        """Trains on ``batches`` (a sequence of ``(input, target)`` minibatches, the same on
        every rank: only the first stage reads inputs and the last targets) with the 1F1B
        schedule. Runs the largest multiple of lcm(replicas) minibatches not above
        ``len(batches)``.

        Returns ``{"minibatches": n, "seconds": wall time, "losses": {m: loss},
        "backward_done": {m: seconds since the epoch's start}}`` (losses of this rank's
        minibatches on the last stage, else empty; when each of this rank's backwards ended).

        Raises:
            byteps.errors.PeerLostError: a rank of the job was lost (its process died, its
                link broke): on every rank, within a round trip.
            byteps.errors.BytePSTimeoutError: a message did not arrive within ``timeout``.
            byteps.errors.UsageError: fewer minibatches than lcm(replicas).
        On any error the channel is closed (peers learn at once) and the error raised.
        """
        n = sched.usable_minibatches(len(batches), self.replicas)
        if n == 0:
            raise UsageError(f"pipeline: an epoch needs at least lcm{tuple(self.replicas)} "
                             f"minibatches, got {len(batches)}")
        t0 = time.perf_counter()
        try:
            for s, z in self._zero.items():
                z.start(n // self.replicas[s])
            done: Dict[int, float] = {}
            losses = self._run_ops(sched.ops(self.stage, self.replica, self.replicas, n),
                                   batches, done, t0)
            self._reap(block=True)
            for z in self._zero.values():
                z.join(self.timeout)
        except BaseException:
            self.close(flush_timeout=0)
            raise
        self._epoch_base += n
        return {"minibatches": n, "seconds": time.perf_counter() - t0, "losses": losses,
                "backward_done": done}

    def _run_ops(self, ops, batches, done: Dict[int, float], t0: float) -> Dict[int, float]:
        stash: Dict[int, tuple] = {}
        losses: Dict[int, float] = {}
        updates = 0
        for kind, m in ops:
            if kind == "F":
                stash[m] = self._forward(m, batches, losses)
            else:
                self._backward(m, stash.pop(m), batches)
                updates += 1
                self._update(updates * self.replicas[self.stage])
                done[m] = time.perf_counter() - t0
            self._reap()
        return losses

    def _forward(self, m: int, batches, losses) -> tuple:
        if self.is_first:
            x = batches[m][0]
            limit = None
        else:
            head, data = self._tags(sched.ACT_META, sched.ACT, m)
            x, limit = recv_tensor(self.channel, self._peer(self.stage - 1, m), head, data,
                                   self.timeout)
        watermark, tensors = self.versions.for_forward(limit)
        tag_version = watermark if self.is_first else limit
        x_in = x.detach().requires_grad_(not self.is_first and x.is_floating_point())
        leaves = {n: t.detach().requires_grad_(True) for n, t in tensors.items()}
        with torch.enable_grad():
            y = functional_call(self.module, leaves, (x_in,))
            if self.is_last:
                y = self.loss_fn(y, batches[m][1])
                losses[m] = float(y.detach())
        if not self.is_last:
            head, data = self._tags(sched.ACT_META, sched.ACT, m)
            self._sends += send_tensor(self.channel, self._peer(self.stage + 1, m), head, data,
                                       y, tag_version)
        if not self.stashing:  # keep only what the recomputation needs
            return (watermark, x_in.detach(), None, None)
        return (watermark, x_in, leaves, y)

    def _backward(self, m: int, saved: tuple, batches) -> None:
        watermark, x_in, leaves, y = saved
        if not self.stashing:  # recompute with the current weights
            x_in = x_in.requires_grad_(not self.is_first and x_in.is_floating_point())
            leaves = {n: t.detach().requires_grad_(True)
                      for n, t in self.versions.current().items()}
            with torch.enable_grad():
                y = functional_call(self.module, leaves, (x_in,))
                if self.is_last:
                    y = self.loss_fn(y, batches[m][1])
        hooks = []
        if self._sync is not None:  # each gradient's sum starts as soon as it is computed
            hooks = [leaves[n].register_hook(self._sync.hook(i))
                     for i, (n, _) in enumerate(self._named)]
        if self.is_last:
            torch.autograd.backward(y)
        else:
            head, data = self._tags(sched.GRAD_META, sched.GRAD, m)
            g, _ = recv_tensor(self.channel, self._peer(self.stage + 1, m), head, data,
                               self.timeout)
            torch.autograd.backward(y, g)
        if not self.is_first:
            head, data = self._tags(sched.GRAD_META, sched.GRAD, m)
            gx = x_in.grad if x_in.grad is not None else torch.zeros_like(x_in)
            self._sends += send_tensor(self.channel, self._peer(self.stage - 1, m), head, data,
                                       gx)
        for h in hooks:
            h.remove()
        if self._sync is not None:
            grads = self._sync.finish()
        else:
            grads = [leaves[n].grad if leaves[n].grad is not None else torch.zeros_like(p)
                     for n, p in self._named]
        for (_, p), g in zip(self._named, grads):
            p.grad = g
        self.versions.release(watermark)

    def _update(self, watermark: int) -> None:
        self.versions.before_update()
        self.optimizer.step()
        for _, p in self._named:
            p.grad = None
        self.versions.after_update(watermark)

    # ----------------------------------------------------------------------------- results --
    def stage_state(self) -> Dict[str, torch.Tensor]:
        """This stage's parameters and buffers (``state_dict`` of its layers, numbered as in
        the stage's ``nn.Sequential``)."""
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def gather_model(self, model, dst: int = 0) -> Optional[nn.Module]:
        """Collective: the trained weights of every stage (from its replica 0) copied into
        ``model`` (the whole model, as built on every rank) on rank ``dst``; returns ``model``
        there, None elsewhere."""
        layers = layers_of(model)
        tag_base = sched.tag(self.run, 4, 0)
        if self.replica == 0 and self.rank != dst:
            for i, (_, t) in enumerate(sorted(self.module.state_dict().items())):
                self._sends.append(self.channel.isend(dst, tag_base + i,
                                                      t.detach().contiguous()))
            self._reap(block=True)
        if self.rank != dst:
            return None
        for st in self.plan.stages:
            part = nn.Sequential(*layers[st.first:st.last + 1])
            src = st.ranks[0]
            sd = part.state_dict()
            if src == self.rank:
                part.load_state_dict(self.module.state_dict())
                continue
            for i, k in enumerate(sorted(sd)):
                out = torch.empty_like(sd[k]).contiguous()
                self.channel.recv(src, tag_base + i, out=out, timeout=self.timeout)
                sd[k] = out
            part.load_state_dict(sd)
        return model

    def close(self, flush_timeout: float = 5.0) -> None:
        """Closes the channel if this trainer made it."""
        if self._own_channel:
            self.channel.close(flush_timeout)


def check_plan(plan: Plan, layers: int, workers: int) -> None:
    """Raises BytePSError unless ``plan`` covers ``layers`` layers and ``workers`` ranks."""
    expect_layer, expect_rank = 0, 0
    for st in plan.stages:
        if st.first != expect_layer or st.last < st.first or st.replicas < 1 or \
                st.ranks != list(range(expect_rank, expect_rank + st.replicas)):
            raise BytePSError(f"pipeline: a malformed plan stage {st}")
        expect_layer, expect_rank = st.last + 1, expect_rank + st.replicas
    if expect_layer != layers or expect_rank != workers:
        raise BytePSError(f"pipeline: the plan covers {expect_layer} layers and {expect_rank} "
                          f"ranks, not {layers} and {workers}")
