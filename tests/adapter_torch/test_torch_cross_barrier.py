"""``byteps.torch.cross_barrier.CrossBarrier``.

In this process, over the fake core of conftest.py made to report ``size() == 2`` (so the
hooks, forward pre-hooks and the background thread run; the fake push_pull copies, so the
"average" is the local gradient and training must equal plain local training): the
parameters after each step against the plain optimizer, ``backward_passes_per_step``, step 0,
zero_grad, ``num_steps`` ending the thread, injected failures surfacing as typed errors.

Real jobs (workers/cross_barrier_worker.py, 2 and 3 workers): the parameters after N steps
equal single-process training on the averaged gradient, for SGD with momentum, Adam and
RMSprop, with ``backward_passes_per_step=2`` and fp16 compression; and a reduction that fails
(ranks disagree on a shape) surfaces as ``MismatchError`` in the training thread.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

from error_checks import check_raises  # noqa: E402

from byteps.errors import InvalidArgumentError, PeerLostError, UsageError  # noqa: E402

WORKERS = Path(__file__).resolve().parent / "workers"


class _Net(torch.nn.Module):
    """Nested modules, a parameter owned by a non-leaf module, a module without parameters."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                        torch.nn.Linear(8, 8))
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x) * self.scale)


def _model(seed=0):
    torch.manual_seed(seed)
    return _Net().double()


def _batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(5, 4, generator=g, dtype=torch.float64)


def _loss(model, x):
    return (model(x) ** 2).mean()


OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1,
                                               weight_decay=0.01),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True,
                                              weight_decay=0.01),
}


@pytest.fixture
def xb(fake_bps):
    """``byteps.torch.cross_barrier`` over the fake core, with ``size() == 2``."""
    fake_bps.init()
    sys.modules["byteps.torch.ops"].size = lambda: 2
    import byteps.torch.cross_barrier as xb
    made = []
    real = xb.CrossBarrier

    def tracked(*args, **kwargs):
        opt = real(*args, **kwargs)
        made.append(opt)
        return opt

    xb.tracked = tracked
    yield xb
    for opt in made:  # no thread left behind, whatever the test did
        try:
            opt.close()
        except Exception:
            pass
        assert opt._xb_thread is None


def _train_plain(opt_name, steps, passes=1):
    model = _model()
    opt = OPTIMIZERS[opt_name](model.parameters())
    for s in range(steps):
        opt.zero_grad()
        for m in range(passes):
            _loss(model, _batch(s, m)).backward()
        opt.step()
    return model


def _train_xb(xb, opt_name, steps, passes=1, num_steps=10 ** 6, **kwargs):
    model = _model()
    opt = xb.tracked(model, OPTIMIZERS[opt_name](model.parameters()),
                     named_parameters=model.named_parameters(),
                     backward_passes_per_step=passes, num_steps=num_steps, **kwargs)
    for s in range(steps):
        opt.zero_grad()
        for m in range(passes):
            _loss(model, _batch(s, m)).backward()
        opt.step()
    return model, opt


def _assert_same(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-12), name


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_updates_equal_plain_training(xb, opt_name):
    ref = _train_plain(opt_name, 6)
    model, opt = _train_xb(xb, opt_name, 6)
    opt.synchronize()  # every update applied
    _assert_same(model, ref)
    assert opt._xb_running and opt._xb_thread.is_alive()
    assert all(float(p.grad.abs().sum()) == 0.0 for p in model.parameters())  # zeroed
    assert isinstance(opt, type(OPTIMIZERS[opt_name]([torch.zeros(1)])))
    opt.close()
    assert not opt._xb_running and opt._xb_thread is None


def test_backward_passes_per_step(xb):
    ref = _train_plain("sgd-momentum", 4, passes=2)
    model, opt = _train_xb(xb, "sgd-momentum", 4, passes=2)
    opt.synchronize()
    _assert_same(model, ref)
    # a third backward pass before step() is a usage error
    _loss(model, _batch(0)).backward()
    _loss(model, _batch(1)).backward()
    err = check_raises(lambda: _loss(model, _batch(2)).backward(), RuntimeError)
    assert isinstance(err, UsageError) and "backward_passes_per_step" in str(err)


