"""Multi-process tests of byteps.tensorflow / byteps.keras through the launcher
(``python -m byteps.launcher``): workers/tf_worker.py runs every check on every rank (push_pull
and broadcast for every dtype eagerly and in tf.function, broadcast_variables, gradients,
DistributedGradientTape and the Keras DistributedOptimizer against single-process training,
callbacks, load_model, Embedding/IndexedSlices), and both examples train to >= 95 %."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tensorflow

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _launch(script, workers, servers, args=(), timeout=240):
    cmd = [sys.executable, "-m", "byteps.launcher", "--workers", str(workers), "--servers",
           str(servers), "--", sys.executable, str(script), *map(str, args)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{script} timed out after {timeout}s; output tail:\n{out[-6000:]}")
    return proc


@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)])
def test_tf_worker(tmp_path, workers, servers):
    proc = _launch(HERE / "workers" / "tf_worker.py", workers, servers, args=[tmp_path])
    out = proc.stdout
    assert proc.returncode == 0, f"exit code {proc.returncode}; output tail:\n{out[-8000:]}"
    assert out.count("TF_WORKER_OK") == workers, out[-8000:]
    assert "TF_WORKER_FAILED" not in out


@pytest.mark.parametrize("example", ["keras_digits.py", "tape_digits.py"])
def test_example(example):
    proc = _launch(REPO / "examples" / "tensorflow" / example, 2, 1, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, f"exit code {proc.returncode}; output tail:\n{out[-8000:]}"
    accs = [float(a) for a in re.findall(r"final test accuracy: (\d\.\d+)", out)]
    assert len(accs) == 2 and all(a >= 0.95 for a in accs), out[-4000:]
    assert accs[0] == accs[1]
    # the per-epoch metrics printed by the two ranks are identical
    lines = re.findall(r"\[rank (\d)\] (epoch \d+: .*)", out)
    by_rank = {r: sorted(text for rr, text in lines if rr == r) for r in ("0", "1")}
    assert by_rank["0"] and by_rank["0"] == by_rank["1"], out[-4000:]
