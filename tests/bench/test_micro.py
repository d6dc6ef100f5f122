"""Smoke test of ``python -m benchmarks``: the quick micro + sum benchmarks with tiny sizes.

Runs the real jobs (``bpslaunch`` local and forced-distributed, the latter also on the UCX van
over shared memory where byteps has UCX; gloo; raw TCP) and the summation kernels, then checks
that the report has every section, that the plots were written and that every measured number
is positive and finite. Marked ``bench``: its own nox session.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /dev/shm"),
    pytest.mark.timeout(240),
]

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

SECTIONS = (
    "# Performance",
    "Regenerate: `python -m benchmarks --quick",
    "## Targets, measured in this run",
    "## Loopback microbenchmarks",
    "### push_pull vs gloo all_reduce versus size",
    "### Forced-distributed socket throughput vs raw TCP",
    "### One tensor at a time, and first-use (declare) cost",
    "## Summation kernels",
    "### 1 thread",
    "## Notes and history",
)


def _numbers(obj, path=""):
    """Every int/float leaf of a JSON document with its path (bools and plan settings aside)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k not in ("plan", "machine", "elapsed_s", "command", "date"):
                yield from _numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def test_quick_micro_and_sum(tmp_path):
    from benchmarks import cli, vans

    out, img, raw = tmp_path / "performance.md", tmp_path / "img", tmp_path / "results.json"
    rc = cli.main(["--quick", "--only", "micro,sum", "--out", str(out), "--img-dir", str(img),
                   "--json", str(raw), "--sizes", "4K", "64K", "1M", "--count", "20",
                   "--repeats", "1", "--sum-size-mib", "4", "--no-progress"])
    assert rc == 0
    page = out.read_text()
    for heading in SECTIONS:
        assert heading in page, heading
    for png in ("micro_latency.png", "micro_bandwidth.png", "sum_throughput.png"):
        assert (img / png).stat().st_size > 1000, png
        assert f"(img/{png})" in page
    # every target has a verdict column; the judged ones say met or missed
    assert page.count("**met**") + page.count("**missed**") >= 8

    data = json.loads(raw.read_text())["results"]
    assert set(data) == {"micro", "sum"}
    van_jobs = {f"dist:{v}" for v in data["micro"]["plan"]["vans"] if v != "tcp"}
    assert van_jobs == ({"dist:ucx-shm"} if vans.ucx_built() else set())
    assert set(data["micro"]["jobs"]) == {"local", "dist", "gloo", "tcp"} | van_jobs
    for job in ("local", "dist", "gloo", *van_jobs):
        assert sorted(int(k) for k in data["micro"]["jobs"][job]["latency"]) == [
            4096, 65536, 1 << 20]
    nums = list(_numbers(data))
    assert len(nums) > 50
    for path, value in nums:
        assert math.isfinite(value) and value > 0, (path, value)
    # plausibility: a 4 KiB operation takes between 1 µs and 1 s; GB/s figures below 10 TB/s
    for job in ("local", "dist", "gloo", *van_jobs):
        assert 1e-6 < data["micro"]["jobs"][job]["latency"]["4096"] < 1.0
    for dtype, by_threads in data["sum"]["rows"].items():
        for row in by_threads.values():
            assert all(0.01 < v < 10_000 for v in row.values()), (dtype, row)


def test_render_from_json_without_measuring(tmp_path):
    """--from-json re-renders a report from saved results (no jobs started)."""
    from benchmarks import cli, report

    fake_micro = {
        "plan": {"repeats": 1}, "world": 2,
        "descriptions": {"local": "L", "dist": "D", "gloo": "G", "tcp": "T"},
        "jobs": {
            j: {"latency": {"4096": t, str(64 << 20): t * 1000},
                "best": {"4096": t, str(64 << 20): t * 1000},
                "iters": {"4096": 5, str(64 << 20): 5},
                "one_at_a_time": {"count": 10, "nbytes": 4096, "seq_s": t * 12,
                                  "batched_s": t * 5, "steady_per_op_s": t},
                **({"declare_per_call_s": 1e-6} if j != "gloo" else {})}
            for j, t in (("local", 1e-4), ("dist", 2e-4), ("gloo", 3e-4))},
    }
    fake_micro["jobs"]["tcp"] = {"bytes": 1 << 30, "chunk": 1 << 24, "single_Bps": 3e9,
                                 "dual_Bps": 4e9, "repeats": 2}
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"command": "python -m benchmarks", "elapsed_s": 1.0, "date": "d",
                                 "machine": {"cpu": "X"}, "results": {"micro": fake_micro}}))
    out = tmp_path / "p.md"
    assert cli.main(["--from-json", str(saved), "--out", str(out)]) == 0
    page = out.read_text()
    assert "| 64 MiB local push_pull ≥ 3× gloo all_reduce | gloo / byteps ≥ 3 |" in page
    assert "3.00×" in page and "**met**" in page
    assert "## Summation kernels" not in page
    # the hand-written notes are linked, not copied: their headings stay out of the page
    notes = Path(report.NOTES_PATH).read_text()
    assert "](performance-notes.md)" in page
    headings = [line for line in notes.splitlines() if line.startswith("## ")]
    assert headings and not any(h in page.splitlines() for h in headings)
    assert page.startswith("# Performance\n\n<!-- Generated by `python -m benchmarks`")


def test_page_ends_with_the_link_to_the_notes():
    from benchmarks import report

    page = report.render([], command="c", info={"cpu": "X"}, date="d")
    assert page.rstrip().endswith("(hand-written; this page is generated).")
    assert "## Notes and history" in page and "## Targets" not in page
