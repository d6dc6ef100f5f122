"""Multi-process tests of byteps.tensorflow / byteps.keras through the launcher
(``python -m byteps.launch``): workers/tf_worker.py runs every check on every rank (push_pull
and broadcast for every dtype eagerly and in tf.function, broadcast_variables, gradients,
DistributedGradientTape and the Keras DistributedOptimizer against single-process training,
callbacks, load_model, Embedding/IndexedSlices), and both examples train to >= 95 %."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jobs import PY, REPO, assert_marker, framework_env, launch_config, launch_job

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tensorflow

HERE = Path(__file__).resolve().parent


def _launch(script, workers, servers, args=(), timeout=240):
    return launch_job(launch_config(workers, servers), [PY, script, *args], timeout=timeout,
                      job_env=framework_env())


@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)])
def test_tf_worker(tmp_path, workers, servers):
    job = _launch(HERE / "workers" / "tf_worker.py", workers, servers, args=[tmp_path])
    assert_marker(job, "TF_WORKER_OK", workers)
    assert "TF_WORKER_FAILED" not in job.output


@pytest.mark.parametrize("example", ["keras_digits.py", "tape_digits.py"])
def test_example(example):
    job = _launch(REPO / "examples" / "tensorflow" / example, 2, 1, timeout=180)
    out = job.output
    assert job.returncode == 0, f"exit code {job.returncode}; output tail:\n{out[-8000:]}"
    accs = [float(a) for a in re.findall(r"final test accuracy: (\d\.\d+)", out)]
    assert len(accs) == 2 and all(a >= 0.95 for a in accs), out[-4000:]
    assert accs[0] == accs[1]
    # the per-epoch metrics printed by the two ranks are identical
    lines = re.findall(r"\[rank (\d)\] (epoch \d+: .*)", out)
    by_rank = {r: sorted(text for rr, text in lines if rr == r) for r in ("0", "1")}
    assert by_rank["0"] and by_rank["0"] == by_rank["1"], out[-4000:]


def test_compression_params_two_level():
    """compression_params over 2 workers + 1 server: DistributedGradientTape (onebit with and
    without scaling, eager) and the Keras DistributedOptimizer in tf.function (topk; topk +
    error feedback + Nesterov momentum from the optimizer, learning rate changing every step)
    give the parameters of the NumPy two-level reference C(sum_i C(g_i / size)) after each SGD
    step; the small bias is summed exactly; different dicts on the ranks give MismatchError on
    every rank."""
    job = launch_job(launch_config(2, 1), [PY, HERE / "workers" / "compression_worker.py"],
                     timeout=180, job_env=framework_env({"BYTEPS_MIN_COMPRESS_BYTES": "4096"}))
    assert_marker(job, "TF_COMPRESS_OK", 2)
    assert job.output.count("TF_COMPRESS_MISMATCH_RAISED") == 2, job.output[-6000:]


def test_async_optimizers(tmp_path):
    """Asynchronous training (BYTEPS_ENABLE_ASYNC=1, docs/async.md), 2 workers + 1 server:
    the Keras DistributedOptimizer (eager and in model.fit) and the tf.compat.v1 wrapper start
    from rank 0's weights and the servers sum every worker's deltas
    (workers/async_worker.py)."""
    job = launch_job(launch_config(2, 1), [PY, HERE / "workers" / "async_worker.py"],
                     timeout=180, job_env=framework_env({"BYTEPS_ENABLE_ASYNC": "1"}))
    assert_marker(job, "TF_ASYNC_OK", 2)


def test_horovod_tf2_synthetic_benchmark_runs_unchanged():
    """examples/horovod/tensorflow2_synthetic_benchmark.py: a script written against Horovod's
    TensorFlow API (DistributedGradientTape with compression in a tf.function step,
    broadcast_variables of the model and the optimizer, SyncBatchNormalization, allreduce and
    allgather of metrics, join) runs with only its import changed; the ranks end with identical
    parameters and the averaged loss is the mean of the gathered ones."""
    job = _launch(REPO / "examples" / "horovod" / "tensorflow2_synthetic_benchmark.py", 2, 1,
                  args=["--num-iters", "2", "--num-batches-per-iter", "2", "--batch-size", "8"],
                  timeout=240)
    assert job.returncode == 0, job.output[-8000:]
    assert "Total img/sec on 2 CPU(s)" in job.output, job.output[-4000:]
    assert "Parameters identical on all ranks: True" in job.output, job.output[-4000:]
    m = re.search(r"Average last loss over 2 ranks: ([\d.]+) \(per rank: ([^)]*)\)",
                  job.output)
    assert m, job.output[-4000:]
    per_rank = [float(v) for v in m.group(2).split(", ")]
    assert len(per_rank) == 2 and abs(sum(per_rank) / 2 - float(m.group(1))) < 1e-3
    assert re.search(r"Last rank to join: [01]\b", job.output), job.output[-4000:]
