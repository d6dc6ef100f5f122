"""Unit tests of byteps.torch logic that needs no running job: compression, argument
validation, naming, handle bookkeeping (over a fake single-process core, see conftest)."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


# --------------------------------------------------------------------------- compression
def test_none_compressor_is_identity(fake_bps):
    t = torch.randn(5)
    c, ctx = fake_bps.Compression.none.compress(t)
    assert c is t and ctx is None
    assert fake_bps.Compression.none.decompress(c, ctx) is t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp16_compressor_roundtrip(fake_bps, dtype):
    t = torch.arange(-8, 8, dtype=dtype) / 4
    c, ctx = fake_bps.Compression.fp16.compress(t)
    assert c.dtype == torch.float16 and ctx == dtype
    d = fake_bps.Compression.fp16.decompress(c, ctx)
    assert d.dtype == dtype
    torch.testing.assert_close(d, t)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float16])
def test_fp16_compressor_passthrough(fake_bps, dtype):
    t = torch.arange(6).to(dtype)
    c, ctx = fake_bps.Compression.fp16.compress(t)
    assert c is t
    assert fake_bps.Compression.fp16.decompress(c, ctx) is t


def test_fp16_compressor_is_differentiable(fake_bps):
    x = torch.ones(3, requires_grad=True)
    c, ctx = fake_bps.Compression.fp16.compress(x)
    fake_bps.Compression.fp16.decompress(c, ctx).sum().backward()
    assert torch.equal(x.grad, torch.ones(3))


def test_compressor_interface_raises(fake_bps):
    with pytest.raises(NotImplementedError):
        fake_bps.Compressor.compress(torch.zeros(1))
    with pytest.raises(NotImplementedError):
        fake_bps.Compressor.decompress(torch.zeros(1), None)


# --------------------------------------------------------------------------- exports
def test_exports(fake_bps):
    for name in ["init", "shutdown", "size", "rank", "local_size", "local_rank", "push_pull",
                 "push_pull_async", "push_pull_async_inplace", "push_pull_inplace",
                 "byteps_push_pull", "poll", "synchronize", "declare", "Compression",
                 "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
                 "broadcast_object", "_DistributedOptimizer"]:
        assert hasattr(fake_bps, name), name
    assert fake_bps.byteps_push_pull is fake_bps.push_pull_async_inplace
    from byteps.torch import ops
    assert ops.push_pull_inplace is fake_bps.push_pull_inplace


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("dtype", [torch.bool, torch.int16, torch.complex64])
def test_unsupported_dtype(fake_bps, dtype):
    fake_bps.init()
    t = torch.zeros(4, dtype=dtype)
    for fn in (fake_bps.push_pull_async, fake_bps.push_pull_async_inplace, fake_bps.push_pull):
        with pytest.raises(TypeError) as e:
            fn(t, name="x")
        msg = str(e.value)
        assert "torch.float32" in msg and "torch.bfloat16" in msg and "torch.int8" in msg


def test_not_a_tensor(fake_bps):
    fake_bps.init()
    with pytest.raises(TypeError):
        fake_bps.push_pull_async([1.0, 2.0], name="x")


def test_not_initialized(fake_bps):
    from byteps.errors import NotInitializedError
    with pytest.raises(NotInitializedError):
        fake_bps.size()
    with pytest.raises(NotInitializedError):
        fake_bps.push_pull(torch.ones(2), name="a")
    with pytest.raises(NotInitializedError):
        fake_bps.declare("a")


def test_bad_names(fake_bps):
    fake_bps.init()
    with pytest.raises(ValueError):
        fake_bps.push_pull_async(torch.ones(2), name="")
    with pytest.raises(TypeError):
        fake_bps.push_pull_async(torch.ones(2), name=3)
    with pytest.raises(TypeError):
        fake_bps.declare(3)


def test_unknown_handle(fake_bps):
    fake_bps.init()
    with pytest.raises(ValueError):
        fake_bps.synchronize(12345)
    with pytest.raises(ValueError):
        fake_bps.poll(12345)
    h = fake_bps.push_pull_async(torch.ones(2), name="once")
    fake_bps.synchronize(h)
    with pytest.raises(ValueError):
        fake_bps.synchronize(h)


# --------------------------------------------------------------------------- bookkeeping
def test_unique_names_for_unnamed(fake_bps):
    fake_bps.init()
    calls = fake_bps._fake.state["calls"]
    fake_bps.push_pull(torch.ones(3))
    fake_bps.push_pull(torch.ones(5))
    names = [c["name"] for c in calls]
    assert len(set(names)) == 2


def test_out_of_place_and_inplace(fake_bps):
    fake_bps.init()
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    h = fake_bps.push_pull_async(x, average=False, name="oop")
    y = fake_bps.synchronize(h)
    assert y is not x and torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    call = fake_bps._fake.state["calls"][-1]
    assert call["shape"] == [3, 4] and call["dtype"] == "float32" and call["nbytes"] == 48
    assert call["average"] is False and not call["inplace"]
    h = fake_bps.push_pull_async_inplace(x, name="ip")
    assert fake_bps.synchronize(h) is x
    assert fake_bps._fake.state["calls"][-1]["inplace"]
    assert fake_bps.push_pull_inplace(x, name="ip") is x


def test_non_contiguous_inplace_writes_back(fake_bps, monkeypatch):
    fake_bps.init()
    fake = fake_bps._fake
    orig = fake.push_pull_async

    def doubling(name, inp, out, nbytes, dtype, shape, average, priority=None, version=0,
                 op="sum", process_set=None):
        h = orig(name, inp, out, nbytes, dtype, shape, average, priority, version, op)
        # simulate a 2-rank sum of identical inputs: the core writes 2*x into the buffer
        n = nbytes // 4
        buf = (ctypes.c_float * n).from_address(out)
        for i in range(n):
            buf[i] *= 2
        return h

    monkeypatch.setattr(fake, "push_pull_async", doubling)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    h = fake_bps.push_pull_async_inplace(view, name="nc")
    out = fake_bps.synchronize(h)
    assert out is view
    assert torch.equal(base, 2 * torch.arange(12, dtype=torch.float32).reshape(3, 4))
    # out of place: input untouched, output contiguous
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    res = fake_bps.synchronize(fake_bps.push_pull_async(src, name="nc2"))
    assert res.is_contiguous() and torch.equal(res, 2 * src)
    assert torch.equal(src, torch.arange(12, dtype=torch.float32).reshape(3, 4).t())


def test_priority_mapping(fake_bps):
    fake_bps.init()
    fake_bps.synchronize(fake_bps.push_pull_async(torch.ones(1), name="p0"))
    assert fake_bps._fake.state["calls"][-1]["priority"] is None
    fake_bps.synchronize(fake_bps.push_pull_async(torch.ones(1), name="p1", priority=5))
    assert fake_bps._fake.state["calls"][-1]["priority"] == 5


def test_empty_and_scalar(fake_bps):
    fake_bps.init()
    e = torch.zeros(0)
    assert fake_bps.push_pull(e, name="e").shape == (0,)
    s = torch.tensor(3.0)
    r = fake_bps.push_pull(s, name="s", average=False)
    assert r.shape == () and r.item() == 3.0


def test_poll_then_synchronize(fake_bps):
    fake_bps.init()
    fake_bps._fake.state["polls_false"] = 2
    h = fake_bps.push_pull_async(torch.ones(4), name="poll")
    seen = [fake_bps.poll(h) for _ in range(3)]
    assert seen == [False, False, True]
    fake_bps.synchronize(h)
    from byteps.torch import ops
    assert ops._in_flight() == 0


def test_push_pull_autograd_declares_grad_name(fake_bps):
    fake_bps.init()
    x = torch.ones(3, requires_grad=True)
    y = fake_bps.push_pull(x, name="ag", average=False)
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 2.0, 3.0]))
    keys = fake_bps._fake.state["keys"]
    assert "ag" in keys and "ag.grad" in keys and keys["ag"] < keys["ag.grad"]


def test_push_pull_fp16_compression(fake_bps):
    fake_bps.init()
    x = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
    y = fake_bps.push_pull(x, name="c", compression=fake_bps.Compression.fp16)
    assert y.dtype == torch.float64 and torch.equal(y, x)
    assert fake_bps._fake.state["calls"][-1]["dtype"] == "float16"


def test_gpu_tensor_rejected(fake_bps):
    fake_bps.init()
    meta = torch.empty(3, device="meta")
    with pytest.raises(TypeError, match="CPU"):
        fake_bps.push_pull_async(meta, name="m")


# --------------------------------------------------------------------------- optimizer
def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_distributed_optimizer_validation(fake_bps):
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="tuples"):
        fake_bps.DistributedOptimizer(opt, named_parameters=list(m.parameters()))
    named = list(m.named_parameters())
    dup = [("a", named[0][1]), ("a", named[1][1])] + named[2:]
    with pytest.raises(ValueError, match="unique"):
        fake_bps.DistributedOptimizer(opt, named_parameters=dup)
    with pytest.raises(ValueError, match="not named"):
        fake_bps.DistributedOptimizer(opt, named_parameters=named[:2])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        fake_bps.DistributedOptimizer(opt, named_parameters=named, backward_passes_per_step=0)
    with pytest.raises(TypeError):
        fake_bps.DistributedOptimizer(object())


def test_distributed_optimizer_single_process(fake_bps):
    fake_bps.init()
    m = _model()
    ref = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    dopt = fake_bps.DistributedOptimizer(opt, named_parameters=m.named_parameters())
    assert isinstance(dopt, torch.optim.SGD) and type(dopt).__name__ == "SGD"
    keys = fake_bps._fake.state["keys"]
    assert sorted(k for k in keys if k.startswith("Gradient.")) == sorted(
        "Gradient." + n for n, _ in m.named_parameters())
    x = torch.randn(8, 4)
    for _ in range(3):
        for model, o in ((m, dopt), (ref, ref_opt)):
            o.zero_grad()
            model(x).pow(2).sum().backward()
            o.step()
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
    with dopt.skip_synchronize():
        dopt.step()
    dopt.set_backward_passes_per_step(2)
    assert dopt.backward_passes_per_step == 2
    assert dopt.state_dict()["param_groups"][0]["lr"] == 0.1


def test_broadcast_optimizer_state_rejects_lbfgs(fake_bps):
    fake_bps.init()
    m = _model()
    with pytest.raises(ValueError, match="LBFGS"):
        fake_bps.broadcast_optimizer_state(torch.optim.LBFGS(m.parameters()), root_rank=0)


def test_broadcast_single_process(fake_bps):
    fake_bps.init()
    m = _model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    fake_bps.broadcast_parameters(m.state_dict(), root_rank=0)
    fake_bps.broadcast_parameters(list(m.parameters()), root_rank=0)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])
    with pytest.raises(ValueError):
        fake_bps.broadcast_parameters(m.state_dict(), root_rank=1)
    assert fake_bps.broadcast_object({"a": [1, 2]}, root_rank=0) == {"a": [1, 2]}
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    fake_bps.broadcast_optimizer_state(opt, root_rank=0)
    # state was created but the parameters are unchanged and the grads restored
    assert len(opt.state) == len(list(m.parameters()))
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in m.parameters())


def test_name_for_signature_suffix(fake_bps):
    from byteps.torch import ops
    a = ops._name_for("Parameter.0.weight", torch.float32, (3, 4))
    assert a == "Parameter.0.weight"
    assert ops._name_for("Parameter.0.weight", torch.float32, (3, 4)) == a
    b = ops._name_for("Parameter.0.weight", torch.float32, (5, 4))
    c = ops._name_for("Parameter.0.weight", torch.float64, (3, 4))
    assert len({a, b, c}) == 3 and b.startswith(a + "~")
    assert ops._name_for("Parameter.0.weight", torch.float32, [5, 4]) == b


def test_two_models_same_names(fake_bps):
    fake_bps.init()
    g = torch.nn.Sequential(torch.nn.Linear(4, 3))
    d = torch.nn.Sequential(torch.nn.Linear(5, 2))
    fake_bps.broadcast_parameters(g.state_dict(), root_rank=0)
    fake_bps.broadcast_parameters(d.state_dict(), root_rank=0)
    names = [c["name"] for c in fake_bps._fake.state["calls"]]
    assert len(set(names)) == 4
    og = fake_bps.DistributedOptimizer(torch.optim.SGD(g.parameters(), lr=0.1),
                                       named_parameters=g.named_parameters())
    od = fake_bps.DistributedOptimizer(torch.optim.SGD(d.parameters(), lr=0.1),
                                       named_parameters=d.named_parameters())
    assert set(og._grad_names.values()).isdisjoint(od._grad_names.values())


def test_inplace_on_expanded_tensor_rejected(fake_bps):
    fake_bps.init()
    t = torch.ones(1, 3).expand(4, 3)
    with pytest.raises(ValueError, match="sharing memory"):
        fake_bps.push_pull_async_inplace(t, name="exp")
    out = fake_bps.synchronize(fake_bps.push_pull_async(t, name="exp2"))
    assert torch.equal(out, torch.ones(4, 3))
