"""byteps on a Ray cluster: ``from byteps.ray import RayExecutor`` (docs/launching.md "Ray").

The public name of :class:`byteps.launch.ray.executor.RayExecutor`, which holds the code.
Importing this module without Ray installed raises ``ImportError`` (``pip install
'byteps[engines]'``).
"""

from .launch.ray.executor import RayExecutor

__all__ = ["RayExecutor"]
