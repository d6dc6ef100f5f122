"""byteps.launch: everything that starts the processes of a byteps job.

* :mod:`~byteps.launch.cli`: ``bpslaunch`` (argument parsing and dispatch only; also
  ``python -m byteps.launch``);
* :mod:`~byteps.launch.common`: what every launcher shares (``LaunchError``, ``ChildSpec``, the
  free-port helper, ``--env`` parsing, the default server command);
* :mod:`~byteps.launch.contract`: the ``DMLC_*``/``BYTEPS_*`` environment of each role, the one
  definition every launcher builds on (docs/launching.md);
* :mod:`~byteps.launch.supervise`: running the children, prefixing their output, stopping the job
  at the first failure;
* one module per engine: :mod:`~byteps.launch.local` (``--workers N`` on this host),
  :mod:`~byteps.launch.upstream` (one role from ``DMLC_*`` variables),
  :mod:`~byteps.launch.ssh` with its remote end :mod:`~byteps.launch.ssh_remote`,
  :mod:`~byteps.launch.slurm` with its task end :mod:`~byteps.launch.slurm_task`,
  :mod:`~byteps.launch.k8s` (manifests), :mod:`~byteps.launch.torchrun` with
  :mod:`~byteps.launch.torchrun_env` (``init()`` under torchrun) and :mod:`byteps.launch.ray`
  (Ray actors; users import :class:`byteps.ray.RayExecutor`).

The engines import ``common``, ``contract`` and ``supervise``; ``cli`` imports the engines;
nothing imports ``cli``. This package imports nothing itself.
"""
