"""byteps.torch.pipeline on every rank of a 4-worker job: python pipeline_worker.py MODE

``train``: for several plans (4 stages; 3 stages whose first is replicated twice; 2 stages of
2 replicas each), first the semantics: 12 minibatches from a fresh model, every stage's weights
and the last stage's losses compared with the single-process reference of the same schedule
(tests/pipeline_reference.py: stashing, vertical sync, no stashing); then the accuracy: the plan
trains an MLP on sklearn's digits, and its test accuracy (the model gathered on rank 0) is
compared with byteps data parallelism (DistributedOptimizer, every rank a quarter of each
global batch) trained in the same job. Prints ``PIPELINE_OK`` per rank (exit 0) or
``PIPELINE_FAILED``.

``kill``: a 3-stage pipeline trains; rank KILL (argv[2]) SIGKILLs itself in its 5th minibatch.
Every other rank must get PeerLostError (or the summation service's failure) from
train_epoch and print ``PIPELINE_PEER_LOST rank=R seconds=S`` before exiting 3.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import Checker

import byteps.torch as bps
from byteps.errors import BytePSError, PeerLostError
from byteps.torch import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: pipeline_reference
import pipeline_reference as ref

B = 32  # minibatch


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1.0)
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(y))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def epoch_batches(train, epoch, size):
    x, y = train
    g = torch.Generator().manual_seed(1000 + epoch)
    perm = torch.randperm(len(y), generator=g)
    return [(x[perm[i:i + size]], y[perm[i:i + size]])
            for i in range(0, len(y) - size + 1, size)]


def accuracy(model, test):
    with torch.no_grad():
        return float((model(test[0]).argmax(1) == test[1]).float().mean())


# plan name -> (stage layer ranges, replicas, weight stashing, vertical sync)
PLANS = {
    "4stages": ([(0, 1), (2, 3), (4, 5), (6, 6)], [1, 1, 1, 1], True, False),
    "3stages_rep2_vsync": ([(0, 2), (3, 4), (5, 6)], [2, 1, 1], True, True),
    "2stages_2x2_nostash": ([(0, 3), (4, 6)], [2, 2], False, False),
}
PIPE_LR, PIPE_EPOCHS = 0.1, 16  # plain SGD, minibatches of B
DP_LR, DP_EPOCHS = 0.4, 16  # plain SGD, global batches of 4 B


def semantics(ck, name, stages, reps, stash, vsync, train):
    model = make_model(seed=7)
    plan = pipeline.make_plan(stages, reps)
    batches = epoch_batches(train, 99, 8)[:12]
    lr = 0.1
    want_w, want_loss = ref.simulate(list(model), stages, reps, batches, F.cross_entropy, lr,
                                     stashing=stash, vertical_sync=vsync)
    tr = pipeline.PipelineTrainer(model, plan, F.cross_entropy,
                                  lambda p: torch.optim.SGD(p, lr=lr), weight_stashing=stash,
                                  vertical_sync=vsync)
    out = tr.train_epoch(batches)
    got = tr.stage_state()
    mine = want_w[tr.stage]
    ok = set(got) == set(mine) and all(torch.allclose(got[k], mine[k], rtol=1e-5, atol=1e-6)
                                       for k in mine)
    worst = max((float((got[k] - mine[k]).abs().max()) for k in mine if k in got), default=-1)
    ck.check(ok, f"{name}: stage {tr.stage} weights differ from the reference (max abs "
                 f"{worst:.3g})")
    for m, loss in out["losses"].items():
        ck.check(abs(loss - want_loss[m]) < 1e-5, f"{name}: loss of minibatch {m} {loss} != "
                                                   f"reference {want_loss[m]}")
    # the check has teeth: another semantics gives other weights on some stage
    alt, _ = ref.simulate(list(make_model(seed=7)), stages, reps, batches, F.cross_entropy, lr,
                          stashing=not stash, vertical_sync=False)
    differs = any(not torch.allclose(alt[s][k], want_w[s][k], rtol=1e-5, atol=1e-6)
                  for s in range(len(reps)) for k in alt[s])
    ck.check(differs, f"{name}: stashing and not stashing gave the same weights")
    tr.close()
    return worst


def train_pipeline(ck, name, stages, reps, stash, vsync, train, test):
    model = make_model(seed=1)
    plan = pipeline.make_plan(stages, reps)
    tr = pipeline.PipelineTrainer(model, plan, F.cross_entropy,
                                  lambda p: torch.optim.SGD(p, lr=PIPE_LR),
                                  weight_stashing=stash, vertical_sync=vsync)
    t0 = time.time()
    for e in range(PIPE_EPOCHS):
        tr.train_epoch(epoch_batches(train, e, B))
    secs = time.time() - t0
    full = tr.gather_model(model, dst=0)
    tr.close()
    acc = accuracy(full, test) if full is not None else None
    return bps.broadcast_object(acc, root_rank=0, name=f"acc.{name}"), secs


def train_data_parallel(train, test):
    r, n = bps.rank(), bps.size()
    model = make_model(seed=1)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=DP_LR),
                                   named_parameters=[("dp." + k, p)
                                                     for k, p in model.named_parameters()])
    bps.broadcast_parameters(model.state_dict(), root_rank=0, prefix="dp.init.")
    for e in range(DP_EPOCHS):
        for x, y in epoch_batches(train, e, B * n):
            opt.zero_grad()
            F.cross_entropy(model(x[r * B:(r + 1) * B]), y[r * B:(r + 1) * B]).backward()
            opt.step()
    return accuracy(model, test)


def mode_train():
    ck = Checker("PIPELINE")
    train, test = digits()
    for name, (stages, reps, stash, vsync) in PLANS.items():
        worst = ck.run(f"semantics {name}", semantics, ck, name, stages, reps, stash, vsync,
                       train)
        print(f"SEMANTICS {name} rank={bps.rank()} max_abs_diff={worst}", flush=True)
    dp = ck.run("data parallel", train_data_parallel, train, test)
    print(f"ACCURACY data_parallel={dp}", flush=True)
    for name, (stages, reps, stash, vsync) in PLANS.items():
        got = ck.run(f"train {name}", train_pipeline, ck, name, stages, reps, stash, vsync,
                     train, test)
        if got is None:
            continue
        acc, secs = got
        print(f"ACCURACY {name}={acc} rank={bps.rank()} seconds={secs:.2f}", flush=True)
        ck.check(dp is not None and acc is not None and acc >= dp - 0.02,
                 f"{name}: accuracy {acc} more than 2 points below data parallelism's {dp}")
        ck.check(acc is not None and acc > 0.9, f"{name}: accuracy {acc} (not trained)")
    ck.finish()


def mode_kill(victim: int):
    train, _ = digits()
    model = make_model(seed=1)
    plan = pipeline.make_plan([(0, 1), (2, 4), (5, 6)], [2, 1, 1])
    calls = {"n": 0}
    layer = list(model)[plan.stages[plan.stage_of_rank(victim)[0]].first]

    def bomb(*_):
        calls["n"] += 1
        if bps.rank() == victim and calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGKILL)
    layer.register_forward_pre_hook(bomb)
    tr = pipeline.PipelineTrainer(model, plan, F.cross_entropy,
                                  lambda p: torch.optim.SGD(p, lr=0.05))
    t0 = None
    try:
        for e in range(1000):
            batches = epoch_batches(train, e, B)
            if t0 is None:
                t0 = time.time()
            tr.train_epoch(batches)
    except (PeerLostError, BytePSError) as exc:
        print(f"PIPELINE_PEER_LOST rank={bps.rank()} seconds={time.time() - t0:.2f} "
              f"error={type(exc).__name__}: {str(exc)[:300]}", flush=True)
        os._exit(3)
    print(f"PIPELINE_NO_ERROR rank={bps.rank()}", flush=True)
    os._exit(1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    bps.init()
    if sys.argv[1] == "train":
        mode_train()
    else:
        mode_kill(int(sys.argv[2]))
