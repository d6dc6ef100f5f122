"""The test support every test directory shares: the oracle of expected push_pull results
(tests/oracle.py) and the job runner (tests/jobs.py): its timeout kills the launcher's whole
process group, its per-rank output parsing. No byteps core needed (single-machine jobs start no
scheduler or server)."""

from __future__ import annotations

import re
import sys
import time

import jobs
import numpy as np
import oracle
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")


def test_oracle_sum_and_averages():
    inputs = {0: [-3, 4, 7], 1: [2, -9, 0], 2: [0, 1, 2]}
    total = oracle.expected_sum(lambda r: inputs[r], 3)
    assert total.dtype == np.int64 and total.tolist() == [-1, -4, 9]
    # integer average: floor division (-1 // 3 == -1, -4 // 3 == -2)
    avg = oracle.expected_push_pull(lambda r: inputs[r], 3, average=True, dtype="int32")
    assert avg.dtype == np.int64 and avg.tolist() == [-1, -2, 3]
    favg = oracle.expected_push_pull(lambda r: inputs[r], 3, average=True, dtype="bfloat16")
    assert favg.dtype == np.float64 and favg.tolist() == [-1 / 3, -4 / 3, 3.0]
    # scalars give 0-d arrays, not NumPy scalars
    s = oracle.expected_push_pull(lambda r: r, 4, average=True, dtype="float32")
    assert isinstance(s, np.ndarray) and s.shape == () and float(s) == 1.5


def test_oracle_rank_data_is_exact_in_every_dtype():
    for dtype in ("int8", "uint8", "float16", "bfloat16", "int64"):
        v = oracle.rank_data(3, (4, 5), dtype, salt=2)
        assert v.shape == (4, 5) and v.dtype == np.int64
        lo, hi = (0, 10) if dtype == "uint8" else (-5, 5)
        assert v.min() >= lo and v.max() <= hi
    assert not np.array_equal(oracle.rank_data(0, (8,)), oracle.rank_data(1, (8,)))
    assert oracle.rank_data(0, ()).shape == ()


def test_oracle_refuses_inexact_inputs():
    with pytest.raises(ValueError, match="rank 1 is not integer-valued"):
        oracle.expected_sum(lambda r: np.full(3, r * 0.5), 2)
    with pytest.raises(ValueError, match="size"):
        oracle.expected_sum(lambda r: r, 0)


def test_rank_lines_and_world_size():
    out = "[worker 0] a\n[scheduler] x\n[worker 1] b\n[worker 10] c\n[worker 0] d\n"
    assert jobs.rank_lines(out, 2) == {0: ["a", "d"], 1: ["b"]}
    assert jobs.world_size(jobs.launch_config(2, 1, local_size=3)) == 6
    assert jobs.launch_config(3) == ["--workers", "3"]


def test_job_runs_with_clean_env(monkeypatch):
    monkeypatch.setenv("BYTEPS_SOMETHING_OUTER", "1")
    code = ("import os; print('ROLE', os.environ.get('DMLC_ROLE'), "
            "os.environ.get('BYTEPS_SOMETHING_OUTER'))")
    job = jobs.launch_job(jobs.launch_config(2), [jobs.PY, "-c", code], timeout=60)
    assert job.returncode == 0, job.output
    lines = jobs.rank_lines(job.output, 2)
    assert lines[0] == lines[1] == ["ROLE worker None"], job.output


def test_timeout_kills_the_launchers_process_group():
    code = "import os, time; print('PID', os.getpid(), flush=True); time.sleep(120)"
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish within 3 s") as err:
        jobs.launch_job(jobs.launch_config(2), [jobs.PY, "-c", code], timeout=3)
    assert time.monotonic() - t0 < 30
    pids = [int(p) for p in re.findall(r"\[worker \d\] PID (\d+)", str(err.value))]
    assert len(pids) == 2, str(err.value)
    deadline = time.monotonic() + 10
    while any(jobs.alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if jobs.alive(p)]
