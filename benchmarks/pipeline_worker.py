"""One worker of the pipeline benchmark (:mod:`benchmarks.pipeline`), started on every worker
host of the emulated cluster: ``python -m benchmarks.pipeline_worker MODE PLAN_JSON``.

``pipedream``: every rank profiles the model at once (the emulated hosts share the machine's
cores, as the stages do in training), rank 0 partitions its profile
(byteps.torch.pipeline.partition at the link's bandwidth) and broadcasts the plan, then the
pipeline trains ``warmup_epochs`` + ``epochs`` epochs of synthetic minibatches. ``dp``: byteps data parallelism (DistributedOptimizer) on the
same samples per epoch (every rank a minibatch of each global batch). Each prints one
``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F


def vgg_like(p: dict) -> torch.nn.Sequential:
    """Convolutions (3x3, ReLU, 2x2 max-pool per width of ``p["convs"]``) on ``p["image"]``
    square RGB images, then a large fully connected layer (``p["fc"]`` units) and the
    classifier: VGG's shape, small."""
    torch.manual_seed(0)
    layers, c = [], 3
    for width in p["convs"]:
        layers += [torch.nn.Conv2d(c, width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        c = width
    side = p["image"] >> len(p["convs"])
    layers += [torch.nn.Flatten(), torch.nn.Linear(c * side * side, p["fc"]), torch.nn.ReLU(),
               torch.nn.Linear(p["fc"], 10)]
    return torch.nn.Sequential(*layers)


def batches(p: dict, size: int, count: int):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(size, 3, p["image"], p["image"], generator=g)
    y = torch.randint(0, 10, (size,), generator=g)
    return [(x, y)] * count


def steady_rate(done: dict) -> float:
    """Minibatches/s between the backwards of the middle half of a rank's minibatches."""
    ms = sorted(done)
    if len(ms) < 4:
        return len(ms) / max(done[ms[-1]], 1e-9)
    a, b = ms[len(ms) // 4], ms[(3 * len(ms)) // 4]
    return (b - a) / (done[b] - done[a])


def run_pipedream(p: dict) -> dict:
    import byteps.torch as bps
    from byteps.torch import pipeline

    model = vgg_like(p)
    sample = batches(p, p["minibatch"], 1)[0][0]
    plan = None
    # Every rank profiles at once and rank 0's profile decides: the emulated hosts share this
    # machine's cores, and the stages compute at once in training too, so a profile taken alone
    # (the others idle) would credit each stage with cores it does not have in the run.
    prof = pipeline.profile(model, sample, repeats=p["profile_repeats"], warmup=2)
    if bps.rank() == 0:
        plan = pipeline.partition(prof, bps.size(), p["bandwidth_Bps"]).to_dict()
        plan["dp_time_per_minibatch"] = pipeline.data_parallel_time(prof, bps.size(),
                                                                    p["bandwidth_Bps"])
        plan["profile"] = [lp.to_dict() for lp in prof]
    plan = bps.broadcast_object(plan, 0, name="bench.pipeline.plan")
    trainer = pipeline.PipelineTrainer(model, pipeline.Plan.from_dict(plan), F.cross_entropy,
                                       lambda ps: torch.optim.SGD(ps, lr=0.01))
    data = batches(p, p["minibatch"], p["minibatches"])
    for _ in range(p["warmup_epochs"]):
        trainer.train_epoch(data[:max(4 * len(plan["stages"]), 8)])
    epochs = []
    for _ in range(p["epochs"]):
        r = trainer.train_epoch(data)
        epochs.append({"seconds": r["seconds"], "minibatches": r["minibatches"],
                       "steady_rate": steady_rate(r["backward_done"])})
    trainer.close()
    return {"mode": "pipedream", "rank": bps.rank(), "stage": trainer.stage,
            "plan": plan if bps.rank() == 0 else None, "epochs": epochs}


def run_dp(p: dict) -> dict:
    import byteps.torch as bps

    model = vgg_like(p)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = p["minibatches"] // bps.size()
    (x, y), = batches(p, p["minibatch"], 1)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(p["warmup_epochs"]):
        for _ in range(2):
            step()
    epochs = []
    for _ in range(p["epochs"]):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        epochs.append({"seconds": time.perf_counter() - t0, "minibatches": steps * bps.size()})
    return {"mode": "dp", "rank": bps.rank(), "epochs": epochs}


def main(argv) -> int:
    import byteps.torch as bps

    torch.set_num_threads(1)
    mode, p = argv[0], json.loads(argv[1])
    bps.init()
    out = run_pipedream(p) if mode == "pipedream" else run_dp(p)
    print("RESULT " + json.dumps(out), flush=True)
    bps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
