"""byteps.sync: how a tensor is summed across the worker machines, as the Python layer sees it.

* :mod:`~byteps.sync.schemes`: the synchronization schemes (``ps``, ``ring``, ``tree``,
  ``hips``) and ``BYTEPS_SYNC`` (docs/schemes.md);
* the cost model that picks a scheme per tensor size for ``BYTEPS_SYNC=auto``
  (``byteps.cost_model()``): :mod:`~byteps.sync.cost_formulas` (each scheme's closed-form
  α-β-γ cost, the simulator's too), :mod:`~byteps.sync.cost_model` (the model and the choice),
  :mod:`~byteps.sync.cost_envelope` (the choice's exact size intervals) and
  :mod:`~byteps.sync.cost_measure` (the start-up measurement); the partition rule comes from
  the core (``byteps._core.tensor_partition_bound``);
* :mod:`~byteps.sync.compression` (the adapters' compression settings turned into the core's
  compressor kwargs, docs/compression.md) and :mod:`~byteps.sync.compressor_interface` (the
  adapters' framework-side compressors);
* :mod:`~byteps.sync.async_train`: asynchronous training's front (docs/async.md).

This package imports nothing itself.
"""
