"""``byteps.ray.RayExecutor`` on a real local multi-node Ray cluster (``ray.cluster_utils``).

One cluster for the module: a head and a second node, 2 CPUs each, every node on 127.0.0.1
(Ray's single-host mode, so the job's traffic stays on loopback), Ray's files in a temporary
``RAY_TMPDIR``. Tested: the digits model trained by 2 workers spread over both nodes (one
worker machine and one colocated server per node) to >= 0.95 with bit-identical parameters, the
contract in every worker's environment, a second run of the same executor (a fresh job); 4
packed workers grouped into 2 machines of local size 2; a worker actor killed mid-run ->
``JobFailedError`` naming its rank within seconds, after which ``shutdown()`` leaves none of
the job's processes (every PID checked); ``fn`` raising on one rank; a server's process or its
actor killed -> the error names that server; ``run`` before ``start``; a GPU request the cluster
cannot hold -> a timeout naming the request.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines

ray = pytest.importorskip("ray", reason="needs Ray (the engines extra)")
pytest.importorskip("torch", reason="the workers train with byteps.torch")
pytest.importorskip("sklearn", reason="the digits data ships with scikit-learn")

from ray.cluster_utils import Cluster  # noqa: E402

import byteps  # noqa: E402
from byteps.errors import BytePSTimeoutError, JobFailedError, UsageError  # noqa: E402
from byteps.ray import RayExecutor  # noqa: E402

#: Short core timeouts: a job that loses a peer fails in seconds, never hangs the suite.
FAST_FAIL = {"BYTEPS_HEARTBEAT_INTERVAL": "0.5", "BYTEPS_HEARTBEAT_TIMEOUT": "4",
             "BYTEPS_TIMEOUT": "30"}


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes (2 CPUs each) on 127.0.0.1; the driver connected; all removed after."""
    tmp = tempfile.mkdtemp(prefix="bpsray-", dir="/tmp")  # short: Ray's unix socket paths
    mp = pytest.MonkeyPatch()
    # Ray's own switch for "single host": every node's IP is 127.0.0.1 instead of the host's
    # outbound address (read by this process and by every Ray process it starts).
    mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    mp.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    mp.setenv("RAY_TMPDIR", tmp)
    cl = None
    try:
        args = {"num_cpus": 2, "include_dashboard": False, "object_store_memory": 80 << 20}
        cl = Cluster(initialize_head=True, head_node_args=dict(args))
        cl.add_node(num_cpus=2, object_store_memory=80 << 20)
        ray.init(address=cl.address, log_to_driver=True)
        cl.wait_for_nodes()
        # Test functions travel by value: the actors cannot import this module.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield cl
    finally:
        with contextlib.suppress(Exception):
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()
        if cl is not None:
            cl.shutdown()
        mp.undo()
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- worker functions


