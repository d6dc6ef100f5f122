"""A single-process reference of PipeDream's semantics, for the pipeline tests.

:func:`simulate` runs every replica of every stage of a plan in one process, in the 1F1B order
of ``byteps.torch.pipeline.schedule.ops`` (the order under test is the runtime's; what this
module re-implements independently is what each operation computes): a forward of minibatch
``m`` waits for the previous stage's forward of ``m``; a backward waits for the next stage's
backward of ``m``; the replicas of a stage average their k-th backward's gradients and update
together (a replica's next operation waits for the round). The weights an operation sees follow
from that order alone:

* stashing: a backward differentiates its own forward's graph, built with the version the
  forward used;
* no stashing: a backward recomputes its forward with the stage's latest version;
* vertical sync: minibatch ``m`` carries the watermark (minibatches included) of the input
  stage's version it entered with; a later stage runs it with its latest version whose watermark
  is not above it.

Updates are plain SGD, ``w -= lr * mean gradient``, written out here (no torch.optim), and
every version is kept. :func:`check_schedule` runs the same order with no tensors: whether the
schedule of a plan finishes (no deadlock) with sends never blocking, as the channel's.
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn
from torch.func import functional_call

from byteps.torch.pipeline import schedule as sched


def _replicas_ops(replicas: Sequence[int], n: int):
    return {(s, j): sched.ops(s, j, replicas, n)
            for s in range(len(replicas)) for j in range(replicas[s])}


def check_schedule(replicas: Sequence[int], n: int) -> int:
    """Runs the schedule's dependencies; returns the number of steps, raises RuntimeError on a
    deadlock. Also checks each replica's order is 1F1B: forwards of its own minibatches in
    order, at most w_s + 1 in flight, each backward after its forward."""
    ops = _replicas_ops(replicas, n)
    S = len(replicas)
    pos = {k: 0 for k in ops}
    fwd, bwd = set(), set()
    rounds_done = [0] * S          # completed update rounds per stage
    backs = {k: 0 for k in ops}    # backwards done per replica
    w = sched.warmup_counts(replicas)
    steps = 0
    while any(pos[k] < len(ops[k]) for k in ops):
        progressed = False
        for (s, j), seq in ops.items():
            if pos[(s, j)] >= len(seq):
                continue
            if backs[(s, j)] > rounds_done[s]:
                continue  # waiting for the other replicas' round
            kind, m = seq[pos[(s, j)]]
            if kind == "F":
                if s > 0 and (s - 1, m) not in fwd:
                    continue
                in_flight = sum(1 for (ss, mm) in fwd if ss == s and mm % replicas[s] == j
                                and (ss, mm) not in bwd)
                if in_flight > w[s]:
                    raise RuntimeError(f"stage {s} replica {j}: {in_flight + 1} in flight")
                fwd.add((s, m))
            else:
                if (s, m) not in fwd:
                    raise RuntimeError(f"backward of {m} before its forward")
                if s < S - 1 and (s + 1, m) not in bwd:
                    continue
                bwd.add((s, m))
                backs[(s, j)] += 1
                if all(backs[(s, jj)] > rounds_done[s] for jj in range(replicas[s])):
                    rounds_done[s] += 1
            pos[(s, j)] += 1
            progressed = True
            steps += 1
        if not progressed:
            raise RuntimeError(f"deadlock: replicas {list(replicas)}, {n} minibatches, at "
                               f"{ {k: ops[k][pos[k]] for k in ops if pos[k] < len(ops[k])} }")
    return steps


def simulate(layers: Sequence[nn.Module], stage_layers: Sequence[Tuple[int, int]],
             replicas: Sequence[int], batches: Sequence, loss_fn: Callable, lr: float,
             stashing: bool = True, vertical_sync: bool = False):
    """PipeDream's semantics of a plan over ``batches`` (all of them: their count must be a
    multiple of lcm(replicas)). ``layers`` are copied, not changed. Returns (final weights per
    stage as ``{name: tensor}`` of the stage's ``nn.Sequential``, loss per minibatch)."""
    S = len(replicas)
    n = len(batches)
    mods = [nn.Sequential(*copy.deepcopy(list(layers[a:b + 1]))) for a, b in stage_layers]
    versions: List[List[Tuple[int, Dict[str, torch.Tensor]]]] = [
        [(0, {k: p.detach().clone() for k, p in m.named_parameters()})] for m in mods]
    ops = _replicas_ops(replicas, n)
    pos = {k: 0 for k in ops}
    out: Dict[Tuple[int, int], tuple] = {}   # (s, m) -> (x_in, leaves, y, tag) after forward
    grad_in: Dict[Tuple[int, int], torch.Tensor] = {}  # (s, m) -> gradient of s's input
    backs = {k: 0 for k in ops}
    pending: List[Dict[int, List[Dict[str, torch.Tensor]]]] = [{} for _ in range(S)]
    rounds_done = [0] * S
    losses: Dict[int, float] = {}

    def forward(s, m, x, ws):
        x_in = x.detach().requires_grad_(s > 0 and x.is_floating_point())
        leaves = {k: t.clone().requires_grad_(True) for k, t in ws.items()}
        y = functional_call(mods[s], leaves, (x_in,))
        if s == S - 1:
            y = loss_fn(y, batches[m][1])
        return x_in, leaves, y

    while any(pos[k] < len(ops[k]) for k in ops):
        progressed = False
        for (s, j), seq in ops.items():
            if pos[(s, j)] >= len(seq) or backs[(s, j)] > rounds_done[s]:
                continue
            kind, m = seq[pos[(s, j)]]
            if kind == "F":
                if s == 0:
                    x, limit = batches[m][0], None
                elif (s - 1, m) in out:
                    x, limit = out[(s - 1, m)][2].detach(), out[(s - 1, m)][3]
                else:
                    continue
                vs = versions[s]
                if vertical_sync and limit is not None:
                    wm, ws = [v for v in vs if v[0] <= limit][-1]
                else:
                    wm, ws = vs[-1]
                x_in, leaves, y = forward(s, m, x, ws)
                if s == S - 1:
                    losses[m] = float(y.detach())
                out[(s, m)] = (x_in, leaves, y, wm if s == 0 else limit)
            else:
                if s < S - 1 and (s + 1, m) not in grad_in:
                    continue
                x_in, leaves, y, _ = out[(s, m)]
                if not stashing:
                    x_in, leaves, y = forward(s, m, x_in, versions[s][-1][1])
                if s == S - 1:
                    y.backward()
                else:
                    y.backward(grad_in[(s + 1, m)])
                if s > 0:
                    grad_in[(s, m)] = x_in.grad.detach().clone()
                k = backs[(s, j)]
                pending[s].setdefault(k, []).append({n_: t.grad.detach().clone()
                                                     for n_, t in leaves.items()})
                backs[(s, j)] += 1
                if len(pending[s][k]) == replicas[s]:
                    grads = pending[s].pop(k)
                    wm, ws = versions[s][-1]
                    new = {n_: ws[n_] - lr * (sum(g[n_] for g in grads) / replicas[s])
                           for n_ in ws}
                    versions[s].append((wm + replicas[s], new))
                    rounds_done[s] += 1
            pos[(s, j)] += 1
            progressed = True
        if not progressed:
            raise RuntimeError("deadlock in the reference simulation")
    return [versions[s][-1][1] for s in range(S)], losses
