"""byteps.torch across real processes, started by ``python -m byteps.launch``.

Each launch runs one worker script (tests/adapter_torch/workers/) on every rank; the script checks
many cases itself against references computed from the rank-dependent inputs and prints a
summary marker per rank; here we assert on the exit code and that every rank printed it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jobs import PY, REPO, assert_marker, framework_env, launch_config, launch_job, run_command

torch = pytest.importorskip("torch")
pytest.importorskip("byteps._core", reason="the byteps core is not built")

pytestmark = pytest.mark.torch

WORKERS = Path(__file__).resolve().parent / "workers"


def launch(script, workers=2, servers=1, local_size=None, args=(), timeout=240):
    """Run ``script ARGS`` on every worker of a job of ``workers`` x ``local_size`` processes
    and ``servers`` servers; returns the :class:`jobs.JobResult`."""
    return launch_job(launch_config(workers, servers, local_size), [PY, script, *args],
                      timeout=timeout, job_env=framework_env())


@pytest.mark.parametrize(
    "workers,servers,local_size",
    [(2, 1, None), (2, 2, None), (3, 1, None), (3, 2, None), (2, 1, 2)],
    ids=["2w1s", "2w2s", "3w1s", "3w2s", "2wx2local1s"],
)
def test_push_pull(workers, servers, local_size):
    job = launch(WORKERS / "push_pull_worker.py", workers, servers, local_size, timeout=300)
    size = workers * (local_size or 1)
    assert_marker(job, "TORCH_PUSHPULL_OK", size)
    assert f"size={size}" in job.output


def test_push_pull_single_worker():
    """One worker machine: no scheduler or servers; push_pull is local."""
    job = launch(WORKERS / "push_pull_worker.py", 1, 1, None, args=["--no-big"], timeout=200)
    assert_marker(job, "TORCH_PUSHPULL_OK", 1)


@pytest.mark.parametrize("workers,servers,local_size", [(2, 1, None), (3, 2, None), (2, 1, 2)],
                         ids=["2w1s", "3w2s", "2wx2local1s"])
def test_broadcast_and_optimizer(workers, servers, local_size):
    job = launch(WORKERS / "optimizer_worker.py", workers, servers, local_size, timeout=300)
    assert_marker(job, "TORCH_OPTIM_OK", workers * (local_size or 1))


def test_mismatch_raises_on_every_rank():
    job = launch(WORKERS / "mismatch_worker.py", 2, 1, timeout=240)
    assert_marker(job, "MISMATCH_SHAPE_RAISED", 2)
    assert job.output.count("MISMATCH_DTYPE_RAISED") == 2, job.output[-6000:]
    assert job.output.count("MISMATCH_AFTER_OK") == 2, job.output[-6000:]


def test_not_initialized_error():
    code = r"""
import torch, byteps.torch as bps
from byteps.errors import NotInitializedError
calls = {
    "size": lambda: bps.size(),
    "rank": lambda: bps.rank(),
    "push_pull": lambda: bps.push_pull(torch.ones(2), name="x"),
    "push_pull_async": lambda: bps.push_pull_async(torch.ones(2), name="x"),
    "declare": lambda: bps.declare("x"),
    "broadcast_parameters": lambda: bps.broadcast_parameters({"a": torch.ones(1)}, 0),
    "DistributedOptimizer": lambda: bps.DistributedOptimizer(
        torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)),
}
for name, fn in calls.items():
    try:
        fn()
    except NotInitializedError:
        print("NOTINIT_RAISED", name)
    else:
        print("NO ERROR FROM", name)
"""
    job = run_command([PY, "-c", code], timeout=120)
    assert job.returncode == 0, job.output
    assert job.output.count("NOTINIT_RAISED") == 7, job.output


def test_example_train_digits():
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    job = launch(REPO / "examples" / "torch" / "train_digits.py", 2, 1, timeout=240)
    assert job.returncode == 0, job.output[-8000:]
    m = re.search(r"final test accuracy: (\d\.\d+)", job.output)
    assert m, job.output[-8000:]
    assert float(m.group(1)) >= 0.95, job.output[-4000:]
    assert "parameters identical on all 2 workers" in job.output
    t = re.search(r"wall time: ([\d.]+) s", job.output)
    assert t and float(t.group(1)) < 60, job.output[-4000:]


def test_example_elastic_digits():
    """The elastic example: worker 2 of 3 dies in epoch 4; the survivors suspend, the example's
    supervisor restarts scheduler and server for 2 workers, and the survivors resume from their
    checkpoint and finish with identical parameters and a good accuracy."""
    pytest.importorskip("sklearn")
    job = run_command([PY, REPO / "examples" / "torch" / "elastic_digits.py", "--workers", "3",
                        "--fail-rank", "2", "--fail-epoch", "4"], timeout=300)
    assert job.returncode == 0, job.output[-8000:]
    for r in (0, 1):
        assert f"worker {r}: resumed as rank {r} of 2 at epoch 4" in job.output, \
            job.output[-8000:]
    m = re.search(r"final test accuracy: (\d\.\d+) on 2 workers \(parameters identical",
                  job.output)
    assert m and float(m.group(1)) >= 0.95, job.output[-4000:]


def test_compression_params_two_level():
    """DistributedOptimizer(compression_params=...) over 2 workers + 1 server: onebit (with and
    without scaling), topk, and topk with error feedback and Nesterov momentum taken from the
    optimizer; the parameters after each SGD step equal the NumPy two-level reference
    C(sum_i C(g_i / size)), the small bias is summed exactly; different dicts on the ranks give
    MismatchError on every rank."""
    job = launch_job(launch_config(2, 1), [PY, WORKERS / "compression_worker.py"], timeout=180,
                     job_env=framework_env({"BYTEPS_MIN_COMPRESS_BYTES": "4096"}))
    assert_marker(job, "TORCH_COMPRESS_OK", 2)
    assert job.output.count("TORCH_COMPRESS_MISMATCH_RAISED") == 2, job.output[-6000:]


@pytest.mark.parametrize("workers,servers,local_size", [(2, 1, None), (3, 2, None), (2, 1, 2)],
                         ids=["2w1s", "3w2s", "2wx2local1s"])
def test_horovod_allreduce_ops(workers, servers, local_size):
    """hvd.allreduce / allreduce_ / allreduce_async / allreduce_async_ with every Horovod op
    and dtype, the scale factors, gradients and Horovod's errors."""
    job = launch(WORKERS / "allreduce_worker.py", workers, servers, local_size, timeout=300)
    assert_marker(job, "TORCH_ALLREDUCE_OK", workers * (local_size or 1))


