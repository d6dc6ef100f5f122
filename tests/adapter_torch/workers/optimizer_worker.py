"""Broadcasts and DistributedOptimizer, run on every rank: python optimizer_worker.py

Every case computes its own reference inside this process (e.g. a copy of the model trained
on the concatenation of all ranks' batches) and compares. Prints ``TORCH_OPTIM_OK rank=..``
or ``TORCH_OPTIM_FAILED`` (exit 1).

Each model gets its own name prefix: one name must keep one shape and dtype.
"""

from __future__ import annotations

import copy
import hashlib
import warnings

import torch
import torch.nn.functional as F
from _common import Checker

import byteps.torch as bps
from byteps.errors import UsageError

D_IN, D_OUT, B = 6, 3, 4


def make_model(seed: int, dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, D_OUT)).to(dtype)


def batch(step: int, q: int, extra: int = 0):
    g = torch.Generator().manual_seed(100_000 * extra + 1000 * step + q)
    x = torch.randn(B, D_IN, generator=g, dtype=torch.float64)
    y = torch.randn(B, D_OUT, generator=g, dtype=torch.float64)
    return x, y


def full_batch(step: int, n: int, extra: int = 0):
    xs, ys = zip(*(batch(step, q, extra) for q in range(n)))
    return torch.cat(xs), torch.cat(ys)


def named(prefix: str, model):
    return [(prefix + name, p) for name, p in model.named_parameters()]


def params_digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def same_everywhere(ck: Checker, model, label: str) -> None:
    mine = params_digest(model)
    root = bps.broadcast_object(mine, root_rank=0, name="digest")
    ck.check(mine == root, f"{label}: parameters differ from rank 0's (bit-level)")


def close(a, b, rtol=1e-7, atol=1e-9) -> bool:
    return all(torch.allclose(x, y, rtol=rtol, atol=atol)
               for x, y in zip(a.parameters(), b.parameters()))


# -------------------------------------------------------------------------------- broadcasts
def broadcast_params(ck: Checker, r: int, n: int) -> None:
    for root in range(n):
        m = make_model(seed=10 + r)
        m.register_buffer("counter", torch.tensor([r, 2 * r], dtype=torch.int64))
        bps.broadcast_parameters(m.state_dict(), root_rank=root, prefix="bp.sd.")
        want = make_model(seed=10 + root)
        ck.check(close(m, want, 0, 0), f"broadcast_parameters(state_dict) from root {root}")
        ck.check(m.counter.tolist() == [root, 2 * root], f"int64 buffer from root {root}")
        # named_parameters: list of (name, tensor) tuples, tensors requiring grad
        m = make_model(seed=20 + r)
        bps.broadcast_parameters(list(m.named_parameters()), root_rank=root, prefix="bp.np.")
        ck.check(close(m, make_model(seed=20 + root), 0, 0), f"named_parameters from {root}")
        # list of unnamed tensors of different sizes, dtypes, one non-contiguous
        base = torch.full((5, 4), float(r))
        ts = [torch.full((3,), r, dtype=torch.int32), torch.full((7, 2), r + 0.5,
              dtype=torch.bfloat16), base.t(), torch.tensor(float(r))]
        bps.broadcast_parameters(ts, root_rank=root)
        ck.check(ts[0].tolist() == [root] * 3, f"list int32 from {root}")
        ck.check(bool((ts[1] == root + 0.5).all()), f"list bf16 from {root}")
        ck.check(bool((base == root).all()), f"list non-contiguous from {root}")
        ck.check(ts[3].item() == root, f"list 0-d from {root}")
    try:
        bps.broadcast_parameters({"x": torch.zeros(1)}, root_rank=n)
        ck.check(False, "root_rank out of range accepted")
    except ValueError:
        ck.check(True, "")


