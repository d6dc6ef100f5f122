"""``byteps.torch.pipeline``: PipeDream pipeline parallelism (Narayanan et al., SOSP 2019).

A model (an ``nn.Sequential`` or a list of modules) is cut into stages of consecutive layers,
one stage per worker process of a byteps job, each stage optionally replicated over several
workers (data parallelism inside the stage, gradients summed with push_pull). Stages exchange
activations forward and gradients backward over the job's p2p channel (:mod:`byteps.p2p`) with
PipeDream's one-forward-one-backward schedule and weight stashing. docs/pipeline.md.

Typical use, on every rank of ``bpslaunch --workers 4 ... python train.py``::

    import torch, byteps.torch as bps
    from byteps.torch import pipeline
    bps.init()
    torch.manual_seed(0)                              # the same model on every rank
    model = torch.nn.Sequential(...)
    plan = pipeline.plan_for(model, sample_input, bandwidth=1.25e9)   # profile + partition
    trainer = pipeline.PipelineTrainer(
        model, plan, torch.nn.functional.cross_entropy,
        lambda params: torch.optim.SGD(params, lr=0.05))
    for epoch in range(10):
        trainer.train_epoch(batches)                  # [(input, target), ...], same on every rank
    full = trainer.gather_model(model, dst=0)         # the trained model on rank 0

Modules: :mod:`.profiler` (per-layer times and sizes), :mod:`.partitioner` (the dynamic
programme, :class:`Plan`), :mod:`.schedule` (1F1B), :mod:`.versions` (stashing, vertical sync),
:mod:`.transport` (tensors over the channel), :mod:`.gradsync` (replicated stages),
:mod:`.runtime` (:class:`PipelineTrainer`).
"""

from __future__ import annotations

import itertools

from byteps import basics
from byteps.naming import broadcast_object

from .partitioner import Plan, Stage, data_parallel_time, make_plan, partition
from .profiler import LayerProfile, layers_of, profile
from .runtime import PipelineTrainer, check_plan
from .schedule import ops, usable_minibatches, warmup_counts

__all__ = ["LayerProfile", "PipelineTrainer", "Plan", "Stage", "check_plan",
           "data_parallel_time", "layers_of", "make_plan", "ops", "partition", "plan_for",
           "profile", "usable_minibatches", "warmup_counts"]

_plans = itertools.count()


def plan_for(model, sample, bandwidth: float, *, root_rank: int = 0, repeats: int = 5,
             **partition_kwargs) -> Plan:
    """Collective: ``root_rank`` profiles ``model`` on ``sample`` (:func:`.profiler.profile`)
    and partitions it over ``byteps.size()`` workers at ``bandwidth`` bytes/s
    (:func:`.partitioner.partition`, keyword arguments passed on); every rank returns that
    plan (one broadcast_object, so every rank runs the same plan)."""
    plan = None
    if basics.rank() == root_rank:
        prof = profile(model, sample, repeats=repeats)
        plan = partition(prof, basics.size(), bandwidth, **partition_kwargs).to_dict()
        plan["profile"] = [lp.to_dict() for lp in prof]
    plan = broadcast_object(plan, root_rank, name=f"pipeline.plan.{next(_plans)}")
    plan.pop("profile", None)
    return Plan.from_dict(plan)
