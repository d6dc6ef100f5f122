"""byteps.launch.ray: a byteps job on the actors of a Ray cluster.

* :mod:`~byteps.launch.ray.executor`: :class:`~byteps.launch.ray.executor.RayExecutor` (users
  import it as :class:`byteps.ray.RayExecutor`); needs Ray;
* :mod:`~byteps.launch.ray.actors`: the actors of the servers, the scheduler and the workers;
  needs Ray;
* :mod:`~byteps.launch.ray.placement`: the placement plan, pure functions (no Ray import).

This package imports nothing itself, so the placement plan loads without Ray.
"""
