"""The Ray actors of :mod:`byteps.ray`: one per server or scheduler (running
``python -m byteps.server`` as its child process) and one per worker (running the user's
function with the worker's environment).

Imported by :mod:`byteps.ray` only, after it checked that Ray is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

import ray

from ...errors import BytePSError
from ..common import default_server_argv, find_free_port
from ..contract import CONTRACT_VARS, ClusterSpec, role_env
from ..supervise import exit_code_of, make_preexec

#: Seconds a server or scheduler gets after SIGTERM before SIGKILL.
TERM_GRACE_S = 3.0


def here() -> tuple[str, str, int]:
    """(node IP, Ray node id, pid) of the calling actor."""
    return (ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(), os.getpid())


class Service:
    """A Ray actor running the scheduler or one server as its child process."""

    def __init__(self, role: str, index: Optional[int]) -> None:
        self.role, self.index = role, index
        self.child: Optional[subprocess.Popen] = None

    def __repr__(self) -> str:  # Ray's prefix of this actor's output lines
        return f"byteps {self.role}" + ("" if self.index is None else f" {self.index}")

    def node(self) -> tuple[str, str, int]:
        return here()

    def free_port(self) -> int:
        return find_free_port(ray.util.get_node_ip_address())

    def spawn(self, spec: ClusterSpec, extra_env: Mapping[str, str]) -> int:
        """Start ``python -m byteps.server`` for ``spec`` (stopping a previous one); its pid."""
        self.stop()
        env = role_env(spec, self.role, node_host=ray.util.get_node_ip_address(),
                       base={**os.environ, **extra_env})
        self.child = subprocess.Popen(default_server_argv(), env=env, stdin=subprocess.DEVNULL,
                                      preexec_fn=make_preexec(os.getpid()))
        return self.child.pid

    def poll(self) -> Optional[int]:
        """The child's exit code (shell style), ``None`` while it runs or when there is none."""
        code = None if self.child is None else self.child.poll()
        return None if code is None else exit_code_of(code)

    def stop(self) -> Optional[int]:
        """Stop the child (SIGTERM, then SIGKILL after a grace period) and reap it."""
        child, self.child = self.child, None
        if child is None:
            return None
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return exit_code_of(child.returncode)


def stop_core(quiet: bool) -> None:
    """Shut byteps down in this process if ``fn`` left it initialised."""
    basics = sys.modules.get("byteps.basics")
    if basics is None or not basics.is_initialized():
        return
    try:
        basics.shutdown()
    except BytePSError:
        if not quiet:
            raise


class Worker:
    """A Ray actor running ``fn`` as one byteps worker process."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:  # Ray's prefix of this actor's output lines
        return f"byteps worker (actor {self.index})"

    def node(self) -> tuple[str, str, int]:
        return here()

    def free_port(self) -> int:
        return find_free_port(ray.util.get_node_ip_address())

    def execute(self, fn: Callable, args: Sequence, kwargs: Mapping, spec: ClusterSpec,
                worker_id: int, local_rank: int, extra_env: Mapping[str, str]) -> Any:
        """Set this worker's environment, call ``fn(*args, **kwargs)``, stop byteps after it."""
        env = role_env(spec, "worker", worker_id=worker_id, local_rank=local_rank,
                       node_host=ray.util.get_node_ip_address(), base={**os.environ, **extra_env})
        gpus = ray.get_gpu_ids()
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        for name in CONTRACT_VARS:
            os.environ.pop(name, None)
        os.environ.update(env)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            stop_core(quiet=True)
            raise
        stop_core(quiet=False)
        return result


ServiceActor = ray.remote(Service)
WorkerActor = ray.remote(Worker)
