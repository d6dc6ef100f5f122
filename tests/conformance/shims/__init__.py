"""Per-framework shims of the conformance suite (see ``base.py`` for the interface).

``get_shim(framework)`` returns an instance of the framework's shim class without importing the
framework (that happens in ``Shim.init()``), so the pytest driver can read the capability flags
cheaply.
"""

from __future__ import annotations

import importlib

from .base import ALL_DTYPES, CAPABILITIES, FLOAT_DTYPES, PARAM_NAMES, Batch, Shim

#: framework name -> (module in this package, class name)
SHIMS = {
    "torch": ("torch_shim", "TorchShim"),
    "tensorflow": ("tensorflow_shim", "TensorFlowShim"),
    "mxnet": ("mxnet_shim", "MXNetShim"),
}

__all__ = ["ALL_DTYPES", "CAPABILITIES", "FLOAT_DTYPES", "PARAM_NAMES", "SHIMS", "Batch", "Shim",
           "get_shim"]


def get_shim(framework: str) -> Shim:
    """A (not yet initialised) shim for ``framework``."""
    try:
        module_name, class_name = SHIMS[framework]
    except KeyError:
        raise ValueError(f"unknown framework {framework!r}; known: {sorted(SHIMS)}") from None
    module = importlib.import_module(f".{module_name}", __name__)
    return getattr(module, class_name)()
