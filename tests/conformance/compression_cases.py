"""The "compression" group of the conformance suite (registered by ``cases.py``): the
distributed optimizer with ``compression_params`` against a NumPy model of two-level
compression (docs/compression.md), for every compressor and both decorators.

Every rank trains the tiny model (``shims/base.py``) with plain SGD (no framework momentum)
for a few steps, each on its own batch; the reference re-computes every rank's gradients with
the framework on a local copy of the reference weights (``shim.gradients``), runs them through
the NumPy compressors of ``tests/compression_reference.py`` (each rank's compressor on
``gradient / size``, the server's on the sum of the decoded values, every instance keeping its
state across steps: ``tests/compression_sgd.py``) and applies ``w -= lr * result``. The
parameters are single partitions, compressed because the job sets
``BYTEPS_MIN_COMPRESS_BYTES=0``. The weights must match within float32 rounding and be
identical across ranks; ranks that declare different compressors must all get an error.

Cases get the helpers of ``cases.py`` through :func:`register` (this module does not import
it: the pytest driver loads ``cases.py`` under another module name).
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

#: user-facing compression_params (upstream's keys), each a separate training run
SETTINGS: Dict[str, dict] = {
    "onebit": {"compressor": "onebit"},
    "onebit-scaling": {"compressor": "onebit", "scaling": True},
    "topk": {"compressor": "topk", "k": 3},
    "randomk": {"compressor": "randomk", "k": 4, "seed": 17},
    "dithering": {"compressor": "dithering", "k": 4, "seed": 5},
    "dithering-natural-l2": {"compressor": "dithering", "k": 3, "seed": 9,
                             "partition": "natural", "normalize": "l2"},
    "fp16": {"compressor": "fp16"},
    "onebit-ef": {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
    "topk-ef-nesterov": {"compressor": "topk", "k": 0.25, "ef": "vanilla",
                         "momentum": "nesterov", "momentum_mu": 0.9},
}
STEPS = 3


def register(case: Callable, helpers) -> None:
    """Register this group's cases with ``cases.case``; ``helpers``: the ``cases`` module's
    namespace (rank_batch, assert_weights_close, assert_identical_across_ranks, LR, SEED)."""

    @case("compression", requires=("optimizer", "compression"))
    def compressed_training_matches_two_level_reference(shim):
        """Every compressor (onebit with and without scaling, top-k, random-k, dithering
        linear/natural with max/l2, fp16) and the decorators (error feedback, Nesterov
        momentum): SGD weights after 3 steps equal the NumPy two-level reference
        C_s(sum_i C_w(g_i / size)) with each compressor's state carried across steps, and are
        identical on every rank."""
        from compression_sgd import TwoLevel

        from byteps.sync.compression import compression_kwargs

        h = helpers
        size, r = shim.size(), shim.rank()
        for label, params in SETTINGS.items():
            for variant in shim.optimizer_variants:
                init = shim.initial_weights(h.SEED)
                model = shim.make_model(init)
                opt = shim.distributed_optimizer(model, h.LR, 0.0, variant,
                                                 compression_params=dict(params))
                try:
                    for step in range(STEPS):
                        shim.train_step(model, opt, [h.rank_batch(shim, r, step)])
                finally:
                    shim.close_optimizer(opt)
                got = shim.get_weights(model)
                kwargs = compression_kwargs(params)
                want = {n: w.copy() for n, w in init.items()}
                models = {}
                for step in range(STEPS):
                    grads = [shim.gradients(want, h.rank_batch(shim, q, step))
                             for q in range(size)]
                    for name in want:
                        if grads[0][name] is None:  # unused by the model: never sent
                            continue
                        if name not in models:
                            models[name] = TwoLevel(kwargs, "float32", want[name].size, size)
                        flat = [g[name].reshape(-1) for g in grads]
                        upd = models[name].step(flat, 1.0 / size, h.LR)
                        want[name] = (want[name] - np.float32(h.LR) *
                                      upd.reshape(want[name].shape)).astype(np.float32)
                what = f"compression {label} ({variant})"
                # Only the parameters the model uses: one that no rank uses has no gradient,
                # which torch skips and the Keras optimizer sends as zeros (which onebit, for
                # one, decodes as +1): a difference of the frameworks, not of compression.
                used = [n for n in want if n in models]
                h.assert_weights_close({n: got[n] for n in used}, {n: want[n] for n in used},
                                       what, rtol=1e-5, atol=1e-6)
                h.assert_identical_across_ranks(shim, got, f"conf.cmp.{label}.{variant}")

    @case("compression", requires=("optimizer", "compression"))
    def mismatched_compression_fails_every_rank(shim):
        """Rank 0 asks for random-k, the others for top-k: the first step fails on every rank
        with a MismatchError naming both compressions (the declarations differ). Settings no
        earlier case used, so every rank's gradients get fresh names (byteps.naming gives a
        name reused with another compressor a new suffix) that agree across ranks."""
        h = helpers
        params = ({"compressor": "randomk", "k": 5, "seed": 99} if shim.rank() == 0
                  else {"compressor": "topk", "k": 5})
        model = shim.make_model(shim.initial_weights(h.SEED))
        variant = shim.optimizer_variants[0]
        opt = shim.distributed_optimizer(model, h.LR, 0.0, variant, compression_params=params)
        try:
            shim.train_step(model, opt, [h.rank_batch(shim, shim.rank(), 0)])
        except Exception as exc:  # the framework may wrap the core's MismatchError
            text = f"{type(exc).__name__}: {exc}"
            assert "Mismatch" in text and "randomk" in text and "topk" in text, text
        else:
            raise AssertionError("different compression_params on the ranks did not fail")
        finally:
            shim.close_optimizer(opt)
