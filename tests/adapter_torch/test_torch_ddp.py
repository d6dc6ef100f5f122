"""byteps.torch.parallel.DistributedDataParallel.

Unit tests over the fake single-process core (conftest ``fake_bps``): argument validation,
priorities, the end-of-backward synchronisation, no_sync, unused parameters, recovery after
an aborted backward. Jobs (tests/adapter_torch/workers/ddp_worker.py, one process per rank):
training equals single-process SGD on the averaged gradient, no_sync, broadcasts, unused
parameters and errors on every rank.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

WORKERS = Path(__file__).resolve().parent / "workers"


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


@pytest.fixture
def ddp_mod(fake_bps):
    """``(byteps.torch, DistributedDataParallel)`` over the fake core, initialised."""
    fake_bps.init()
    from byteps.torch.parallel import DistributedDataParallel

    return fake_bps, DistributedDataParallel


# ----------------------------------------------------------------------- argument checks
@pytest.mark.parametrize("kwargs", [
    dict(process_group=object()), dict(bucket_cap_mb=25), dict(gradient_as_bucket_view=True),
    dict(static_graph=True), dict(mixed_precision=object()), dict(device_mesh=object()),
    dict(delay_all_reduce_named_params=[]), dict(param_to_hook_all_reduce=object()),
    dict(skip_all_reduce_unused_params=True), dict(dim=1), dict(device_ids=[0, 1]),
    dict(compression_params={"compressor": "bogus"}),
], ids=lambda kw: next(iter(kw)))
def test_unsupported_arguments_raise(ddp_mod, kwargs):
    from byteps.errors import InvalidArgumentError

    _, DDP = ddp_mod
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs)) if "compression_params"
                       not in kwargs else "compressor"):
        DDP(_net(), **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(broadcast_buffers=1), dict(find_unused_parameters="yes"), dict(init_sync=None),
    dict(device_ids=0), dict(device_ids=[1.5]), dict(dim="0"), dict(compression=object()),
], ids=lambda kw: next(iter(kw)))
def test_bad_types_raise(ddp_mod, kwargs):
    from byteps.errors import InvalidTypeError

    _, DDP = ddp_mod
    with pytest.raises(InvalidTypeError):
        DDP(_net(), **kwargs)


def test_module_type_and_not_initialized(fake_bps):
    from byteps.errors import InvalidTypeError, NotInitializedError
    from byteps.torch.parallel import DistributedDataParallel as DDP

    with pytest.raises(NotInitializedError):
        DDP(_net())
    fake_bps.init()
    with pytest.raises(InvalidTypeError, match="torch.nn.Module"):
        DDP(lambda x: x)


def test_device_ids_on_cpu(ddp_mod):
    """Upstream's scripts pass device_ids=[local_rank]: accepted on a CPU module, with a
    warning that it has no effect; a CPU device warns nothing."""
    _, DDP = ddp_mod
    with pytest.warns(UserWarning, match="device_ids"):
        ddp = DDP(_net(), device_ids=[0])
    assert ddp.device_ids == [0]
    with pytest.warns(UserWarning, match="output_device"):
        DDP(_net(), output_device=torch.device("cuda", 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DDP(_net(), device_ids=["cpu"], output_device="cpu", check_reduction=True)
        DDP(_net(), device_ids=[])


def test_module_on_one_device_of_cpu_or_cuda(ddp_mod):
    """The module's device is taken from its parameters and buffers: CPU here (CUDA modules
    run in tests/test_gpu.py); another device type, or parameters on several devices, are
    refused naming them."""
    from byteps.errors import InvalidArgumentError, InvalidTypeError

    _, DDP = ddp_mod
    assert DDP(_net()).device == torch.device("cpu")
    assert DDP(torch.nn.ReLU()).device == torch.device("cpu")  # no parameters
    with pytest.raises(InvalidTypeError, match="meta"):
        DDP(_net().to("meta"))
    mixed = _net()
    mixed[2].to("meta")
    with pytest.raises(InvalidArgumentError, match="several devices.*cpu.*meta"):
        DDP(mixed)


# ---------------------------------------------------------------------------- reduction
def test_backward_reduces_in_layer_priority_order(ddp_mod):
    bps, DDP = ddp_mod
    net = _net()
    ddp = DDP(net)
    want = [torch.autograd.grad(net(torch.ones(3, 4)).sum(), list(net.parameters()))]
    fake = bps._fake
    fake.state["calls"].clear()
    ddp(torch.ones(3, 4)).sum().backward()
    from byteps.torch import ops

    assert ops._in_flight() == 0  # everything synchronised when backward() returned
    calls = {c["name"].split("Gradient.")[1]: c for c in fake.state["calls"]}
    assert set(calls) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(c["average"] and c["inplace"] for c in calls.values())
    prio = {k: c["priority"] for k, c in calls.items()}
    # the first layer (needed first by the next forward) has the highest priority
    assert prio["0.weight"] > prio["0.bias"] > prio["2.weight"] > prio["2.bias"]
    for p, g in zip(net.parameters(), want[0]):
        torch.testing.assert_close(p.grad, g)


def test_buffers_broadcast_coalesced_per_dtype(ddp_mod):
    bps, DDP = ddp_mod
    fake = bps._fake
    fake.state["size"] = 2  # broadcasts happen only with more than one rank
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                              torch.nn.Linear(6, 3), torch.nn.BatchNorm1d(3))
    ddp = DDP(net)
    with torch.no_grad():  # distinct values, so a buffer written back out of place shows
        for i, b in enumerate(net.buffers()):
            b.copy_(torch.arange(b.numel()).reshape(b.shape) + 100 * i)
    want = [b.detach().clone() for b in net.buffers()]
    seen = []
    net[1].register_forward_pre_hook(
        lambda mod, args: seen.append([b.detach().clone() for b in net.buffers()]))
    fake.state["calls"].clear()
    ddp(torch.randn(5, 4))
    calls = [c for c in fake.state["calls"] if ".Buffers." in c["name"]]
    # one push_pull per dtype: running_mean/var (float32, 6+6+3+3) and num_batches_tracked
    assert sorted((c["dtype"], c["shape"]) for c in calls) == [("float32", [18]),
                                                               ("int64", [2])]
    # the broadcast values (here: a copy of rank 0's own) went back into their own buffers
    for got, w in zip(seen[0], want):
        torch.testing.assert_close(got, w)


def test_no_sync_accumulates_then_reduces(ddp_mod):
    bps, DDP = ddp_mod
    ddp = DDP(_net())
    fake = bps._fake
    fake.state["calls"].clear()
    with ddp.no_sync():
        ddp(torch.ones(2, 4)).sum().backward()
        ddp(torch.ones(2, 4)).sum().backward()
    assert fake.state["calls"] == []
    g2 = [p.grad.clone() for p in ddp.parameters()]
    ddp(torch.ones(2, 4)).sum().backward()
    assert len(fake.state["calls"]) == 4
    for p, g in zip(ddp.parameters(), g2):
        torch.testing.assert_close(p.grad, g * 3 / 2)  # 3 accumulated passes


class _Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 2)
        self.b = torch.nn.Linear(3, 2)
        self.frozen = torch.nn.Linear(3, 2).requires_grad_(False)

    def forward(self, x, use_b=False):
        y = self.a(x) + self.frozen(x)
        return y + self.b(x) if use_b else y


def test_unused_parameter_raises_usage_error(ddp_mod):
    from byteps.errors import UsageError
    from byteps.torch import ops

    _, DDP = ddp_mod
    ddp = DDP(_Branchy())
    with pytest.raises(UsageError, match=r"\['b.bias', 'b.weight'\].*find_unused_parameters=True"):
        ddp(torch.ones(1, 3)).sum().backward()
    assert ops._in_flight() == 0
    assert ddp.module.b.weight.grad is None
    ddp(torch.ones(1, 3), use_b=True).sum().backward()  # the wrapper still works


def test_find_unused_parameters(ddp_mod):
    bps, DDP = ddp_mod
    ddp = DDP(_Branchy(), find_unused_parameters=True)
    fake = bps._fake
    fake.state["calls"].clear()
    ddp(torch.ones(1, 3)).sum().backward()
    names = sorted(c["name"] for c in fake.state["calls"])
    # every rank reduces every parameter (zeros for b) plus the count of ranks using each
    assert len(names) == 5 and names[-1].endswith(".used"), names
    assert ddp.module.b.weight.grad is None  # used on no rank: stays None (torch DDP)
    assert ddp.module.a.weight.grad is not None and ddp.module.frozen.weight.grad is None
    ddp.synchronize()  # nothing pending: a no-op
    # with every parameter used, the count is reduced all the same (another rank may need it)
    fake.state["calls"].clear()
    ddp(torch.ones(1, 3), use_b=True).sum().backward()
    assert sum(c["name"].endswith(".used") for c in fake.state["calls"]) == 1


def test_recovers_after_aborted_backward(ddp_mod):
    """A user hook raising after ours aborts the backward pass (the end-of-pass callback
    never runs): the next forward pass drains what was started, and training goes on."""
    from byteps.torch import ops

    _, DDP = ddp_mod
    net = _net()
    ddp = DDP(net)

    def boom(_):
        raise KeyError("user hook")

    h = net[0].weight.register_post_accumulate_grad_hook(boom)
    with pytest.raises(KeyError):
        ddp(torch.ones(1, 4)).sum().backward()
    assert ops._in_flight() > 0
    h.remove()
    net.zero_grad()
    ddp(torch.ones(1, 4)).sum().backward()
    assert ops._in_flight() == 0 and all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing(ddp_mod, reentrant):
    """Non-reentrant checkpointing is one backward pass; reentrant checkpointing nests a second
    one, which is refused with UsageError (its end would end the outer reduction); the next
    forward pass recovers."""
    from torch.utils.checkpoint import checkpoint

    from byteps.errors import UsageError
    from byteps.torch import ops

    _, DDP = ddp_mod
    net = _net()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.ckpt = True

        def forward(self, x):
            h = checkpoint(self.net[0], x, use_reentrant=reentrant) if self.ckpt \
                else self.net[0](x)
            return self.net[2](self.net[1](h))

    ddp = DDP(Wrapped())
    x = torch.ones(2, 4, requires_grad=reentrant)
    if reentrant:
        with pytest.raises(UsageError, match="use_reentrant=False"):
            ddp(x).sum().backward()
        net.zero_grad()
        ddp.module.ckpt = False
    ddp(x).sum().backward()
    assert ops._in_flight() == 0 and all(p.grad is not None for p in net.parameters())


def test_dropped_wrapper_stops_reducing(ddp_mod):
    bps, DDP = ddp_mod
    net = _net()
    DDP(net)
    gc.collect()
    bps._fake.state["calls"].clear()
    net(torch.ones(1, 4)).sum().backward()
    assert bps._fake.state["calls"] == []


def test_compression_params(ddp_mod):
    """compression_params declares every gradient with the core's compressor kwargs; Nesterov
    momentum needs momentum_mu (there is no optimizer to take it from)."""
    from byteps.errors import InvalidArgumentError

    bps, DDP = ddp_mod
    ddp = DDP(_net(), compression_params={"compressor": "onebit", "scaling": True})
    declared = {k: v for k, v in bps._fake.state["compression"].items() if ".Gradient." in k}
    # ("~k": names already used in this process with other kwargs, see ops._name_for)
    bases = sorted(k.split("Gradient.")[1].split("~")[0] for k in declared)
    assert bases == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(v == {"compressor_type": "onebit", "compressor_onebit_scaling": "true"}
               for v in declared.values())
    ddp(torch.ones(1, 4)).sum().backward()
    with pytest.raises(InvalidArgumentError, match="momentum_mu"):
        DDP(_net(), compression_params={"compressor": "onebit", "momentum": "nesterov"})
    with pytest.raises(InvalidArgumentError, match="fp16"):
        DDP(_net(), compression=object.__new__(type("C", (), {"compress": 0, "decompress": 0})),
            compression_params={"fp16": True})


def test_state_dict_and_export(ddp_mod):
    bps, DDP = ddp_mod
    ddp = DDP(_net())
    assert sorted(ddp.state_dict()) == ["module.0.bias", "module.0.weight", "module.2.bias",
                                        "module.2.weight"]
    import byteps.torch.parallel as par

    assert par.__all__ == ["DistributedDataParallel"]


# ------------------------------------------------------------------------- real jobs
def _launch(workers, servers, cases=(), timeout=180):
    pytest.importorskip("byteps._core", reason="the byteps core is not built")
    from jobs import PY, framework_env, launch_config, launch_job

    return launch_job(launch_config(workers, servers), [PY, WORKERS / "ddp_worker.py", *cases],
                      timeout=timeout, job_env=framework_env())


def test_ddp_two_workers():
    """Every case: equivalence (none, fp16), no_sync, buffers, unused error, find_unused,
    mismatch error, upstream benchmark calls."""
    from jobs import assert_marker

    job = _launch(2, 1)
    assert_marker(job, "TORCH_DDP_OK", 2)
    assert job.output.count("DDP_UNUSED_RAISED") == 2, job.output[-6000:]
    assert job.output.count("DDP_MISMATCH_RAISED") == 2, job.output[-6000:]


def test_ddp_three_workers_two_servers():
    from jobs import assert_marker

    job = _launch(3, 2, ["equivalence", "no_sync", "buffers", "unused_ok", "unused_some",
                         "unused_error"])
    assert_marker(job, "TORCH_DDP_OK", 3)
    assert job.output.count("DDP_UNUSED_RAISED") == 3, job.output[-6000:]
