"""byteps.mxnet across real processes (``-m mxnet``; nox session ``mxnet``, its own venv).

The conformance suite (tests/conformance, ``-m mxnet``) covers the semantic cases; here: the
Gluon example, the Module API, upstream's single-worker forced-distributed tests in upstream
launcher mode, bad input, and a dead server surfacing as ``PeerLostError`` at the next read.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import jobs
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKER = HERE / "workers" / "mxnet_worker.py"

pytestmark = pytest.mark.mxnet
pytest.importorskip("mxnet")
pytest.importorskip("byteps._core", reason="the byteps core is not built")


def _run(config, mode, timeout=240, env=()):
    rc, out, secs = jobs.run_job(config, mode, env=env, timeout=timeout, script=WORKER)
    return rc, out, secs


def test_example_gluon_digits():
    """The README's MXNet job: 2 workers, 1 server, accuracy >= 0.95, identical parameters."""
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    job = jobs.launch_job(jobs.launch_config(2, 1),
                          [jobs.PY, REPO / "examples" / "mxnet" / "gluon_digits.py"],
                          timeout=300)
    assert job.returncode == 0, job.output[-8000:]
    m = re.search(r"final test accuracy: (\d\.\d+)", job.output)
    assert m, job.output[-8000:]
    assert float(m.group(1)) >= 0.95, job.output[-4000:]
    assert "parameters identical on all 2 workers" in job.output


@pytest.mark.parametrize("config, through_host", [("2w1s", False), ("3w2s", False),
                                                  ("2w1s", True)])
def test_module_api(config, through_host):
    """mx.mod.Module + DistributedOptimizer + broadcast_parameters: equals single-process
    training on the concatenated batches; parameters identical on every rank; push_pull of
    arrays whose storage MXNet has not allocated yet when the call is made. through_host: every
    array goes the way of a GPU NDArray (copied into a pinned host NDArray, push_pulled,
    copied back, each an engine operation)."""
    cfg = jobs.CONFIGS[config]
    rc, out, _ = _run(cfg, "module", env=["MXNET_WORKER_THROUGH_HOST=1"] if through_host else ())
    jobs.assert_ok(rc, out, jobs.world_size(cfg), min_cases=3)


@pytest.mark.parametrize("config, through_host", [("2w1s", False), ("3w2s", False),
                                                  ("2w1s_local2", False), ("2w1s", True)])
def test_horovod_allreduce_ops(config, through_host):
    """bps.allreduce / allreduce_ with Average, Sum, Min, Max, Product on every dtype (the
    servers and the local reduce combine with the op), the scale factors, Horovod's errors;
    through_host: the GPU NDArray's way, through a pinned host copy."""
    cfg = jobs.CONFIGS[config]
    rc, out, _ = _run(cfg, "allreduce",
                      env=["MXNET_WORKER_THROUGH_HOST=1"] if through_host else ())
    jobs.assert_ok(rc, out, jobs.world_size(cfg), min_cases=37)


@pytest.mark.parametrize("config", ["2w1s", "2w1s_local2"])
def test_horovod_allgather_broadcast_reducescatter(config):
    """bps.allgather (uneven), broadcast / broadcast_ from every root, reducescatter Sum and
    Average on NDArrays, and Horovod's op error."""
    cfg = jobs.CONFIGS[config]
    rc, out, _ = _run(cfg, "gather_scatter")
    jobs.assert_ok(rc, out, jobs.world_size(cfg), min_cases=10)


@pytest.mark.parametrize("through_host", [False, True])
def test_auto_declares_with_the_cost_models_choice(through_host):
    """BYTEPS_SYNC=auto with a stand-in cost model, 2 workers + 1 server: each name's first
    byteps_push_pull (the engine's path; through_host: a GPU NDArray's, via a pinned host copy)
    declares it with choose(nbytes) (ps, ring, tree by size) and sums exactly."""
    env = ["BYTEPS_SYNC=auto", "BYTEPS_TIMEOUT=60"]
    if through_host:
        env.append("MXNET_WORKER_THROUGH_HOST=1")
    cfg = jobs.CONFIGS["2w1s"]
    rc, out, _ = _run(cfg, "auto", env=env, timeout=150)
    jobs.assert_ok(rc, out, jobs.world_size(cfg), min_cases=6)


def test_bad_input():
    """Non-NDArray, sparse, unsupported dtype, empty name, invalid compressor options (of
    byteps_declare_tensor and of the trainer's compression_params), bad broadcast arguments,
    names, priorities: each a clear TypeError/ValueError that is also a
    byteps.errors.BytePSError; before init NotInitializedError."""
    rc, out, _ = _run(["--workers", "1"], "badinput", timeout=120)
    jobs.assert_ok(rc, out, 1, min_cases=22)


