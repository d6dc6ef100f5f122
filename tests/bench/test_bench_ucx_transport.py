"""Smoke test of ``python -m benchmarks.ucx_transport`` (the UCX transport alone, per
``UCX_TLS``): one small run per transport list in its child process; the result holds the
timed frames, a median between the best and the slowest, the transport list UCX was given, and
the printed line says so. Marked ``bench``: its own nox session."""

from __future__ import annotations

import json

import pytest

from benchmarks import ucx_transport

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(ucx_transport.ucx_missing() is not None,
                       reason=ucx_transport.ucx_missing() or ""),
    pytest.mark.timeout(240),
]


@pytest.mark.parametrize("tls", ucx_transport.TLS)
def test_one_small_run_per_transport_list(tls):
    r = ucx_transport.run_tls(tls, size=1 << 20, iters=3, timeout=120)
    assert r["size"] == 1 << 20 and len(r["times"]) == 3, r
    assert 0 < r["min_s"] <= r["median_s"] <= max(r["times"]) < 60, r
    assert f"UCX_TLS={tls}" in r["config"], r["config"]
    assert r["rndv"] in range(5), r  # frames received by rendezvous, of the 4 sent
    assert ucx_transport.line(tls, r).startswith(f"UCX_TLS={tls}: 1 MiB in ")


def test_main_writes_every_transport_list(tmp_path, capsys):
    out = tmp_path / "ucx.json"
    assert ucx_transport.main(["--tls", "shm", "--size", "256K", "--iters", "1",
                               "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data) == {"shm"} and data["shm"]["size"] == 256 << 10
    assert capsys.readouterr().out.startswith("UCX_TLS=shm: 256 KiB in ")
