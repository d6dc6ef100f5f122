"""Asynchronous training with byteps.torch (``BYTEPS_ENABLE_ASYNC=1``; docs/async.md), real jobs
started by ``python -m byteps.launch``.

* the digits example converges in asynchronous mode with 2 and 4 workers to within 2 accuracy
  points of synchronous training (the 4-worker pair is in the slow session);
* a slow worker (sleeping 50 ms per step) does not slow the others: the fast workers' steps/s
  stay many times the slow one's, with no staleness bound;
* BYTEPS_ASYNC_MAX_STALENESS=1: the fast worker never completes step r before the slow one has
  started step r - 1 (times of both recorded on the same monotonic clock);
* a worker SIGKILLed mid-run: the others finish every step, the launcher reports it and goes
  on, and the servers' parameters are consistent: every survivor reads the same bytes, equal to
  rank 0's initial value plus every delta each worker pushed (the dead one's up to its last
  completed step), to float64 rounding;
* one worker: two runs give bit-identical parameters, equal bit for bit to local SGD with the
  server's arithmetic (p + (p' - p)) and to 1e-6 to plain local SGD; CrossBarrier and
  DistributedDataParallel raise UsageError in asynchronous mode;
* a BYTEPS_ENABLE_ASYNC mismatch between nodes is a ConfigError on every worker;
* a dead server is still a PeerLostError on every worker; after an elastic restart the new
  servers start from rank 0's checkpoint (read from the old ones with pull_parameters).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from jobs import PY, REPO, Group, framework_env, free_port, launch_config, launch_job

pytest.importorskip("torch")
pytest.importorskip("byteps._core", reason="the byteps core is not built")

pytestmark = pytest.mark.torch

WORKER = Path(__file__).resolve().parent / "workers" / "async_worker.py"
DIGITS = REPO / "examples" / "torch" / "train_digits.py"


def job(workers, args, tmp, extra=None, timeout=180, servers=1):
    env = framework_env({"BYTEPS_ENABLE_ASYNC": "1", **(extra or {})})
    return launch_job(launch_config(workers, servers), [PY, WORKER, tmp, *map(str, args)],
                      timeout=timeout, job_env=env)


def records(tmp, ranks):
    return {r: json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in ranks}


def digits_accuracy(workers, async_mode, epochs=8):
    env = framework_env({"BYTEPS_ENABLE_ASYNC": "1" if async_mode else "0"})
    res = launch_job(launch_config(workers, 1), [PY, DIGITS, "--epochs", str(epochs)],
                     timeout=240, job_env=env)
    assert res.returncode == 0, res.output[-6000:]
    mode = "asynchronous" if async_mode else "synchronous"
    assert f"{mode} training on {workers} workers" in res.output, res.output[-3000:]
    assert f"parameters identical on all {workers} workers" in res.output
    m = re.search(r"final test accuracy: (\d\.\d+)", res.output)
    assert m, res.output[-4000:]
    return float(m.group(1))


@pytest.mark.parametrize("workers", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_digits_async_converges_like_sync(workers):
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    sync = digits_accuracy(workers, False)
    asyn = digits_accuracy(workers, True)
    print(f"digits, {workers} workers: sync {sync:.3f}, async {asyn:.3f}")
    assert asyn >= 0.93 and abs(asyn - sync) <= 0.02, (sync, asyn)


def test_slow_worker_does_not_slow_the_others(tmp_path):
    res = job(2, ["--steps", "150", "--slow-rank", "1", "--sleep", "0.05", "--slow-steps", "12"],
              tmp_path)
    assert res.returncode == 0, res.output[-6000:]
    rec = records(tmp_path, range(2))
    slow, fast = rec[1]["steps_per_s"], rec[0]["steps_per_s"]
    print(f"steps/s: fast {fast:.0f}; slow {slow:.1f}")
    assert slow < 20
    assert fast > 4 * slow, (fast, slow)
    # The fast one finished while the slow one was still stepping.
    assert rec[0]["done"][-1] < rec[1]["done"][-1]


def test_staleness_bound_is_enforced(tmp_path):
    s = 1
    res = job(2, ["--steps", "25", "--slow-rank", "1", "--sleep", "0.03"], tmp_path,
              {"BYTEPS_ASYNC_MAX_STALENESS": str(s)})
    assert res.returncode == 0, res.output[-6000:]
    rec = records(tmp_path, (0, 1))
    slow_start = np.array(rec[1]["start"])
    lead = []
    for r, t_done in enumerate(rec[0]["done"], start=1):
        started = int((slow_start <= t_done).sum())  # slow steps whose push had begun
        lead.append(r - started)
    print(f"fast worker's lead over the slow one (steps), max {max(lead)}")
    assert max(lead) <= s, lead
    assert max(lead) == s  # the bound is what held it (the fast one would run far ahead)
    # Held back: the fast worker took about as long as the slow one.
    assert rec[0]["done"][-1] - rec[0]["done"][0] > 0.5 * 24 * 0.03


def test_worker_killed_mid_run_leaves_the_others_and_consistent_parameters(tmp_path):
    res = job(3, ["--steps", "60", "--die-rank", "1", "--die-step", "10", "--deltas",
                  "--dtype", "float64"], tmp_path, {"BYTEPS_HEARTBEAT_TIMEOUT": "5"})
    # The launcher reports the death and lets the others finish (exit code: the dead one's).
    assert res.returncode == 137, res.output[-6000:]
    assert "the other workers go on" in res.output, res.output[-6000:]
    for r in (0, 2):
        assert f"ASYNC_WORKER_OK rank={r} steps=60" in res.output, res.output[-6000:]
    rec = records(tmp_path, (0, 2))
    # They kept training: no step of theirs waited anywhere near a timeout.
    for r in (0, 2):
        gaps = np.diff(rec[r]["done"])
        assert gaps.max() < 2.0, (r, gaps.max())
    finals = [np.load(tmp_path / f"final{r}.npz") for r in (0, 2)]
    init = np.load(tmp_path / "init.npz")
    deltas = [np.load(tmp_path / f"delta{r}.npz") for r in range(3)]
    for name in init.files:
        assert finals[0][name].tobytes() == finals[1][name].tobytes(), name
        want = init[name] + sum(d[name] for d in deltas)
        np.testing.assert_allclose(finals[0][name], want, rtol=1e-9, atol=1e-12, err_msg=name)
    # The dead worker's deltas are in: without them the parameters would differ.
    assert any(np.abs(deltas[1][n]).max() > 1e-6 for n in init.files)


def test_one_worker_is_deterministic_and_equals_local_sgd(tmp_path):
    digests = []
    for i in range(2):
        out = tmp_path / str(i)
        out.mkdir()
        res = job(1, ["--steps", "40", "--reference"] + (["--check-refusals"] if i else []), out)
        assert res.returncode == 0, res.output[-6000:]
        digests.append(records(out, [0])[0]["digest"])
    assert digests[0] == digests[1]


def test_async_mismatch_is_a_config_error_on_every_worker(tmp_path):
    code = ("import byteps.torch as bps\nfrom byteps.errors import ConfigError\n"
            "try:\n    bps.init()\nexcept ConfigError as e:\n"
            "    print('ASYNC_MISMATCH_CONFIG_ERROR', 'BYTEPS_ENABLE_ASYNC' in str(e))\n")
    env = framework_env({"BYTEPS_ENABLE_ASYNC": "1"})
    # Worker 1 alone says 0 (the launcher's --env reaches every process, so set it per rank).
    script = tmp_path / "w.py"
    script.write_text("import os\nif os.environ['DMLC_WORKER_ID'] == '1':\n"
                      "    os.environ['BYTEPS_ENABLE_ASYNC'] = '0'\n" + code)
    res = launch_job(launch_config(2, 1), [PY, script], timeout=120, job_env=env)
    assert res.output.count("ASYNC_MISMATCH_CONFIG_ERROR True") == 2, res.output[-6000:]


@pytest.mark.timeout(240)
def test_dead_server_fails_every_worker_and_resume_keeps_the_parameters(tmp_path):
    """A server SIGKILLed: every worker gets PeerLostError (asynchronous mode keeps the dead
    server a job failure), suspends; new scheduler and server at the same address; after
    resume() each worker loads its checkpoint (taken with pull_parameters) and reads the new
    servers' parameters: rank 0's checkpoint on every worker."""
    restart = tmp_path / "restart.json"
    base = framework_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
                          "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2",
                          "BYTEPS_SECRET": os.urandom(16).hex(), "BYTEPS_ENABLE_ASYNC": "1",
                          "BYTEPS_TIMEOUT": "60", "BYTEPS_HEARTBEAT_TIMEOUT": "5"})
    service = [PY, "-m", "byteps.server"]

    with Group() as group:  # stops (by PID) whatever still runs on the way out

        def services():
            return [group.start(service, dict(base, DMLC_ROLE=role), label=role)
                    for role in ("scheduler", "server")]

        old = services()
        script = Path(__file__).resolve().parent / "workers" / "async_elastic_worker.py"
        workers = [group.start([PY, script, str(restart)],
                               dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID=str(i)),
                               label=f"worker {i}") for i in range(2)]
        for w in workers:
            w.wait_line("READY", 90)
        t_kill = time.monotonic()
        os.kill(old[1].pid, signal.SIGKILL)
        for w in workers:
            assert w.wait_line("SUSPENDED", 30) == "SUSPENDED PeerLostError"
        t_failed = time.monotonic() - t_kill
        old[0].wait(30)
        services()
        restart.write_text(json.dumps({"num_workers": 2, "num_servers": 1,
                                       "ranks": {"0": 0, "1": 1}}))
        for w in workers:
            w.wait_line("RESUMED", 90)
        Path(f"{restart}.go").write_text("")
        for w in workers:
            assert w.wait(90) == 0, "\n".join(w.lines[-40:])
    root = workers[0].wait_line("CHECKPOINT", 1).split()[1]
    for w in workers:
        assert w.wait_line("RESUMED", 1) == f"RESUMED {root}", w.lines[-20:]
        assert w.lines[-1] == "OK", w.lines[-20:]
    print(f"async elastic: workers failed {t_failed:.2f} s after the server was killed")