def test_upstream_single_worker_forced_distributed():
    """Upstream tests/test_mxnet.py + meta_test.py: DMLC_NUM_WORKER=1, a scheduler and a server
    started by bpslaunch in upstream (DMLC_ROLE) mode from that single-machine environment, and
    BYTEPS_FORCE_DISTRIBUTED=1 in the worker's environment only (as upstream does): push_pull of
    float16/32/64 arrays of shapes (17,), (17,17), (17,17,17) returns the input, and
    DistributedTrainer._init_params keeps every parameter."""
    base = jobs.clean_job_env({
        "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(jobs.free_port()),
        "BYTEPS_SECRET": "upstream-mode-test-secret-0123456789abcdef", "BYTEPS_TIMEOUT": "60",
        # upstream meta_test.py: everything in one partition
        "BYTEPS_PARTITION_BYTES": "2147483647",
    })
    with jobs.Group() as group:  # stops (by PID) whatever still runs on the way out
        services = [group.start([jobs.PY, "-m", "byteps.launch"], dict(base, DMLC_ROLE=role),
                                label=role) for role in ("scheduler", "server")]
        worker = jobs.run_command(
            [jobs.PY, WORKER, "upstream"], timeout=180,
            env=dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID="0", BYTEPS_FORCE_DISTRIBUTED="1"))
        codes = group.wait_all(60, services)
        outs = [p.output if c is not None else "(still running)"
                for p, c in zip(services, codes)]
        text = worker.output + "\n".join(outs)
        assert worker.returncode == 0, text[-8000:]
        assert "FAIL" not in worker.output, text[-8000:]
        assert "CASE-OK upstream_push_pull 9 tensors" in worker.output, text[-8000:]
        assert "CASE-OK upstream_trainer_param_order" in worker.output, text[-8000:]
        assert [p.returncode for p in services] == [0, 0], text[-8000:]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("through_host", [False, True])
def test_dead_server_raises_peer_lost_at_read(through_host):
    """kill -9 of the server while both workers push_pull in a loop: ``wait_to_read`` raises
    byteps.errors.PeerLostError (registered with MXNet's error table) naming the server and the
    operation on every worker, within 30 s; nothing of the job is left. through_host: the
    error of the host copy's push_pull reaches the tensor through the copy back."""
    cfg = jobs.CONFIGS["2w1s"]
    env = ["BYTEPS_TIMEOUT=100"] + (["MXNET_WORKER_THROUGH_HOST=1"] if through_host else [])
    with jobs.LiveJob(cfg, "loop", env=env, grace=40, script=WORKER) as job:
        job.wait_for(r"^\[worker \d\] READY", count=2)
        job.snapshot()
        job_id = job.job_id
        t_kill = time.time()
        os.kill(job.find("server"), signal.SIGKILL)
        for r in (0, 1):
            m = job.wait_for(rf"^\[worker {r}\] CAUGHT-PEERLOST (\d+\.\d+) (.*)$", timeout=45)[0]
            t_err, msg = float(m.group(1)), m.group(2)
            print(f"worker {r}: PeerLostError {t_err - t_kill:.2f} s after kill -9: {msg}")
            assert t_err - t_kill < 30, msg
            assert "server" in msg.lower() and "push_pull of 'loop'" in msg, msg
        rc = job.wait(60)
        assert rc != 0, job.output[-6000:]
        assert not jobs.job_pids_alive(job.seen_pids, job_id, timeout=10)


def test_compression_params_two_level():
    """DistributedTrainer(compression_params=...) over 2 workers + 1 server, upstream's
    semantics: onebit (with and without scaling), topk, and onebit + error feedback + Nesterov
    momentum + weight decay from optimizer_params (Compression.nag / wdmom) give, after each SGD
    step, the parameters of the NumPy two-level reference of gradients scaled by
    1/(batch_size * size); the small bias is summed exactly; different dicts on the ranks give
    MismatchError on every rank."""
    rc, out, _ = jobs.launch_job(jobs.CONFIGS["2w1s"],
                                 [jobs.PY, HERE / "workers" / "compression_worker.py"],
                                 env=["BYTEPS_MIN_COMPRESS_BYTES=4096"], timeout=180)
    jobs.assert_ok(rc, out, 2, min_cases=5)
    assert out.count("MXNET_COMPRESS_MISMATCH_RAISED") == 2, out[-6000:]


def test_async_trainer():
    """Asynchronous training (BYTEPS_ENABLE_ASYNC=1, docs/async.md), 2 workers + 1 server: the
    DistributedTrainer starts from rank 0's weights, the servers sum every worker's deltas,
    pull_parameters reads them (workers/async_worker.py)."""
    rc, out, _ = jobs.launch_job(jobs.launch_config(2, 1),
                                 [jobs.PY, HERE / "workers" / "async_worker.py"],
                                 env=["BYTEPS_ENABLE_ASYNC=1"], timeout=180)
    assert rc == 0, out[-6000:]
    assert out.count("MXNET_ASYNC_OK") == 2, out[-6000:]