def broadcast_objects(ck: Checker, r: int, n: int) -> None:
    for root in range(n):
        obj = {"rank": r, "data": list(range(10 * r + 1)), "f": (lambda v, k=r: v * k),
               "t": torch.arange(r + 1)}
        got = bps.broadcast_object(obj, root_rank=root, name="obj")
        ck.check(got["rank"] == root and got["data"] == list(range(10 * root + 1))
                 and got["f"](3) == 3 * root and got["t"].tolist() == list(range(root + 1)),
                 f"broadcast_object from root {root}: {got['rank']}")
    got = bps.broadcast_object("hello" if r == 0 else None, name="str")
    ck.check(got == "hello", "broadcast_object default root")
    big = bps.broadcast_object(b"x" * 3_000_000 if r == 0 else None, name="bytes")
    ck.check(big == b"x" * 3_000_000, "broadcast_object 3 MB")


def _train_a_bit(model, opt, steps: int, extra: int) -> None:
    for s in range(steps):
        x, y = batch(s, 0, extra)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def _state_equal(a: dict, b: dict) -> bool:
    if a["param_groups"] != b["param_groups"]:
        return False
    if a["state"].keys() != b["state"].keys():
        return False
    for k, st in a["state"].items():
        other = b["state"][k]
        if st.keys() != other.keys():
            return False
        for name, v in st.items():
            w = other[name]
            if isinstance(v, torch.Tensor):
                if not (isinstance(w, torch.Tensor) and v.dtype == w.dtype and torch.equal(v, w)):
                    return False
            elif v != w:
                return False
    return True


def broadcast_opt_state(ck: Checker, r: int, n: int) -> None:
    root = n - 1
    # SGD with momentum: every rank has trained differently, with its own lr
    m = make_model(seed=1)
    opt = torch.optim.SGD(m.parameters(), lr=0.01 * (r + 1), momentum=0.9, weight_decay=1e-4)
    _train_a_bit(m, opt, steps=r + 1, extra=r)
    want = bps.broadcast_object(copy.deepcopy(opt.state_dict()), root_rank=root, name="sgdref")
    bps.broadcast_optimizer_state(opt, root_rank=root, prefix="bos.sgd.")
    ck.check(_state_equal(opt.state_dict(), want), "broadcast_optimizer_state SGD momentum")
    ck.check(opt.param_groups[0]["lr"] == 0.01 * n, "lr option broadcast")
    # Adam: only rank 0 has trained; the others start empty (state initialised by a base step)
    m = make_model(seed=2)
    before = copy.deepcopy(m.state_dict())
    opt = torch.optim.Adam(m.parameters(), lr=1e-3 * (r + 1), betas=(0.8 + 0.01 * r, 0.99))
    if r == 0:
        _train_a_bit(m, opt, steps=3, extra=7)
    want = bps.broadcast_object(copy.deepcopy(opt.state_dict()), root_rank=0, name="adamref")
    bps.broadcast_optimizer_state(opt, root_rank=0, prefix="bos.adam.")
    ck.check(_state_equal(opt.state_dict(), want), "broadcast_optimizer_state Adam")
    ck.check(opt.param_groups[0]["betas"] == (0.8, 0.99), "betas tuple broadcast")
    if r != 0:
        ck.check(all(torch.equal(v, before[k]) for k, v in m.state_dict().items()),
                 "state initialisation changed the parameters")
        ck.check(all(p.grad is None for p in m.parameters()), "grads not restored")
    # a fresh DistributedOptimizer: initialising its state must not be a collective step
    m = make_model(seed=3)
    dopt = bps.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=1e-3 * (r + 1)),
                                    named_parameters=named("bos.d.", m))
    bps.broadcast_optimizer_state(dopt, root_rank=0, prefix="bos.dopt.")
    ck.check(dopt.param_groups[0]["lr"] == 1e-3, "DistributedOptimizer lr broadcast")
    ck.check(len(dopt.state) == len(list(m.parameters())), "DistributedOptimizer state created")


