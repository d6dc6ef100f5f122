"""The scheduling workload's model side (no cluster): gradient tensors derived from the published
VGG-16 / ResNet-50 architectures, the compute profile, and the ideal overlap bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import models, sched
from benchmarks.models import Layer


@pytest.mark.parametrize("name,tensors,params", [
    ("vgg16", 32, 138_357_544),   # Simonyan & Zisserman 2015, configuration D
    ("resnet50", 161, 25_557_032),  # He et al. 2016 (torchvision's count)
])
def test_published_parameter_counts(name, tensors, params):
    ts = models.MODELS[name]()
    assert len(ts) == tensors
    assert sum(t.numel for t in ts) == params
    assert len({t.name for t in ts}) == tensors


def test_published_flops():
    # ~15.5 G multiply-adds for VGG-16, ~4.1 G for ResNet-50 (per 224x224 image)
    assert sum(t.fwd_flops for t in models.vgg16()) / 2 == pytest.approx(15.5e9, rel=0.01)
    assert sum(t.fwd_flops for t in models.resnet50()) / 2 == pytest.approx(4.1e9, rel=0.02)


def test_vgg16_layers_in_forward_order():
    ts = models.vgg16()
    assert ts[0] == models.Tensor("features.0.weight", 3 * 64 * 9, ts[0].fwd_flops)
    assert ts[-2].name == "classifier.6.weight" and ts[-2].numel == 4096 * 1000
    assert max(ts, key=lambda t: t.numel).name == "classifier.0.weight"  # 25088 x 4096


def test_profile_splits_compute_by_flops():
    layers = models.profile("resnet50", 3.0)
    assert sum(x.fwd_s + x.bwd_s for x in layers) == pytest.approx(3.0)
    for x in layers:
        assert x.bwd_s == pytest.approx(2 * x.fwd_s)
        assert x.nbytes % 4 == 0
    assert sum(x.nbytes for x in layers) == 4 * 25_557_032
    with pytest.raises(ValueError, match="compute_s"):
        models.profile("vgg16", -1.0)
    with pytest.raises(KeyError):
        models.profile("alexnet", 1.0)


def test_ideal_without_compute_is_the_communication():
    layers = [Layer("a", 100, 0.0, 0.0), Layer("b", 300, 0.0, 0.0)]
    assert sched.ideal_iteration(layers, 0.01) == pytest.approx(4.0)


def test_ideal_hand_computed():
    # backward: b ready at 1 s, a at 2 s; network 1 s per gradient, a preempts nothing (b is
    # done at 2 s); forward: a waits for its push_pull (2..3 s), then 0.5 s; b (done) 0.5 s.
    layers = [Layer("a", 100, 0.5, 1.0), Layer("b", 100, 0.5, 1.0)]
    assert sched.ideal_iteration(layers, 0.01) == pytest.approx(4.0)
    # a large low-priority gradient is preempted by the first layer's
    layers = [Layer("a", 100, 0.5, 1.0), Layer("b", 1000, 0.5, 1.0)]
    # b: 1..2 s (1 s of 10 done), a: 2..3 s, forward a 3..3.5, b's remaining 9 s: 3..12, +0.5
    assert sched.ideal_iteration(layers, 0.01) == pytest.approx(12.5)
    assert sched.sequential_iteration(layers, 0.01) == pytest.approx(14.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.floats(0, 1), st.floats(0, 1)),
                min_size=1, max_size=12),
       st.floats(1e-5, 1e-2))
def test_ideal_is_a_bound(spec, spb):
    layers = [Layer(f"t{i}", b, f, w) for i, (b, f, w) in enumerate(spec)]
    ideal = sched.ideal_iteration(layers, spb)
    comm = sum(x.nbytes for x in layers) * spb
    compute = sum(x.fwd_s + x.bwd_s for x in layers)
    eps = 1e-9 * (1 + comm + compute)
    assert ideal >= comm - eps  # the network must carry every byte
    assert ideal >= compute - eps  # and every layer must compute
    assert ideal <= sched.sequential_iteration(layers, spb) + eps  # overlap never hurts