def test_num_steps_ends_the_thread_then_synchronous(xb):
    ref = _train_plain("adam", 5)
    model, opt = _train_xb(xb, "adam", 3, num_steps=3)
    assert opt._xb_thread is None and not opt._xb_running  # closed by the 3rd step
    assert not any(t.name.startswith("byteps-cross-barrier") for t in threading.enumerate())
    for s in range(3, 5):  # from now on a synchronous DistributedOptimizer
        opt.zero_grad()
        _loss(model, _batch(s)).backward()
        opt.step()
    _assert_same(model, ref)


def test_step_zero_without_backward_is_a_plain_step(xb):
    model = _model()
    opt = xb.tracked(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # upstream's step 0: local, creates the momentum buffers
    for p, b in zip(model.parameters(), before):
        assert torch.allclose(p, b - 0.1)
        assert "momentum_buffer" in opt.state[p]
    assert opt._xb_steps == 0
    opt.zero_grad()  # still a real zero_grad before training
    assert all(p.grad is None for p in model.parameters())


def test_lr_change_and_state_dict(xb):
    model, opt = _train_xb(xb, "sgd-momentum", 2)
    for g in opt.param_groups:
        g["lr"] = 0.01
    ref = _model()
    ref_opt = OPTIMIZERS["sgd-momentum"](ref.parameters())
    for s in range(2):
        ref_opt.zero_grad()
        _loss(ref, _batch(s)).backward()
        ref_opt.step()
    for g in ref_opt.param_groups:
        g["lr"] = 0.01
    for s in range(2, 4):
        opt.zero_grad()
        _loss(model, _batch(s)).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(ref, _batch(s)).backward()
        ref_opt.step()
    state = opt.state_dict()  # waits for the updates in flight
    _assert_same(model, ref)
    ref_state = ref_opt.state_dict()
    for k, v in ref_state["state"].items():
        assert torch.allclose(state["state"][k]["momentum_buffer"], v["momentum_buffer"])


def test_forward_waits_for_slow_reductions(xb, monkeypatch):
    """The fake reductions of the first layer take 50 ms: the next forward pass must wait for
    that layer's update (a forward without waiting would use the old weights)."""
    fake = xb.ops._b
    real_wait = fake.wait

    def slow_wait(h, timeout=None):
        if "body.0" in fake.state["inflight"].get(h, ""):
            time.sleep(0.05)
        return real_wait(h, timeout)

    monkeypatch.setattr(fake, "wait", slow_wait)
    ref = _train_plain("rmsprop", 4)
    model, opt = _train_xb(xb, "rmsprop", 4)
    opt.synchronize()
    _assert_same(model, ref)


def test_compression_params_nesterov(xb):
    """The core compresses nothing here, so the adapter applies the Nesterov momentum of
    ``compression_params`` to each gradient after its reduction, in the background thread:
    training equals torch's SGD(nesterov=True)."""
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    model = _model()
    with pytest.warns(UserWarning, match="momentum 0.9 is set to 0"):
        opt = xb.tracked(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                         named_parameters=model.named_parameters(),
                         compression_params={"compressor": "onebit", "momentum": "nesterov"})
    assert opt._bps_nag and xb.ops._b.state["compression"]
    for s in range(4):
        for o, m in ((ref_opt, ref), (opt, model)):
            o.zero_grad()
            _loss(m, _batch(s)).backward()
            o.step()
    opt.synchronize()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_unsupported_optimizer(xb):
    model = _model()
    for opt in (torch.optim.Adagrad(model.parameters()), torch.optim.LBFGS(model.parameters())):
        err = check_raises(lambda o=opt: xb.CrossBarrier(model, o), ValueError)
        assert isinstance(err, InvalidArgumentError) and "SGD" in str(err)

    class MySGD(torch.optim.SGD):
        pass

    check_raises(lambda: xb.CrossBarrier(model, MySGD(model.parameters(), lr=0.1)), ValueError)
    check_raises(lambda: xb.CrossBarrier("model", torch.optim.SGD(model.parameters(), lr=0.1)),
                 TypeError)
    check_raises(lambda: xb.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                         num_steps=0), ValueError)