# ------------------------------------------------------------------- DistributedOptimizer
def equivalence(ck: Checker, r: int, n: int, opt_name: str, steps: int = 5,
                compression=bps.Compression.none, tol=(1e-7, 1e-9)) -> None:
    tag = f"eq.{opt_name}.{compression.__name__}."
    m = make_model(seed=30 + r)  # different init on every rank ...
    bps.broadcast_parameters(m.state_dict(), root_rank=0, prefix=tag + "P.")  # ... until here
    ref = copy.deepcopy(m)

    def mk(params):
        if opt_name == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
        return torch.optim.Adam(params, lr=0.01)

    opt = bps.DistributedOptimizer(mk(m.parameters()), named_parameters=named(tag, m),
                                   compression=compression)
    ref_opt = mk(ref.parameters())
    for s in range(steps):
        x, y = batch(s, r)
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
        X, Y = full_batch(s, n)
        ref_opt.zero_grad()
        F.mse_loss(ref(X), Y).backward()
        ref_opt.step()
        diff = max((a - b).abs().max().item() for a, b in zip(m.parameters(), ref.parameters()))
        ck.check(close(m, ref, *tol),
                 f"{tag} step {s}: differs from the single-process reference (max {diff:.3g})")
    same_everywhere(ck, m, tag)


def passes_per_step(ck: Checker, r: int, n: int) -> None:
    m = make_model(seed=40)
    ref = copy.deepcopy(m)
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5),
                                   named_parameters=named("bpps.", m),
                                   backward_passes_per_step=2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.5)
    for s in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        for k in range(2):
            x, y = batch(s, r, extra=k + 1)
            F.mse_loss(m(x), y).backward()
            X, Y = full_batch(s, n, extra=k + 1)
            F.mse_loss(ref(X), Y).backward()
        opt.step()
        ref_opt.step()
        ck.check(close(m, ref), f"backward_passes_per_step=2 step {s}")
    same_everywhere(ck, m, "bpps")
    # a third backward pass before step() is an error (as Horovod)
    opt.zero_grad()
    raised = False
    try:
        for k in range(3):
            x, y = batch(9, r, extra=k)
            F.mse_loss(m(x), y).backward()
    except UsageError as e:  # a byteps.errors.BytePSError, and still a RuntimeError
        raised = "backward_passes_per_step" in str(e)
    ck.check(raised, "3 backward passes with backward_passes_per_step=2 did not raise")
    opt.synchronize()  # drain what was started
    with opt.skip_synchronize():
        opt.zero_grad()


