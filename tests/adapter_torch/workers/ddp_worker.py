"""byteps.torch.parallel.DistributedDataParallel, run on every rank: python ddp_worker.py [CASE...]

Every case computes its reference inside this process: the averaged gradient over all ranks'
batches (each rank's batch is a deterministic function of (step, rank)), applied by
single-process SGD to a copy of the model. Prints ``TORCH_DDP_OK rank=..`` or
``TORCH_DDP_FAILED`` (exit 1), and ``DDP_UNUSED_RAISED rank=..`` / ``DDP_MISMATCH_RAISED
rank=..`` when the expected errors were raised.
"""

from __future__ import annotations

import copy
import sys
import warnings

import torch
import torch.nn.functional as F
from _common import Checker

import byteps.torch as bps
from byteps.errors import MismatchError, UsageError
from byteps.torch.parallel import DistributedDataParallel as DDP

D_IN, D_OUT, B = 6, 3, 4
TOL = dict(rtol=1e-12, atol=1e-14)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, D_OUT))


def batch(step: int, q: int, extra: int = 0):
    g = torch.Generator().manual_seed(100_000 * extra + 1000 * step + q)
    return (torch.randn(B, D_IN, generator=g, dtype=torch.float64),
            torch.randn(B, D_OUT, generator=g, dtype=torch.float64))


