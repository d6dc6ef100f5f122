"""byteps.torch.DistributedOptimizer's ``compression_params`` over the fake core (conftest):
what is declared, when the learning rate reaches the core, fp16, the momentum moved out of the
optimizer, and bad dicts. The real two-level compression runs in test_torch_multiprocess.py."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

from byteps.errors import InvalidArgumentError, InvalidTypeError  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))


def _named(model, tag):
    """Names of this test only (the adapter's name registry is process-wide: a name keeps its
    first dtype and shape)."""
    return [(f"compress.{tag}.{n}", p) for n, p in model.named_parameters()]


def _loss(model, step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 4, generator=g)
    return (model(x) ** 2).mean()


def test_declares_every_gradient_with_the_kwargs(fake_bps):
    fake_bps.init()
    model = _model().double()
    fake_bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=_named(model, "decl"),
        compression_params={"compressor": "topk", "k": 2, "ef": "vanilla"})
    comp = fake_bps._fake.state["compression"]
    want = {"compressor_type": "topk", "compressor_k": "2", "ef_type": "vanilla"}
    assert comp == {f"Gradient.compress.decl.{n}": want
                    for n, _ in model.named_parameters()}
    # declared in sorted name order, before any push_pull
    keys = fake_bps._fake.state["keys"]
    assert list(keys) == sorted(keys) and not fake_bps._fake.state["calls"]


def test_no_params_declares_plainly(fake_bps):
    fake_bps.init()
    model = _model()
    for params in (None, {}, {"fp16": False}):
        fake_bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=[(f"{params}.{n}", p) for n, p in
                                                        model.named_parameters()],
                                      compression_params=params)
    assert fake_bps._fake.state["compression"] == {}


def test_fp16_selects_the_cast(fake_bps):
    fake_bps.init()
    model = _model()
    opt = fake_bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=_named(model, "fp16a"),
        compression_params={"fp16": True, "compressor": "onebit"})
    assert opt._compression is fake_bps.Compression.fp16
    opt = fake_bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=_named(model, "fp16b"),
        compression=fake_bps.Compression.fp16, compression_params={"fp16": True})
    assert opt._compression is fake_bps.Compression.fp16

    class Custom(fake_bps.Compressor):
        pass

    with pytest.raises(InvalidArgumentError, match="fp16"):
        fake_bps.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=_named(model, "fp16c"), compression=Custom,
            compression_params={"fp16": True})


def test_learning_rate_reaches_the_core_before_each_steps_first_push_pull(fake_bps):
    fake_bps.init()
    fake_bps._fake.state["size"] = 2  # hooks registered; the fake push_pull copies
    model = _model()
    opt = fake_bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=_named(model, "lr"),
        compression_params={"compressor": "onebit", "ef": "vanilla"})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    n = len(list(model.parameters()))
    for step in range(3):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
        sched.step()
    # one call per step, each before that step's n push_pulls
    assert fake_bps._fake.state["lr"] == [(0.5, 0), (0.25, n), (0.125, 2 * n)]


def test_no_learning_rate_without_compression(fake_bps):
    fake_bps.init()
    fake_bps._fake.state["size"] = 2
    model = _model()
    opt = fake_bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                        named_parameters=_named(model, "nolr"))
    _loss(model, 0).backward()
    opt.step()
    assert fake_bps._fake.state["lr"] == [] and fake_bps._fake.state["calls"]


def _train(opt, model, steps=4):
    for step in range(steps):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_nesterov_moves_the_momentum_out_of_the_optimizer(fake_bps):
    """Single process: the core compresses nothing, so the adapter applies the Nesterov
    momentum to every gradient; training equals torch's SGD(nesterov=True)."""
    fake_bps.init()
    ref_model = _model()
    want = _train(torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9,
                                  nesterov=True), ref_model)
    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(UserWarning, match="momentum 0.9 is set to 0"):
        opt = fake_bps.DistributedOptimizer(
            base, named_parameters=_named(model, "nag"),
            compression_params={"compressor": "onebit", "momentum": "nesterov"})
    assert all(g["momentum"] == 0 for g in opt.param_groups)
    kws = fake_bps._fake.state["compression"].values()
    assert kws and all(kw["momentum_mu"] == "0.9" for kw in kws)
    got = _train(opt, model)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_nesterov_mu_from_the_dict_wins(fake_bps):
    fake_bps.init()
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no momentum in the optimizer: no warning
        opt = fake_bps.DistributedOptimizer(
            torch.optim.Adam(model.parameters(), lr=0.1),
            named_parameters=_named(model, "mu"),
            compression_params={"compressor": "topk", "k": 1, "momentum": "nesterov",
                                "momentum_mu": 0.5})
    assert opt._bps_mu == 0.5
    kws = fake_bps._fake.state["compression"].values()
    assert kws and all(kw["momentum_mu"] == "0.5" for kw in kws)


BAD = [
    ({"compressor": "twobit"}, InvalidArgumentError, "twobit"),
    ({"compressor": "topk"}, InvalidArgumentError, "needs 'k'"),
    ({"compresor": "onebit"}, InvalidArgumentError, "unknown key"),
    ({"compressor": "onebit", "momentum": "nesterov"}, InvalidArgumentError, "needs mu"),
    ({"compressor": "onebit", "scaling": "yes"}, InvalidTypeError, "scaling"),
    ("onebit", InvalidTypeError, "dict"),
]


@pytest.mark.parametrize("params,exc,words", BAD, ids=[str(b[0]) for b in BAD])
def test_invalid_params_raise_at_construction(fake_bps, params, exc, words):
    fake_bps.init()
    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: mu must be in the dict
    with pytest.raises(exc, match=words):
        fake_bps.DistributedOptimizer(base, named_parameters=_named(model, "bad"),
                                      compression_params=params)
    assert not fake_bps._fake.state["keys"]


def test_momentum_groups_must_agree(fake_bps):
    fake_bps.init()
    model = _model()
    base = torch.optim.SGD([{"params": model[0].parameters(), "momentum": 0.9},
                            {"params": model[1].parameters(), "momentum": 0.5}], lr=0.1)
    with pytest.raises(InvalidArgumentError, match="different momenta"):
        fake_bps.DistributedOptimizer(base, named_parameters=_named(model, "groups"),
                                      compression_params={"compressor": "onebit",
                                                          "momentum": "nesterov"})
    assert [g["momentum"] for g in base.param_groups] == [0.9, 0.5]  # left as it was