def skip_sync(ck: Checker, r: int, n: int) -> None:
    m = make_model(seed=50)
    ref = copy.deepcopy(m)
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=named("skip.", m))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(3):
        x, y = batch(s, r, extra=5)
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
        X, Y = full_batch(s, n, extra=5)
        ref_opt.zero_grad()
        F.mse_loss(ref(X), Y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
        ck.check(close(m, ref), f"skip_synchronize step {s}")
    # step() after synchronize() without skip_synchronize warns (and reduces again)
    x, y = batch(7, r, extra=5)
    opt.zero_grad()
    F.mse_loss(m(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
    ck.check(any("skip_synchronize" in str(x.message) for x in w), "no warning on double sync")
    # zero_grad() between backward() and step() is an error
    F.mse_loss(m(x), y).backward()
    try:
        opt.zero_grad()
        ck.check(False, "zero_grad during reduction did not raise")
    except RuntimeError:
        ck.check(True, "")
    opt.synchronize()
    same_everywhere(ck, m, "skip")


class TwoBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(60)
        self.a = torch.nn.Linear(D_IN, D_OUT).double()
        self.b = torch.nn.Linear(D_IN, D_OUT).double()
        self.frozen = torch.nn.Linear(D_IN, D_OUT).double().requires_grad_(False)

    def forward(self, x, use_b: bool):
        out = self.a(x) + 0 * self.frozen(x)
        return out + self.b(x) if use_b else out


def unused_param(ck: Checker, r: int, n: int) -> None:
    """Branch b is used only on rank 0: the others contribute zeros and nobody deadlocks."""
    m = TwoBranch()
    ref = copy.deepcopy(m)
    opt = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=named("unused.", m))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(2):
        x, y = batch(s, r, extra=6)
        opt.zero_grad()
        F.mse_loss(m(x, use_b=(r == 0)), y).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(F.mse_loss(ref(batch(s, q, 6)[0], use_b=(q == 0)), batch(s, q, 6)[1])
                   for q in range(n)) / n
        loss.backward()
        ref_opt.step()
        ck.check(close(m, ref), f"unused parameter step {s}")
        ck.check(m.frozen.weight.grad is None, "frozen parameter got a gradient")
    same_everywhere(ck, m, "unused")


def two_models(ck: Checker, r: int, n: int) -> None:
    """GAN-like: two models whose parameter names coincide ("0.weight"...) with different
    shapes, broadcast and optimised with the default names one after the other."""
    torch.manual_seed(70 + r)
    g = torch.nn.Sequential(torch.nn.Linear(D_IN, 5), torch.nn.Tanh(), torch.nn.Linear(5, D_IN))
    d = torch.nn.Sequential(torch.nn.Linear(D_IN, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1))
    bps.broadcast_parameters(g.state_dict(), root_rank=0)
    bps.broadcast_parameters(d.state_dict(), root_rank=0)
    g_opt = bps.DistributedOptimizer(torch.optim.Adam(g.parameters(), lr=0.01),
                                     named_parameters=g.named_parameters())
    d_opt = bps.DistributedOptimizer(torch.optim.SGD(d.parameters(), lr=0.1, momentum=0.9),
                                     named_parameters=d.named_parameters())
    bps.broadcast_optimizer_state(g_opt, root_rank=0)
    bps.broadcast_optimizer_state(d_opt, root_rank=0)
    g_ref, d_ref = copy.deepcopy(g), copy.deepcopy(d)
    g_ref_opt = torch.optim.Adam(g_ref.parameters(), lr=0.01)
    d_ref_opt = torch.optim.SGD(d_ref.parameters(), lr=0.1, momentum=0.9)
    # the broadcast created the optimizer state (Adam's step is 1 now): start alike
    g_ref_opt.load_state_dict(copy.deepcopy(g_opt.state_dict()))
    d_ref_opt.load_state_dict(copy.deepcopy(d_opt.state_dict()))
    for s in range(2):
        x, _ = batch(s, r, extra=8)
        X, _ = full_batch(s, n, extra=8)
        for model, opt, ref, ref_opt in ((g, g_opt, g_ref, g_ref_opt),
                                         (d, d_opt, d_ref, d_ref_opt)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            ref_opt.zero_grad()
            ref(X).pow(2).mean().backward()
            ref_opt.step()
            ck.check(close(model, ref), f"two models step {s}")
    same_everywhere(ck, g, "two models g")
    same_everywhere(ck, d, "two models d")


def main() -> None:
    bps.init()
    r, n = bps.rank(), bps.size()
    torch.set_default_dtype(torch.float64)
    ck = Checker("TORCH_OPTIM")
    ck.run("broadcast_params", broadcast_params, ck, r, n)
    ck.run("broadcast_objects", broadcast_objects, ck, r, n)
    ck.run("broadcast_opt_state", broadcast_opt_state, ck, r, n)
    ck.run("equivalence sgd", equivalence, ck, r, n, "sgd")
    ck.run("equivalence adam", equivalence, ck, r, n, "adam")
    ck.run("equivalence fp16", equivalence, ck, r, n, "sgd", 3, bps.Compression.fp16,
           (1e-2, 1e-3))
    ck.run("passes_per_step", passes_per_step, ck, r, n)
    ck.run("skip_sync", skip_sync, ck, r, n)
    ck.run("unused_param", unused_param, ck, r, n)
    ck.run("two_models", two_models, ck, r, n)
    ck.finish()
    bps.shutdown()


if __name__ == "__main__":
    main()
