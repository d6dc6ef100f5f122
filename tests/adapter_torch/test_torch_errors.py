"""byteps.torch with bad arguments, through the real core (a single-process job in this
process): every exception is a ``byteps.BytePSError``, and ``except ValueError`` /
``except TypeError`` / ``except RuntimeError`` still catch it where they did before.
The optimizer's usage errors need gradient hooks (size > 1): they run over the fake core."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

from error_checks import check_raises, single_process_job  # noqa: E402

import byteps.torch as bps  # noqa: E402
from byteps.errors import NotInitializedError, UsageError  # noqa: E402

_check = check_raises


@pytest.fixture(scope="module")
def job():
    """A 1-worker job in this process with a clean BYTEPS_*/DMLC_* environment."""
    with single_process_job(bps.shutdown):
        yield


def test_before_init(job):
    bps.shutdown()
    t = torch.ones(2)
    model = torch.nn.Linear(2, 2)
    for fn in (bps.size, bps.rank, bps.local_size, bps.local_rank,
               lambda: bps.declare("t.x"),
               lambda: bps.push_pull_async(t, name="t.x"),
               lambda: bps.push_pull(t, name="t.x"),
               lambda: bps.broadcast_parameters({"a": t}, 0),
               lambda: bps.broadcast_object(1, 0),
               lambda: bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))):
        assert isinstance(_check(fn, RuntimeError), NotInitializedError)


def _model():
    return torch.nn.Linear(2, 2)


def _sgd(model=None):
    return torch.optim.SGD((model or _model()).parameters(), lr=0.1)


def _distributed():
    return bps.DistributedOptimizer(_sgd())


T = torch.ones(2)

CASES = [
    # tensors
    ("not-a-tensor", lambda: bps.push_pull_async([1.0, 2.0], name="t.a"), TypeError),
    ("numpy", lambda: bps.push_pull_async(T.numpy(), name="t.a"), TypeError),
    ("bool", lambda: bps.push_pull_async(torch.ones(2, dtype=torch.bool), name="t.a"),
     TypeError),
    ("int16", lambda: bps.push_pull_inplace(torch.ones(2, dtype=torch.int16), name="t.a"),
     TypeError),
    ("complex", lambda: bps.push_pull(torch.ones(2, dtype=torch.complex64), name="t.a"),
     TypeError),
    ("sparse", lambda: bps.push_pull_async(torch.ones(2).to_sparse(), name="t.a"), TypeError),
    ("not-cpu", lambda: bps.push_pull_async(torch.empty(2, device="meta"), name="t.a"),
     TypeError),
    ("push_pull-list-fp16", lambda: bps.push_pull([1.0], name="t.a",
                                                  compression=bps.Compression.fp16), TypeError),
    ("expanded-inplace", lambda: bps.push_pull_inplace(torch.ones(1).expand(3), name="t.e"),
     ValueError),
    # names, priorities, versions, handles
    ("name-int", lambda: bps.push_pull_async(T, name=5), TypeError),
    ("name-empty", lambda: bps.push_pull_async(T, name=""), ValueError),
    ("priority-str", lambda: bps.push_pull_async(T, name="t.p", priority="high"), TypeError),
    ("priority-float", lambda: bps.push_pull_async(T, name="t.p", priority=1.5), TypeError),
    ("version-str", lambda: bps.push_pull_async(T, name="t.v", version="1"), TypeError),
    ("declare-int", lambda: bps.declare(7), TypeError),
    ("declare-empty", lambda: bps.declare(""), ValueError),
    ("poll-unknown", lambda: bps.poll(987654), ValueError),
    ("synchronize-unknown", lambda: bps.synchronize(987654), ValueError),
    # broadcast
    ("broadcast-one-tensor", lambda: bps.broadcast_parameters(T, 0), ValueError),
    ("broadcast-not-iterable", lambda: bps.broadcast_parameters(5, 0), ValueError),
    ("broadcast-value-str", lambda: bps.broadcast_parameters({"a": "x"}, 0), TypeError),
    ("broadcast-root-too-big", lambda: bps.broadcast_parameters({"a": T}, 1), ValueError),
    ("broadcast-root-negative", lambda: bps.broadcast_parameters({"a": T}, -1), ValueError),
    ("broadcast-root-str", lambda: bps.broadcast_parameters({"a": T}, "0"), ValueError),
    ("broadcast-root-bool", lambda: bps.broadcast_parameters({"a": T}, False), ValueError),
    ("broadcast_object-root", lambda: bps.broadcast_object(1, root_rank=2), ValueError),
    ("optimizer-state-not-optimizer", lambda: bps.broadcast_optimizer_state("sgd", 0),
     TypeError),
    ("optimizer-state-lbfgs", lambda: bps.broadcast_optimizer_state(
        torch.optim.LBFGS(_model().parameters()), 0), ValueError),
    ("optimizer-state-root", lambda: bps.broadcast_optimizer_state(_sgd(), 3), ValueError),
    # DistributedOptimizer
    ("optimizer-not-optimizer", lambda: bps.DistributedOptimizer("sgd"), TypeError),
    ("optimizer-compression", lambda: bps.DistributedOptimizer(_sgd(), compression=object()),
     TypeError),
    ("optimizer-named-not-tuples", lambda: bps.DistributedOptimizer(
        _sgd(), named_parameters=[1, 2]), ValueError),
    ("optimizer-named-int", lambda: bps.DistributedOptimizer(_sgd(), named_parameters=5),
     ValueError),
    ("optimizer-bpps-zero", lambda: bps.DistributedOptimizer(
        _sgd(), backward_passes_per_step=0), ValueError),
    ("optimizer-twice", lambda: bps.DistributedOptimizer(_distributed()), ValueError),
    ("optimizer-set-bpps", lambda: _distributed().set_backward_passes_per_step(0), ValueError),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_arguments(job, case):
    _, fn, flavour = case
    bps.init()
    _check(fn, flavour)
    assert bps.ops._in_flight() == 0  # nothing left half-started
    assert torch.equal(bps.push_pull(torch.ones(3), name="t.after", average=False),
                       torch.ones(3))  # the job still works


def test_duplicate_parameter_names(job):
    bps.init()
    m = _model()
    err = _check(lambda: bps.DistributedOptimizer(
        _sgd(m), named_parameters=[("w", m.weight), ("w", m.bias)]), ValueError)
    assert "unique" in str(err)


# --------------------------------------------------------------------------- usage errors
def _two_rank_optimizer(fake_bps, backward_passes_per_step=1):
    """A DistributedOptimizer over the fake core that believes size() == 2, so its gradient
    hooks are registered (the fake push_pull copies, so the 'sum' is the local gradient)."""
    fake_bps.init()
    sys.modules["byteps.torch.ops"].size = lambda: 2
    model = _model()
    opt = fake_bps.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters(),
                                        backward_passes_per_step=backward_passes_per_step)
    return model, opt


def test_zero_grad_while_reducing_is_a_usage_error(fake_bps):
    model, opt = _two_rank_optimizer(fake_bps)
    model(torch.ones(1, 2)).sum().backward()
    err = _check(opt.zero_grad, RuntimeError)
    assert isinstance(err, UsageError) and "zero_grad" in str(err)
    opt.step()
    opt.zero_grad()  # fine after step()


def test_too_many_backward_passes_is_a_usage_error(fake_bps):
    model, opt = _two_rank_optimizer(fake_bps)
    model(torch.ones(1, 2)).sum().backward()
    err = _check(lambda: model(torch.ones(1, 2)).sum().backward(), RuntimeError)
    assert isinstance(err, UsageError) and "backward_passes_per_step" in str(err)
    opt.synchronize()