@pytest.mark.parametrize("workers,servers,local_size", [(2, 1, None), (3, 1, None), (2, 1, 2)],
                         ids=["2w1s", "3w1s", "2wx2local1s"])
def test_sync_batch_norm_equals_batch_norm_on_the_whole_batch(workers, servers, local_size):
    """SyncBatchNorm on every rank's batch (different sizes) against torch.nn.BatchNorm on
    their concatenation: outputs, gradients and running statistics over three steps."""
    job = launch(WORKERS / "sync_batch_norm_worker.py", workers, servers, local_size,
                 timeout=240)
    assert_marker(job, "TORCH_SYNCBN_OK", workers * (local_size or 1))


@pytest.mark.parametrize("workers,servers,local_size", [(2, 1, None), (3, 1, None), (2, 1, 2)],
                         ids=["2w1s", "3w1s", "2wx2local1s"])
def test_horovod_allgather_broadcast_reducescatter(workers, servers, local_size):
    """hvd.allgather / broadcast / reducescatter and their async, in-place and grouped forms on
    every dtype, with Horovod's gradients and errors."""
    job = launch(WORKERS / "gather_scatter_worker.py", workers, servers, local_size, timeout=300)
    assert_marker(job, "TORCH_GATHER_SCATTER_OK", workers * (local_size or 1))


@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)], ids=["2w1s", "3w2s"])
def test_horovod_join(workers, servers):
    """hvd.join: the others' allreduce, allgather and broadcast without the joined rank, the
    same last rank everywhere, and DistributedOptimizer over uneven data."""
    job = launch(WORKERS / "join_worker.py", workers, servers, timeout=240)
    assert_marker(job, "TORCH_JOIN_OK", workers)


@pytest.mark.parametrize("workers,servers,local_size", [(3, 2, None), (2, 1, 2)],
                         ids=["3w2s", "2wx2local1s"])
def test_horovod_process_sets(workers, servers, local_size):
    """Horovod's process sets: every collective, the gradients, the object functions and
    DistributedOptimizer(process_set=...) among a set's ranks, while another set runs its own;
    an operation of another set is an error."""
    job = launch(WORKERS / "process_sets_worker.py", workers, servers, local_size, timeout=240)
    assert_marker(job, "TORCH_PROCESS_SETS_OK", workers * (local_size or 1))


@pytest.mark.parametrize("workers,servers,local_size", [(2, 1, None), (2, 1, 2)],
                         ids=["2w1s", "2wx2local1s"])
def test_horovod_optimizer_options(workers, servers, local_size):
    """DistributedOptimizer with Horovod's op, gradient_predivide_factor, num_groups / groups
    and sparse gradients (allgathered, or sparse_as_dense) against the ranks' own gradients."""
    job = launch(WORKERS / "horovod_optimizer_worker.py", workers, servers, local_size,
                 timeout=240)
    assert_marker(job, "TORCH_HVD_OPT_OK", workers * (local_size or 1))


@pytest.mark.parametrize("workers,local_size", [(2, None), (2, 2)], ids=["2w1s", "2wx2local1s"])
def test_horovod_synthetic_benchmark_runs_unchanged(workers, local_size):
    """examples/horovod/pytorch_synthetic_benchmark.py: a script written against Horovod's API
    (SyncBatchNorm, DistributedOptimizer with op and compression, the broadcasts, allreduce and
    allgather of metrics) runs with only its import changed; the ranks end with identical
    parameters and the averaged loss is the mean of the gathered ones."""
    job = launch(REPO / "examples" / "horovod" / "pytorch_synthetic_benchmark.py", workers, 1,
                 local_size, timeout=240, args=["--num-iters", "2", "--num-batches-per-iter",
                                                "2", "--batch-size", "8"])
    assert job.returncode == 0, job.output[-8000:]
    n = workers * (local_size or 1)
    assert f"Total img/sec on {n} CPU(s)" in job.output, job.output[-4000:]
    assert "Parameters identical on all ranks: True" in job.output, job.output[-4000:]
    m = re.search(r"Average last loss over \d+ ranks: ([\d.]+) \(per rank: ([^)]*)\)",
                  job.output)
    assert m, job.output[-4000:]
    per_rank = [float(v) for v in m.group(2).split(", ")]
    assert len(per_rank) == n and abs(sum(per_rank) / n - float(m.group(1))) < 1e-3