def test_failed_reduction_surfaces_in_the_training_thread(xb, monkeypatch):
    fake = xb.ops._b
    real_wait = fake.wait

    def failing_wait(h, timeout=None):
        name = fake.state["inflight"].get(h, "")
        real_wait(h, timeout)
        if "head" in name:
            raise PeerLostError("fake: server 0 lost")

    model, opt = _train_xb(xb, "sgd-momentum", 1)
    opt.synchronize()
    monkeypatch.setattr(fake, "wait", failing_wait)
    try:  # the head's reduction fails in the background: a later hook may already see it
        _loss(model, _batch(1)).backward()
    except PeerLostError:
        pass
    thread = opt._xb_thread
    thread.join(timeout=10)
    assert not thread.is_alive()  # the background thread ended after the failure
    # the next forward pass (its pre-hook), step() and close() all raise the typed error
    err = check_raises(lambda: model(_batch(2)), ConnectionError)
    assert isinstance(err, PeerLostError) and "server 0 lost" in str(err)
    check_raises(opt.step, ConnectionError)
    check_raises(lambda: _loss(model, _batch(2)), ConnectionError)
    check_raises(opt.close, ConnectionError)
    assert xb.ops._in_flight() == 0


def test_parameter_outside_the_model_is_waited_for_in_step(xb):
    """A parameter of the optimizer that no module of `model` owns has no pre-hook: step()
    waits for its update."""
    def run(make):
        model = _model()
        extra = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        opt = make(model, torch.optim.SGD([*model.parameters(), extra], lr=0.1, momentum=0.9))
        for s in range(3):
            opt.zero_grad()
            (_loss(model, _batch(s)) + (extra * extra).sum()).backward()
            opt.step()
        return extra, opt

    want, _ = run(lambda model, opt: opt)
    got, opt = run(xb.tracked)
    assert opt._xb_unguarded == [got]
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)  # no synchronize() needed


def test_thread_ends_after_shutdown(xb):
    _, opt = _train_xb(xb, "sgd-momentum", 1)
    opt.synchronize()
    thread = opt._xb_thread
    xb.ops._b.shutdown()
    thread.join(timeout=3 * xb._IDLE_CHECK_S + 2)
    assert not thread.is_alive()


def test_single_worker_is_plain_training(fake_bps):
    fake_bps.init()
    import byteps.torch.cross_barrier as xb
    xb.tracked = xb.CrossBarrier
    ref = _train_plain("adam", 3)
    model, opt = _train_xb(xb, "adam", 3)
    assert opt._xb_thread is None and not opt._xb_pre_hooks
    _assert_same(model, ref)


# ------------------------------------------------------------------------- real jobs
@pytest.fixture(scope="module")
def launch():
    pytest.importorskip("byteps._core", reason="the byteps core is not built")
    from jobs import PY, framework_env, launch_config, launch_job

    def run(workers, args=(), timeout=180):
        return launch_job(launch_config(workers, 1, None),
                          [PY, str(WORKERS / "cross_barrier_worker.py"), *args],
                          timeout=timeout, job_env=framework_env())
    return run


@pytest.mark.parametrize("workers", [2, 3])
def test_job_matches_synchronous_training(launch, workers):
    from jobs import assert_marker
    job = launch(workers)
    assert_marker(job, "TORCH_XBAR_OK", workers)


def test_job_failure_is_an_error_not_a_hang(launch):
    from jobs import assert_marker
    job = launch(2, ["--mismatch"])
    assert_marker(job, "TORCH_XBAR_MISMATCH_OK", 2)