def local_grads(model, loss_fn) -> list:
    """Gradients of ``loss_fn(model)`` w.r.t. the parameters (None where unused)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = iter(torch.autograd.grad(loss_fn(model), params, allow_unused=True))
    return [next(grads) if p.requires_grad else None for p in model.parameters()]


def average(grads_per_rank: list) -> list:
    """Average over ranks; None counts as zero, and stays None where every rank had None."""
    out = []
    for gs in zip(*grads_per_rank):
        present = [g for g in gs if g is not None]
        out.append(None if not present else sum(present) / len(gs))
    return out


def sgd(model, grads, lr: float) -> None:
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            if g is not None:
                p.sub_(lr * g)


def all_close(ck, got, want, label, **tol) -> None:
    tol = tol or TOL
    for i, (a, b) in enumerate(zip(got, want)):
        if a is None or b is None:
            ck.check(a is None and b is None, f"{label}: tensor {i}: got {a}, want {b}")
            continue
        diff = (a - b).abs().max().item()
        ck.check(torch.allclose(a, b, **tol), f"{label}: tensor {i} differs (max {diff:.3g})")


def same_as_root(ck, tensors, name, label) -> None:
    mine = [t.detach().clone() for t in tensors]
    root = bps.broadcast_object(mine, root_rank=0, name=name)
    ck.check(all(torch.equal(a, b) for a, b in zip(mine, root)), f"{label}: differs from rank 0")


# ------------------------------------------------------------------------------------ cases
def equivalence(ck: Checker, r: int, n: int, compression=bps.Compression.none,
                tol=None) -> None:
    """Different init on every rank, broadcast at construction; 3 SGD steps with momentum-free
    SGD equal single-process SGD on the averaged gradient; p.grad is averaged when backward
    returns."""
    label = f"equivalence[{compression.__name__}]"
    m = make_model(seed=30 + r)
    ddp = DDP(m, compression=compression)
    ck.check(all(torch.equal(a, b) for a, b in zip(m.parameters(),
                                                    make_model(seed=30).parameters())),
             f"{label}: parameters not rank 0's after construction")
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(3):
        x, y = batch(s, r)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        want = average([local_grads(ref, lambda mod, q=q, s=s: F.mse_loss(mod(batch(s, q)[0]),
                                                                     batch(s, q)[1]))
                        for q in range(n)])
        all_close(ck, [p.grad for p in m.parameters()], want, f"{label} grad step {s}",
                  **(tol or {}))
        opt.step()
        sgd(ref, want, 0.1)
        all_close(ck, list(m.parameters()), list(ref.parameters()), f"{label} step {s}",
                  **(tol or {}))
    same_as_root(ck, list(m.parameters()), "eq." + compression.__name__, label)


def no_sync(ck: Checker, r: int, n: int) -> None:
    """Two micro-batches inside no_sync (local gradients only), a third outside: p.grad is the
    average over ranks of the accumulated (summed) gradient."""
    m = make_model(seed=40 + r)
    ddp = DDP(m)
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for s in range(2):
        opt.zero_grad()
        with ddp.no_sync():
            for k in range(2):
                x, y = batch(s, r, extra=k + 1)
                F.mse_loss(ddp(x), y).backward()
        own = local_grads(ref, lambda mod, s=s: sum(F.mse_loss(mod(batch(s, r, k + 1)[0]),
                                                          batch(s, r, k + 1)[1])
                                               for k in range(2)))
        all_close(ck, [p.grad for p in m.parameters()], own, f"no_sync local grads step {s}")
        x, y = batch(s, r, extra=3)
        F.mse_loss(ddp(x), y).backward()

        def acc(mod, q, s=s):
            return sum(F.mse_loss(mod(batch(s, q, k)[0]), batch(s, q, k)[1])
                       for k in (1, 2, 3))
        want = average([local_grads(ref, lambda mod, q=q: acc(mod, q)) for q in range(n)])
        all_close(ck, [p.grad for p in m.parameters()], want, f"no_sync grads step {s}")
        opt.step()
        sgd(ref, want, 0.05)
        all_close(ck, list(m.parameters()), list(ref.parameters()), f"no_sync step {s}")
    same_as_root(ck, list(m.parameters()), "nosync", "no_sync")


class BNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D_IN, 5)
        self.bn = torch.nn.BatchNorm1d(5)

    def forward(self, x):
        return self.bn(self.fc(x))


def buffers(ck: Checker, r: int, n: int) -> None:
    """broadcast_buffers: at each training forward the BatchNorm statistics the module sees
    are rank 0's; without it they stay each rank's own; a no_grad forward is local (only rank
    0 runs one here: it must not wait for the others)."""
    for flag in (True, False):
        torch.manual_seed(50 + r)
        net = BNNet()
        seen = []
        net.register_forward_pre_hook(
            lambda mod, args, seen=seen: seen.append([b.detach().clone() for b in mod.buffers()]))
        ddp = DDP(net, broadcast_buffers=flag)
        for s in range(3):
            x, _ = batch(s, r, extra=9)
            ddp(x + r).sum().backward()  # rank-dependent statistics
            root = bps.broadcast_object(seen[-1], root_rank=0, name="bn.seen")
            equal = all(torch.equal(a, b) for a, b in zip(seen[-1], root))
            if flag:
                ck.check(equal, f"broadcast_buffers=True step {s}: statistics not rank 0's")
            elif s > 0 and r != 0:
                ck.check(not equal, f"broadcast_buffers=False step {s}: statistics are rank 0's")
        if r == 0:
            with torch.no_grad():
                ddp.eval()
                ddp(batch(0, 0)[0])
                ddp.train()
        ck.check(int(net.bn.num_batches_tracked) == 3, "num_batches_tracked")


class TwoBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(60)
        self.a = torch.nn.Linear(D_IN, D_OUT)
        self.b = torch.nn.Linear(D_IN, D_OUT)
        self.c = torch.nn.Linear(D_IN, D_OUT)
        self.frozen = torch.nn.Linear(D_IN, D_OUT).requires_grad_(False)

    def forward(self, x, use_b: bool):
        out = self.a(x) + 0 * self.frozen(x)
        return out + self.b(x) if use_b else out


def unused_error(ck: Checker, r: int, n: int) -> None:
    """find_unused_parameters=False: b and c get no gradient on any rank -> UsageError naming
    them on every rank; the wrapper still works afterwards."""
    m = TwoBranch()
    ddp = DDP(m)
    x, y = batch(0, r, extra=6)
    try:
        F.mse_loss(ddp(x, use_b=False), y).backward()
        ck.check(False, "unused parameters: no error raised")
    except UsageError as e:
        msg = str(e)
        ok = all(s in msg for s in ("'b.weight'", "'b.bias'", "'c.weight'", "'c.bias'",
                                    "find_unused_parameters=True"))
        ok = ok and "'a.weight'" not in msg and "frozen" not in msg
        if ck.check(ok, f"unused parameters: message {msg!r}"):
            print(f"DDP_UNUSED_RAISED rank={r}: {msg}", flush=True)
    # a with every rank's gradient averaged all the same
    want = average([local_grads(m, lambda mod, q=q: F.mse_loss(
        mod(batch(0, q, 6)[0], use_b=False), batch(0, q, 6)[1])) for q in range(n)])
    all_close(ck, [m.a.weight.grad, m.a.bias.grad], want[:2], "unused error: a's gradient")
    # synchronize() is a no-op now, and a full step still works
    ddp.synchronize()
    for p in m.parameters():
        p.grad = None
    m2 = TwoBranch()
    m2.c.requires_grad_(False)
    ddp2 = DDP(m2)
    F.mse_loss(ddp2(x, use_b=True), y).backward()
    ck.check(m2.b.weight.grad is not None, "after the error: a normal backward works")


def unused_ok(ck: Checker, r: int, n: int) -> None:
    """find_unused_parameters=True: b used on rank 0 only (the others contribute zeros), c on
    no rank (its grad stays None); equals SGD on the average with zeros for unused."""
    m = TwoBranch()
    ddp = DDP(m, find_unused_parameters=True)
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(2):
        x, y = batch(s, r, extra=7)
        opt.zero_grad()
        F.mse_loss(ddp(x, use_b=(r == 0)), y).backward()
        want = average([local_grads(ref, lambda mod, q=q, s=s: F.mse_loss(
            mod(batch(s, q, 7)[0], use_b=(q == 0)), batch(s, q, 7)[1])) for q in range(n)])
        got = [p.grad for p in m.parameters()]
        all_close(ck, got, want, f"find_unused step {s} grads")
        ck.check(m.c.weight.grad is None and m.frozen.weight.grad is None,
                 "unused-everywhere parameter got a gradient")
        opt.step()
        sgd(ref, want, 0.1)
        all_close(ck, list(m.parameters()), list(ref.parameters()), f"find_unused step {s}")
    same_as_root(ck, list(m.parameters()), "unused", "find_unused")


def unused_on_some_ranks(ck: Checker, r: int, n: int) -> None:
    """find_unused_parameters=True where rank 0 uses every parameter and the others do not
    use b: every rank still reduces the same tensors (no rank waits)."""
    m = TwoBranch()
    m.c.requires_grad_(False)
    ddp = DDP(m, find_unused_parameters=True)
    for s in range(2):
        x, y = batch(s, r, extra=8)
        m.zero_grad()
        F.mse_loss(ddp(x, use_b=(r == 0)), y).backward()
        want = average([local_grads(m, lambda mod, q=q, s=s: F.mse_loss(
            mod(batch(s, q, 8)[0], use_b=(q == 0)), batch(s, q, 8)[1])) for q in range(n)])
        all_close(ck, [p.grad for p in m.parameters()], want, f"unused on some ranks step {s}")


def mismatch(ck: Checker, r: int, n: int) -> None:
    """A failed reduction surfaces from backward() as the typed error on every rank: models
    whose shapes differ by rank (no broadcast at construction) -> MismatchError."""
    torch.manual_seed(0)
    m = torch.nn.Linear(D_IN, 2 + r)
    ddp = DDP(m, init_sync=False)
    try:
        ddp(batch(0, r)[0]).sum().backward()
        ck.check(False, "mismatched shapes: backward raised nothing")
    except MismatchError as e:
        print(f"DDP_MISMATCH_RAISED rank={r}: {e}", flush=True)
    # and the next step of a good model works
    good = DDP(make_model(seed=1))
    good(batch(0, r)[0]).sum().backward()
    ck.check(all(p.grad is not None for p in good.parameters()), "after a mismatch")


def upstream_benchmark_api(ck: Checker, r: int, n: int) -> None:
    """The byteps calls of upstream's example/pytorch/benchmark_byteps_ddp.py with --no-cuda
    (a small model instead of torchvision's)."""
    torch.manual_seed(70 + r)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        model = DDP(model, device_ids=[bps.local_rank()])
    ck.check(any("device_ids" in str(x.message) for x in w), "device_ids: no warning")
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    data = torch.rand(4, 3, 4, 4)
    target = torch.LongTensor(4).random_() % 10
    for _ in range(2):
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
    ck.check(bps.size() == n and 0 <= bps.local_rank() < bps.local_size(), "size/local_rank")
    same_as_root(ck, list(model.parameters()), "bench", "upstream benchmark API")


CASES = {
    "equivalence": equivalence,
    "fp16": lambda ck, r, n: equivalence(ck, r, n, bps.Compression.fp16,
                                         dict(rtol=1e-2, atol=1e-3)),
    "no_sync": no_sync,
    "buffers": buffers,
    "unused_error": unused_error,
    "unused_ok": unused_ok,
    "unused_some": unused_on_some_ranks,
    "mismatch": mismatch,
    "benchmark_api": upstream_benchmark_api,
}


def main() -> None:
    bps.init()
    r, n = bps.rank(), bps.size()
    torch.set_default_dtype(torch.float64)
    ck = Checker("TORCH_DDP")
    for name in sys.argv[1:] or list(CASES):
        ck.run(name, CASES[name], ck, r, n)
    ck.finish()
    bps.shutdown()


if __name__ == "__main__":
    main()
