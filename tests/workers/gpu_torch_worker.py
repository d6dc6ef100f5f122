"""Worker script of tests/test_gpu.py (torch on CUDA): ``python gpu_torch_worker.py MODE``
under ``python -m byteps.launch``; log, fail and the start-up are bps_worker's.

Modes:

* ``train``: the same small model trained twice with ``byteps.torch.DistributedOptimizer``
  from the same initial weights and the same per-rank data, once on the CPU and once on
  ``cuda:<local_rank % device_count>``; the parameters after every step must agree (within
  float32 rounding of the different kernels).
* ``ddp``: the same with ``byteps.torch.parallel.DistributedDataParallel`` (``device_ids =
  [the CUDA device]``, a BatchNorm layer so buffers are broadcast too) and plain SGD; the
  CUDA module must also refuse ``device_ids`` naming another device.
* ``crossbarrier``: ``byteps.torch.cross_barrier.CrossBarrier`` (updates in its background thread, each
  layer's before the next forward pass reaches it) on the CPU and on CUDA for ``num_steps``
  steps; the final parameters must agree.
* ``ops``: push_pull / push_pull_async_inplace of CUDA tensors (every dtype, sizes around the
  partition bound, non-contiguous, out of place) against the CPU result of the same call;
  a result consumed on another stream; broadcast_parameters of a CUDA model; byteps.push_pull
  (the DLPack front) of a CUDA tensor, and of a CuPy array when CuPy is installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bps_worker (which adds tests/)
import bps_worker as w
from bps_worker import fail

import byteps
import byteps.torch as bps_t


def device():
    return torch.device("cuda", bps_t.local_rank() % torch.cuda.device_count())


def _model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _train(dev, steps: int, tag: str):
    model = _model(1234).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = bps_t.DistributedOptimizer(opt, named_parameters=[(f"{tag}.{n}", p) for n, p in
                                                            model.named_parameters()])
    bps_t.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"{tag}.init.")
    return _steps(model, opt, dev, steps, 100 + w.RANK, model.parameters)


def _steps(forward, opt, dev, steps: int, seed: int, state):
    """``steps`` SGD steps of an MSE loss on this rank's batches (seeded): a host copy of the
    tensors ``state()`` gives after each."""
    gen = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen).to(dev)
        y = torch.randn(16, 4, generator=gen).to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(forward(x), y).backward()
        opt.step()
        history.append([t.detach().cpu().clone() for t in state()])
    return history


def mode_train(args) -> int:
    steps = int(args[0]) if args else 10
    cpu = _train(torch.device("cpu"), steps, "cpu")
    gpu = _train(device(), steps, "gpu")
    for step, (a, b) in enumerate(zip(cpu, gpu)):
        for i, (pa, pb) in enumerate(zip(a, b)):
            if not torch.allclose(pa, pb, rtol=1e-4, atol=1e-5):
                fail(f"step {step} parameter {i}: CUDA training differs from CPU training by "
                     f"{(pa - pb).abs().max().item():.3g}")
    return steps


def _train_ddp(dev, steps: int):
    from byteps.torch.parallel import DistributedDataParallel

    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    return _steps(ddp, opt, dev, steps, 200 + w.RANK, lambda: model.state_dict().values())


def mode_ddp(args) -> int:
    from byteps.errors import InvalidArgumentError
    from byteps.torch.parallel import DistributedDataParallel

    steps = int(args[0]) if args else 10
    cpu = _train_ddp(torch.device("cpu"), steps)
    gpu = _train_ddp(device(), steps)
    for step, (a, b) in enumerate(zip(cpu, gpu)):
        for i, (ta, tb) in enumerate(zip(a, b)):
            if not torch.allclose(ta.double(), tb.double(), rtol=1e-4, atol=1e-4):
                fail(f"DDP step {step} state {i}: CUDA training differs from CPU training by "
                     f"{(ta.double() - tb.double()).abs().max().item():.3g}")
    other = torch.device("cuda", device().index + 1)
    try:
        DistributedDataParallel(torch.nn.Linear(2, 2).to(device()), device_ids=[other],
                                init_sync=False)
        fail("DDP accepted device_ids naming another device than the module's")
    except InvalidArgumentError as exc:
        if "device_ids" not in str(exc):
            fail(f"DDP's error does not name device_ids: {exc}")
    return steps + 1


def _train_cross_barrier(dev, steps: int, tag: str):
    from byteps.torch.cross_barrier import CrossBarrier

    model = _model(1234).to(dev)
    opt = CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                       named_parameters=[(f"xb.{tag}.{n}", p) for n, p in model.named_parameters()],
                       num_steps=steps)
    # after the last of num_steps steps every update is done: only that state is compared
    return _steps(model, opt, dev, steps, 300 + w.RANK, model.parameters)[-1]


def mode_crossbarrier(args) -> int:
    steps = int(args[0]) if args else 10
    cpu = _train_cross_barrier(torch.device("cpu"), steps, "cpu")
    gpu = _train_cross_barrier(device(), steps, "gpu")
    for i, (pa, pb) in enumerate(zip(cpu, gpu)):
        if not torch.allclose(pa, pb, rtol=1e-4, atol=1e-5):
            fail(f"CrossBarrier parameter {i}: CUDA training differs from CPU training by "
                 f"{(pa - pb).abs().max().item():.3g}")
    return len(cpu)


DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int32, torch.int64)


def mode_ops(args) -> int:
    dev, count = device(), 0
    bound = int(os.environ.get("BYTEPS_PARTITION_BYTES", "65536"))
    for dtype in DTYPES:
        per = bound // torch.empty(0, dtype=dtype).element_size()
        for n in (0, 1, per - 1, per, per + 1, 3 * per + 1):
            base = torch.arange(n, dtype=torch.int64) % 11 - (0 if dtype == torch.uint8 else 5)
            host = (base + w.RANK).to(dtype)
            for average in (False, True):
                name = f"ops.{dtype}.{n}.{int(average)}"
                want = bps_t.synchronize(bps_t.push_pull_async(host.clone(), average,
                                                               name + ".cpu"))
                got = bps_t.synchronize(bps_t.push_pull_async(host.to(dev), average, name))
                if got.device != dev or not torch.equal(got.cpu(), want):
                    fail(f"{name}: CUDA result differs from the CPU result")
                inplace = host.to(dev)
                bps_t.synchronize(bps_t.push_pull_async_inplace(inplace, average, name + ".ip"))
                if not torch.equal(inplace.cpu(), want):
                    fail(f"{name}: in-place CUDA result differs from the CPU result")
                count += 2
    # Non-contiguous, in place (a contiguous copy is reduced and copied back).
    m = (torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48) + w.RANK).to(dev).t()
    want = (torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48).t() * bps_t.size()
            + sum(range(bps_t.size())))
    bps_t.synchronize(bps_t.push_pull_async_inplace(m, False, "ops.noncontig"))
    if not torch.equal(m.cpu(), want):
        fail("non-contiguous CUDA tensor: wrong in-place result")
    # The result consumed on another stream right after synchronize.
    side = torch.cuda.Stream(dev)
    x = torch.full((1 << 20,), float(w.RANK + 1), device=dev)
    bps_t.synchronize(bps_t.push_pull_async_inplace(x, False, "ops.stream"))
    with torch.cuda.stream(side):
        total = x.sum()
    side.synchronize()
    if total.item() != float((1 << 20) * sum(r + 1 for r in range(bps_t.size()))):
        fail(f"result read on another stream: {total.item()}")
    # broadcast_parameters of a CUDA model.
    model = _model(w.RANK).to(dev)
    bps_t.broadcast_parameters(model.state_dict(), root_rank=0, prefix="ops.bcast.")
    ref = _model(0)
    for (n, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        if not torch.equal(p.cpu(), q):
            fail(f"broadcast_parameters: {n} differs from rank 0's")
    # The DLPack front: a torch CUDA tensor, and CuPy if installed.
    t = torch.full((1000,), float(w.RANK), device=dev)
    byteps.push_pull(t, average=False, name="ops.dlpack.torch")
    if not torch.equal(t.cpu(), torch.full((1000,), float(sum(range(bps_t.size()))))):
        fail("byteps.push_pull of a torch CUDA tensor: wrong result")
    count += 4
    try:
        import cupy
    except ImportError:
        w.log("no CuPy: its DLPack case skipped")
    else:
        with cupy.cuda.Device(dev.index):
            c = cupy.full((1000,), w.RANK + 1, dtype=cupy.int32)
            byteps.push_pull(c, average=False, name="ops.dlpack.cupy")
            if not bool((c == sum(r + 1 for r in range(bps_t.size()))).all()):
                fail("byteps.push_pull of a CuPy array: wrong result")
        count += 1
    return count


if __name__ == "__main__":
    torch.cuda.set_device(int(os.environ.get("BYTEPS_LOCAL_RANK", "0")) %
                          torch.cuda.device_count())
    w.main({"train": mode_train, "ddp": mode_ddp, "crossbarrier": mode_crossbarrier,
            "ops": mode_ops})
