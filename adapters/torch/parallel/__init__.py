"""``byteps.torch.parallel``: module wrappers for data-parallel training over byteps
(upstream ``byteps/torch/parallel``).

Exports :class:`DistributedDataParallel`.
"""

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
