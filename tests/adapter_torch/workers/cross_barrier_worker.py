"""CrossBarrier on every rank of a real job (tests/adapter_torch/test_torch_cross_barrier.py).

Default: for SGD (momentum, nesterov, weight decay), Adam, RMSprop, SGD with
``backward_passes_per_step=2`` and SGD with fp16 compression, train a small model for a few
steps with ``byteps.torch.cross_barrier.CrossBarrier`` (imported as upstream's example does:
``import byteps.torch.cross_barrier as bps``) and compare the parameters after the last step
with single-process training on the average of every rank's gradient (each rank computes the
reference itself from every rank's data). Prints ``TORCH_XBAR_OK``.

``--mismatch``: one parameter has another shape on rank 1, so its reduction fails in the
background thread with ``MismatchError``; the training thread must raise it (not hang), the
thread must end, and the job must still work. Prints ``TORCH_XBAR_MISMATCH_OK``.
"""

from __future__ import annotations

import argparse
import sys
import threading

import torch
from _common import Checker

import byteps.torch.cross_barrier as bps
from byteps.errors import MismatchError
from byteps.torch.broadcast import _init_optimizer_state

STEPS = 5


class Net(torch.nn.Module):
    def __init__(self, shift_shape=(4,)):
        super().__init__()
        self.shift = torch.nn.Parameter(torch.zeros(shift_shape))  # used first: reduced last
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x + self.shift))


def make_model(shift_shape=(4,)) -> Net:
    torch.manual_seed(1234)
    return Net(shift_shape).double()


def batch(r, step, micro):
    g = torch.Generator().manual_seed(100000 * r + 100 * step + micro)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    y = torch.randn(6, 3, generator=g, dtype=torch.float64)
    return x, y


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


CASES = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                       weight_decay=0.01), 1, bps.Compression.none, 1e-9),
    "adam": (lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, amsgrad=True), 1,
             bps.Compression.none, 1e-9),
    "rmsprop": (lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True), 1,
                bps.Compression.none, 1e-9),
    "sgd-bpps2": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1), 2,
                  bps.Compression.none, 1e-9),
    "sgd-fp16": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), 1,
                 bps.Compression.fp16, 2e-3),
}


def reference(case: str, n: int) -> Net:
    """Single-process training on the average (over ``n`` ranks) of the gradients."""
    make_opt, passes, compression, _ = CASES[case]
    model = make_model()
    opt = make_opt(model.parameters())
    _init_optimizer_state(opt)  # as broadcast_optimizer_state did for the distributed one
    params = list(model.parameters())
    for s in range(STEPS):
        total = [torch.zeros_like(p) for p in params]
        for r in range(n):
            opt.zero_grad()
            for m in range(passes):
                loss_of(model, *batch(r, s, m)).backward()
            for t, p in zip(total, params):
                g = p.grad
                if compression is bps.Compression.fp16:
                    g = g.half().double()
                t.add_(g)
        for t, p in zip(total, params):
            p.grad = t / n
        opt.step()
    return model


def train(ck: Checker, case: str) -> None:
    r, n = bps.rank(), bps.size()
    make_opt, passes, compression, tol = CASES[case]
    model = make_model()
    opt = bps.CrossBarrier(model, make_opt(model.parameters()),
                           named_parameters=model.named_parameters(), compression=compression,
                           backward_passes_per_step=passes, num_steps=STEPS)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(opt, root_rank=0)
    ck.check(opt._xb_thread is not None and opt._xb_thread.is_alive(),
             f"{case}: no background thread")
    for s in range(STEPS):
        opt.zero_grad()
        for m in range(passes):
            loss_of(model, *batch(r, s, m)).backward()
        opt.step()
    ck.check(opt._xb_thread is None and not opt._xb_running,
             f"{case}: the background thread is still running after num_steps")
    ref = reference(case, n)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        err = float((p - q).abs().max())
        ck.check(torch.allclose(p, q, rtol=tol, atol=tol),
                 f"{case}: {name} differs from synchronous training by {err:.3g}")
    ck.check(bps.ops._in_flight() == 0, f"{case}: operations left in flight")


def mismatch(ck: Checker) -> None:
    r = bps.rank()
    model = make_model((4,) if r == 0 else (1,))
    opt = bps.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           named_parameters=model.named_parameters(), num_steps=STEPS)
    raised = None
    try:
        for s in range(STEPS):
            opt.zero_grad()
            loss_of(model, *batch(r, s, 0)).backward()
            opt.step()
    except MismatchError as e:
        raised = e
    ck.check(raised is not None, "no MismatchError in the training thread")
    if raised is not None:
        print(f"rank {r}: raised {type(raised).__name__}: {raised}", flush=True)
    try:
        opt.close()
        ck.check(False, "close() after the failure did not raise")
    except MismatchError:
        pass
    ck.check(not any(t.name.startswith("byteps-cross-barrier") for t in threading.enumerate()),
             "the background thread is still running")
    ck.check(bps.ops._in_flight() == 0, "operations left in flight")
    out = bps.push_pull(torch.ones(3), average=False, name="xbar.after")  # re-exported
    ck.check(bool((out == bps.size()).all()), f"push_pull after the failure gave {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mismatch", action="store_true")
    args = ap.parse_args()
    bps.init()
    torch.set_num_threads(1)
    if args.mismatch:
        ck = Checker("TORCH_XBAR_MISMATCH")
        ck.run("mismatch", mismatch, ck)
    else:
        ck = Checker("TORCH_XBAR")
        for case in CASES:
            ck.run(case, train, ck, case)
    ck.finish()
    bps.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