def _train_digits(epochs: int, batch_size: int = 32) -> dict:
    """The digits MLP (examples/torch/train_digits.py, compact): this rank's shard, SGD through
    bps.DistributedOptimizer; returns the accuracy summed over the test shards, the parameters'
    digest and the byteps contract this worker saw."""
    import hashlib

    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import byteps.torch as bps

    torch.set_num_threads(1)
    bps.init()
    rank, size = bps.rank(), bps.size()
    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    mean, std = X_tr.mean(axis=0), X_tr.std(axis=0)
    std[std == 0] = 1.0
    per_rank = len(X_tr) // size
    X_tr = torch.tensor((X_tr - mean) / std, dtype=torch.float32)[rank::size][:per_rank]
    y_tr = torch.tensor(y_tr)[rank::size][:per_rank]
    X_te = torch.tensor((X_te - mean) / std, dtype=torch.float32)[rank::size]
    y_te = torch.tensor(y_te)[rank::size]

    torch.manual_seed(1234 + rank)  # different on purpose: the broadcast makes them equal
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(rank)
    for _ in range(epochs):
        perm = torch.randperm(len(X_tr), generator=gen)
        for i in range(len(X_tr) // batch_size):
            idx = perm[i * batch_size:(i + 1) * batch_size]
            opt.zero_grad()
            F.cross_entropy(model(X_tr[idx]), y_tr[idx]).backward()
            opt.step()
    with torch.no_grad():
        correct = (model(X_te).argmax(dim=1) == y_te).sum()
    counts = bps.push_pull(torch.tensor([float(correct), float(len(y_te))], dtype=torch.float64),
                           average=False, name="eval.counts")
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    env = {k: os.environ.get(k) for k in (
        "DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_WORKER_ID", "BYTEPS_LOCAL_RANK",
        "BYTEPS_LOCAL_SIZE", "DMLC_PS_ROOT_URI", "DMLC_NODE_HOST", "BYTEPS_HEARTBEAT_TIMEOUT",
        "CUDA_VISIBLE_DEVICES")}
    return {"rank": rank, "size": size, "accuracy": (counts[0] / counts[1]).item(),
            "digest": h.hexdigest(), "env": env, "pid": os.getpid()}


def _sum_ranks() -> tuple:
    """One push_pull of every rank's (rank + 1): (rank, size, local_rank, local_size, sum)."""
    import torch

    import byteps.torch as bps

    bps.init()
    total = bps.push_pull(torch.tensor([float(bps.rank() + 1)]), average=False, name="ranks")
    return bps.rank(), bps.size(), bps.local_rank(), bps.local_size(), total.item()


def _raise_on_rank1() -> str:
    """Rank 1 raises a user error; rank 0 waits in a push_pull rank 1 never joins."""
    import torch

    import byteps.torch as bps

    bps.init()
    if bps.rank() == 1:
        raise ValueError("bad batch on rank 1")
    bps.push_pull(torch.ones(4), name="never.completes")
    return "unreachable"


def _push_pull_until_killed(marker_dir: str, seconds: float) -> int:
    """push_pull in a loop for ``seconds``; a marker file per rank once the loop is going."""
    import torch

    import byteps.torch as bps

    bps.init()
    t = torch.ones(4096)
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        bps.push_pull(t, average=True, name="loop")
        step += 1
        if step == 5:
            Path(marker_dir, f"rank{bps.rank()}").touch()
        time.sleep(0.01)
    return step


# ------------------------------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _job_pids(ex: RayExecutor) -> list[int]:
    pids = []
    for p in ex.processes():
        pids.append(p["pid"])
        if p.get("child_pid"):
            pids.append(p["child_pid"])
    return pids


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _wait_idle(timeout: float = 30.0) -> None:
    """Until every CPU of the cluster is free: Ray gives a killed actor's CPU back a moment
    after its process is gone, and PACK (best effort) splits bundles over nodes while it is
    taken."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0):
            return
        time.sleep(0.1)


# --------------------------------------------------------------------------------------- tests


def test_import_is_the_real_ray():
    import byteps.launch.ray.executor as bray

    assert bray.ray is sys.modules["ray"] and bray.ray.__version__ == ray.__version__
    assert callable(bray.ray.remote) and hasattr(bray.ray.util, "placement_group")


def test_run_before_start():
    ex = RayExecutor(2)
    with pytest.raises(UsageError, match=r"not started.*start\(\)"):
        ex.run(_sum_ranks)
    ex.shutdown()  # harmless before start


def test_digits_on_two_nodes(cluster):
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    with RayExecutor(2, placement_strategy="STRICT_SPREAD") as ex:
        procs = ex.processes()
        workers = [p for p in procs if p["role"] == "worker"]
        servers = [p for p in procs if p["role"] == "server"]
        assert {p["node_id"] for p in workers} == nodes and ex.local_size == 1
        # one server per node hosting workers, the scheduler on worker 0's node
        assert sorted(p["node_id"] for p in servers) == sorted(p["node_id"] for p in workers)
        assert [p["node_id"] for p in procs if p["role"] == "scheduler"] == [workers[0]["node_id"]]
        t0 = time.monotonic()
        out = ex.run(_train_digits, args=(8,))
        took = time.monotonic() - t0
        assert [o["rank"] for o in out] == [0, 1] and all(o["size"] == 2 for o in out)
        assert out[0]["accuracy"] >= 0.95, out[0]["accuracy"]
        assert out[0]["digest"] == out[1]["digest"]
        assert out[0]["accuracy"] == out[1]["accuracy"]
        for rank, o in enumerate(out):
            env = o["env"]
            assert env["DMLC_ROLE"] == "worker" and env["DMLC_NUM_WORKER"] == "2"
            assert env["DMLC_NUM_SERVER"] == "2" and env["DMLC_WORKER_ID"] == str(rank)
            assert env["BYTEPS_LOCAL_RANK"] == "0" and env["BYTEPS_LOCAL_SIZE"] == "1"
            assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1" == env["DMLC_NODE_HOST"]
            assert env["CUDA_VISIBLE_DEVICES"] in (None, "")
            assert o["pid"] == workers[rank]["pid"]  # fn ran in the worker actor itself
        # a second run is a fresh job on the same actors (new job id, secret and port)
        assert ex.run(_sum_ranks) == [(0, 2, 0, 1, 3.0), (1, 2, 0, 1, 3.0)]
        print(f"digits: {took:.1f} s, accuracy {out[0]['accuracy']:.3f}")
        pids = _job_pids(ex)
    assert _wait_gone(pids) == []


@pytest.mark.parametrize("workers", [2, 4])
def test_packed_workers_share_machines(cluster, workers):
    """PACKed on two 2-CPU nodes: 2 workers are one machine of local size 2 (no servers: a
    one-machine job), 4 workers are 2 machines of local size 2 with a server each."""
    _wait_idle()
    ex = RayExecutor(workers)
    ex.start(extra_env_vars=FAST_FAIL)
    try:
        assert ex.local_size == 2
        out = ex.run(_sum_ranks)
        total = workers * (workers + 1) / 2
        assert out == [(r, workers, r % 2, 2, total) for r in range(workers)]
        procs = ex.processes()
        node = [p["node_id"] for p in procs if p["role"] == "worker"]  # by rank
        assert node[0] == node[1] and (workers == 2 or node[1] != node[2] == node[3])
        assert sum(p["role"] == "server" for p in procs) == (0 if workers == 2 else 2)
        pids = _job_pids(ex)
    finally:
        ex.shutdown()
    assert _wait_gone(pids) == []


def test_fn_raising_names_the_rank(cluster):
    ex = RayExecutor(2, placement_strategy="STRICT_SPREAD")
    ex.start(extra_env_vars=FAST_FAIL)
    try:
        t0 = time.monotonic()
        with pytest.raises(JobFailedError, match=r"worker rank 1 .* raised ValueError: bad "
                           r"batch on rank 1") as info:
            ex.run(_raise_on_rank1)
        assert time.monotonic() - t0 < 25
        err = info.value
        assert err.rank == 1 and err.role == "worker"
        assert isinstance(err.cause, ValueError) and err.__cause__ is err.cause
        pids = _job_pids(ex)
    finally:
        ex.shutdown()
    assert _wait_gone(pids) == []


def test_killed_worker_fails_run_and_shutdown_cleans_up(cluster, tmp_path):
    ex = RayExecutor(2, placement_strategy="STRICT_SPREAD")
    ex.start(extra_env_vars=FAST_FAIL)
    seen: dict = {}

    def kill_rank1():
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["pids"] = _job_pids(ex)  # the servers' children are running now
        seen["killed_at"] = time.monotonic()
        ray.kill(ex.workers[1])

    killer = threading.Thread(target=kill_rank1, daemon=True)
    try:
        killer.start()
        with pytest.raises(JobFailedError) as info:
            ex.run(_push_pull_until_killed, args=(str(tmp_path), 90.0))
        failed_at = time.monotonic()
        killer.join(5)
        err = info.value
        print(f"failed {failed_at - seen['killed_at']:.1f} s after the kill: {err}")
        assert isinstance(err, byteps.BytePSError)
        assert err.role == "worker" and err.rank == 1
        assert "worker rank 1" in str(err) and "died" in str(err)
        assert failed_at - seen["killed_at"] < 20, failed_at - seen["killed_at"]
        with pytest.raises(UsageError, match="earlier run failed"):
            ex.run(_sum_ranks)
        assert len(seen["pids"]) == 2 + 3 + 3  # 2 workers; scheduler and 2 servers + children
    finally:
        ex.shutdown()
    assert _wait_gone(seen["pids"]) == []
    with pytest.raises(UsageError):
        ex.run(_sum_ranks)


@pytest.mark.parametrize("target", ["child", "actor"])
def test_killed_server_fails_run(cluster, tmp_path, target):
    """SIGKILL to server 1's ``python -m byteps.server`` (its actor reports the exit) or to its
    actor's process (Ray reports the actor dead; the child dies with it)."""
    ex = RayExecutor(2, placement_strategy="STRICT_SPREAD")
    ex.start(extra_env_vars=FAST_FAIL)
    seen: dict = {}

    def kill_server1():
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["pids"] = _job_pids(ex)
        server = next(p for p in ex.processes() if p["role"] == "server" and p["rank"] == 1)
        seen["killed_at"] = time.monotonic()
        os.kill(server["child_pid" if target == "child" else "pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_server1, daemon=True)
    try:
        killer.start()
        with pytest.raises(JobFailedError) as info:
            ex.run(_push_pull_until_killed, args=(str(tmp_path), 90.0))
        took = time.monotonic() - seen["killed_at"]
        killer.join(5)
        err = info.value
        print(f"failed {took:.1f} s after the kill: {err}")
        assert err.role == "server" and err.rank == 1 and took < 20
        assert ("exited with code 137" if target == "child" else "died") in str(err)
    finally:
        ex.shutdown()
    assert _wait_gone(seen["pids"]) == []


def test_gpu_request_the_cluster_cannot_hold(cluster):
    ex = RayExecutor(2, use_gpu=True, timeout_s=2)
    assert ex.worker_bundles() == [{"CPU": 1, "GPU": 1}] * 2
    t0 = time.monotonic()
    with pytest.raises(BytePSTimeoutError, match=r"2 x \{'CPU': 1, 'GPU': 1\}"):
        ex.start()
    assert time.monotonic() - t0 < 15
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
