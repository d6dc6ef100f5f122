"""byteps.sim: the what-if simulator against the emulated cluster's recorded times (the lab's
benchmarks.sim_recorded and benchmarks.sim_compare), the model table's convention, the profiles
and the CLI."""

import json

import pytest

from benchmarks import sim_compare as validate
from benchmarks import sim_recorded as recorded
from byteps import sim
from byteps.errors import InvalidArgumentError
from byteps.sim import models, profiles, report


@pytest.fixture(scope="module")
def validation_rows():
    return validate.all_rows()


def test_recorded_data_names_its_commits():
    assert recorded.TABLE1["commit"] and recorded.SCHED["commit"]
    assert len(recorded.TABLE1["rows"]) == 15
    assert sum(len(v) for v in recorded.SCHED["rows"].values()) == 14
    assert recorded.TABLE1_MIXED["commit"] and len(recorded.TABLE1_MIXED["rows"]) == 1
    assert recorded.SCHEMES["commit"] and len(recorded.SCHEMES["rows"]) == 32


#: Schemes rows from 4 MiB up known to miss 10 %: HiPS at k = 4, 4 MiB (0.88 x measured; the
#: four servers' summation and store-and-forward on the run's two shared cores, not modelled).
SCHEMES_MISSES = {"hips n=4 k=4 4 MiB": 0.15}


def test_schemes_simulated_against_measured():
    """The synchronisation schemes' recorded push_pulls from 4 MiB up (below, the fixed 50 µs
    latency misses the host's per-message cost), simulated: the tree pipelines partitions
    through its busiest link (the ring's bytes at n = 4: 1.33 x measured when its up and down
    passes were counted one after the other), HiPS with byteps's servers (one first-level
    server per group on one link: 0.36-0.46 x measured with a server on every machine)."""
    rows = [r for r in validate.schemes() if r["nbytes"] >= 4 << 20]
    assert len(rows) == 16
    bad = [(r["label"], round(r["ratio"], 3)) for r in rows
           if abs(r["ratio"] - 1) > SCHEMES_MISSES.get(r["label"], validate.TOLERANCE)]
    assert not bad, bad
    ratio = {r["label"]: r["ratio"] for r in rows}
    # k = 0: byteps ranks the colocated servers by host, so first-level server 1 runs on
    # machine 1 and serves machines 2 and 3: 4 S on that link, against 3 S at k = 4
    assert ratio["hips n=4 k=0 64 MiB"] == pytest.approx(0.98, abs=0.01)
    assert ratio["tree n=4 k=0 64 MiB"] == pytest.approx(1.00, abs=0.01)


def test_simulated_within_10_percent_of_measured(validation_rows):
    assert len(validation_rows) == 46
    bad = [(r["label"], round(r["ratio"], 3)) for r in validation_rows
           if abs(r["ratio"] - 1) > validate.TOLERANCE]
    assert not bad, bad


def test_the_shapers_burst_is_what_the_4_mib_rows_needed():
    """The emulated links' tbf buckets pass their first 400 000 bytes above the shaped rate:
    without them the recorded n = 4, k = 2 push_pull of 4 MiB comes out 1.19 x measured, with
    them within 10 %; at 256 MiB the burst is a rounding error."""
    row = {(n, k, m): t for n, k, m, _, t, _ in recorded.TABLE1["rows"]}
    B = 765e6 / 8
    plain = validate.table1_row(4, 2, 4 << 20, B, adaptive_credit=False, shaper_burst=0)
    shaped = validate.table1_row(4, 2, 4 << 20, B, adaptive_credit=False)
    assert plain / row[(4, 2, 4 << 20)] > 1.15
    assert abs(shaped / row[(4, 2, 4 << 20)] - 1) <= validate.TOLERANCE
    big = [validate.table1_row(4, 4, 256 << 20, B, adaptive_credit=False, shaper_burst=b)
           for b in (0, recorded.EMULATED_SHAPER_BURST)]
    assert big[1] < big[0] and big[1] / big[0] > 0.995


def test_token_bucket_port_passes_its_burst_at_the_peak_rate():
    """One message through a port of 1e6 bytes/s with a bucket of 2e5 bytes and a 1e7 bytes/s
    peak: the bucket drains at (1e7 - 1e6) bytes/s, so the first 1e7 * 2e5 / 9e6 bytes pass in
    2e5 / 9e6 s and the rest at 1e6 bytes/s. A second message after the bucket ran empty moves
    at the capacity alone."""
    from byteps.sim.network import Conn, Port, Sim

    sim = Sim()
    port = Port("shaped", 1e6, burst=2e5, peak=1e7)
    conn = Conn(sim, port, None, 0.0)
    done = []
    conn.send(1e6, lambda: done.append(sim.now))
    sim.run()
    t_burst = 2e5 / 9e6
    assert done[0] == pytest.approx(t_burst + (1e6 - 1e7 * t_burst) / 1e6, rel=1e-9)
    start = sim.now
    conn.send(1e5, lambda: done.append(sim.now - start))
    sim.run()
    assert done[1] == pytest.approx(0.1, rel=1e-9)
    # an idle port keeps its bucket; a port without one moves its capacity from the first byte
    assert Port("idle", 1e6, burst=2e5, peak=1e7).tokens == 2e5
    with pytest.raises(InvalidArgumentError):
        Port("bad", 1e6, burst=1.0, peak=1e6)
    with pytest.raises(InvalidArgumentError):  # a burst's rate must be above the bandwidth
        from byteps.sim.simulate import Cluster

        Cluster(2, shaper_burst=1e5, bandwidth=1e10, local_bandwidth=1e9).check()


def test_scheduling_beats_fifo_and_t_opt_is_a_floor(validation_rows):
    B = 765e6 / 8
    for r in validation_rows:  # the links' buckets can save at most one burst's time
        if "t_opt_s" in r and r["kind"] == "byteps":
            floor = r["t_opt_s"] - recorded.EMULATED_SHAPER_BURST / B
            assert r["simulated_s"] >= 0.99 * floor, r
    fifo = validate.sched_row("resnet50", 2, 0, B, "fifo", 262144, 0)
    prio = validate.sched_row("resnet50", 2, 0, B, "priority", 262144, 4)
    assert fifo / prio > 1.2  # measured: 1.30


def test_architectures_match_published_counts_and_the_benchmark():
    counts = {k: sum(t.numel for t in f()) for k, f in models.ARCHITECTURES.items()}
    assert counts["resnet50"] == 25_557_032
    assert counts["vgg16"] == 138_357_544
    assert counts["bert_base"] == 109_482_240
    assert counts["bert_large"] == 335_141_888
    assert counts["e2e_cnn"] == 2_598_746
    assert 60e6 < counts["transformer"] < 66e6


def test_seed_table_convention():
    """fp32 gradient bits over 100 x 10^9 bit/s, one direction. ResNet-50 (26 M, its rounded
    published count), VGG-16 and the Transformer come within 4 % from the exact counts; the
    BERT times imply 74 M and 193.5 M parameters, no consistent convention reaches them from
    110 M and 335 M."""
    rows = {r["model"]: r for r in report.model_table()}
    assert report.ideal_comm_ms(26_000_000) == pytest.approx(8.32)
    assert rows["resnet50"]["comm_ms"] == pytest.approx(8.32, rel=0.02)
    assert rows["vgg16"]["comm_ms"] == pytest.approx(44.6, rel=0.01)
    assert rows["transformer"]["comm_ms"] == pytest.approx(19.52, rel=0.04)
    for name in ("bert_base", "bert_large"):
        ratio = rows[name]["comm_ms"] / report.SEED_COMM_MS[name]
        assert ratio > 1.4  # not reproducible: 2^30, push+pull or fp16 each move it by 2x
    assert rows["bert_base"]["seed_params"] == pytest.approx(74e6)


def test_profile_json_roundtrip_and_errors(tmp_path):
    p = profiles.from_architecture("resnet50")
    path = tmp_path / "r.json"
    profiles.save(p, str(path))
    q = profiles.load(str(path))
    assert q.nbytes == p.nbytes == 4 * 25_557_032
    assert q.compute_s == pytest.approx(p.compute_s)
    doc = {"name": "x", "layers": [{"name": "a", "params": 10, "fwd_ms": 1, "bwd_ms": 2}]}
    assert profiles.from_json(doc).layers[0].nbytes == 40
    with pytest.raises(InvalidArgumentError):
        profiles.from_json({"layers": [{"name": "a"}]})
    with pytest.raises(InvalidArgumentError):
        sim.Scheme("ring", compression=4).check()
    with pytest.raises(InvalidArgumentError):
        sim.parse_rate("fast")
    assert sim.parse_rate("100Gbps") == 12.5e9
    assert sim.parse_rate("12.5GB/s") == 12.5e9


def test_compute_bound_and_network_bound():
    prof = profiles.from_architecture("resnet50")
    fast = sim.simulate(prof, sim.Cluster(4, 4, bandwidth=sim.parse_rate("100Gbps")),
                        sim.Scheme())
    assert fast.bound == "compute" and fast.efficiency > 0.95
    slow = sim.simulate(prof, sim.Cluster(4, 0, bandwidth=sim.parse_rate("1Gbps")),
                        sim.Scheme())
    assert slow.bound.startswith("w") and (".tx" in slow.bound or ".rx" in slow.bound)
    assert slow.efficiency < 0.2
    comp = sim.simulate(prof, sim.Cluster(4, 0, bandwidth=sim.parse_rate("1Gbps")),
                        sim.Scheme(compression=8))
    assert comp.iteration_s < slow.iteration_s / 4
    ring = sim.simulate(prof, sim.Cluster(4, 0, bandwidth=sim.parse_rate("1Gbps")),
                        sim.Scheme("ring"))
    assert ring.iteration_s == pytest.approx(slow.iteration_s, rel=0.15)


def test_cpu_machines_help_as_the_formula_says():
    M = 64 << 20
    B = 1e9 / 8
    t = {k: sim.simulate(sim.single_tensor(M), sim.Cluster(4, k, bandwidth=B),
                         sim.Scheme()).iteration_s for k in (0, 4)}
    assert t[0] / t[4] == pytest.approx(1.5, rel=0.05)  # (n^2+kn-2k)/n^2 at n = k = 4
    # k = n/2 (mixed placement): near t_opt (measured 1.03, 1.04) and, at n = 2 where t_opt is
    # the same as at k = 0, within the measured 1.026 x of k = 0
    for n in (2, 4):
        tk = sim.simulate(sim.single_tensor(M), sim.Cluster(n, n // 2, bandwidth=B),
                          sim.Scheme()).iteration_s
        t0 = sim.simulate(sim.single_tensor(M), sim.Cluster(n, 0, bandwidth=B),
                          sim.Scheme()).iteration_s
        assert tk <= 1.08 * sim.t_opt(n, n // 2, M, B) and tk <= t0 * 1.04, (n, tk, t0)


def test_cli_whatif_and_run(capsys):
    from byteps.sim.__main__ import main

    assert main(["whatif", "--profile", "resnet50", "--machines", "4", "--gpus-per-machine",
                 "2", "--bandwidth", "10Gbps", "--cpu-machines", "2", "--ratios", "4"]) == 0
    out = capsys.readouterr().out
    assert "ring all-reduce" in out and "compression 4x" in out and "BytePS, 2 CPU" in out
    assert main(["run", "--profile", "vgg16", "--machines", "2", "--scheme", "tree",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["iteration_s"] > res["compute_s"] > 0


def test_staggered_push_order_spreads_the_first_pushes():
    """StaggeredPushPosition: worker w starts a tensor at partition w, so with one partition
    of credit the n workers' first pushes go to n different servers (k = n)."""
    from byteps.sim.network import Sim
    from byteps.sim.ps_sim import PSBackend

    s = Sim()
    be = PSBackend(s, sim.Cluster(4, 4, bandwidth=1e9), sim.Scheme(partition_bytes=1 << 20,
                                                                   credit=1), [128 << 20], [0])
    be.submit(0)
    first = [[i for i, c in enumerate(be.up[w]) if c.busy] for w in range(4)]
    assert all(len(f) == 1 for f in first) and len({f[0] for f in first}) == 4, first


def test_symmetric_model_close_to_the_full_one():
    """One representative worker (ps_sym) against every worker message by message: within
    10 % on VGG-16 / ResNet-50 at 4 and 8 machines, never slower by more than 5 % (it misses
    the transient imbalance at a tensor's head: docs/simulator.md has the wider table; with
    the adaptive push window the representative's window sees no other worker's pushes in its
    NIC's queue: VGG-16, 4 machines x 8 GPUs, k = 2 at 1.045 where the fixed credit gave
    1.036). Compared in the steady state (one warm-up iteration): in its first iteration
    the full model's adaptive windows, from the default 16 MiB of credit, leave VGG-16 on
    8 machines, k = 8, 4 MiB partitions 30 % slower than its next ones, where the
    representative worker's do not."""
    for name, n, k, gpus, part, bw in (("vgg16", 4, 2, 8, 4 << 20, "25Gbps"),
                                       ("vgg16", 8, 8, 8, 4 << 20, "25Gbps"),
                                       ("resnet50", 4, 2, 1, 262144, "25Gbps")):
        prof, cl = sim.profile(name), sim.Cluster(n, k, gpus, sim.parse_rate(bw))
        sch = sim.Scheme(partition_bytes=part)
        full = sim.simulate(prof, cl, sch, method="full", warmup=1)
        sym = sim.simulate(prof, cl, sch, method="symmetric", warmup=1)
        assert 0.90 <= sym.iteration_s / full.iteration_s <= 1.05, (name, n, k)
        assert sym.events < full.events / 3
    with pytest.raises(InvalidArgumentError):
        sim.simulate(sim.single_tensor(1 << 20), sim.Cluster(2), sim.Scheme("ps"),
                     method="symmetric")


def test_whatif_answers_the_16_machine_question_in_one_command(tmp_path, capsys):
    """"With my model profile, 16 machines of 8 GPUs, 100 Gb/s and 4 spare CPU machines, what
    do BytePS, all-reduce and compression each give me?": one command, every row with its
    iteration, efficiency, speed-up over ring and what bounds it (about 1 s of CPU)."""
    from byteps.sim.__main__ import main

    path = tmp_path / "my.json"
    profiles.save(profiles.from_architecture("vgg16", tflops=120), str(path))
    assert main(["whatif", "--profile", str(path), "--machines", "16", "--gpus-per-machine",
                 "8", "--bandwidth", "100Gbps", "--cpu-machines", "4"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")][1:]
    got = {r[0].strip(): r for r in rows}
    assert set(got) == {"BytePS, 4 CPU machines", "BytePS, 4 CPU machines, fixed credit 16",
                        "BytePS, no CPU machines",
                        "ring all-reduce", "native PS", "BytePS + compression 2x",
                        "BytePS + compression 4x", "BytePS + compression 8x"}
    for r in rows:
        assert float(r[1]) > 0 and 0 < float(r[2]) <= 1.0 and r[4].strip()
    # at 3 x the compute rate the all-reduce is communication-bound, and says by what
    assert "all-reduce, one bucket at a time" in got["ring all-reduce"][4]
    assert float(got["BytePS, 4 CPU machines"][3].split()[0]) > 1.0  # faster than ring


def test_adaptive_window_fills_a_fast_network_and_stays_shallow_on_a_slow_one():
    """The core's adaptive push window in the simulator (Scheme.adaptive_credit, the default):
    at 100 Gbit/s with 4 CPU machines it grows past the fixed credit of 4 partitions, which
    leaves the CPU machines' links idle, and is as fast as a fixed 16 (80.8 against 88.9 ms
    with a fixed 4); at 1 Gbit/s (n = 8, k = 4, one 64 MiB tensor) it is no slower than the
    fixed credit."""
    prof = sim.from_architecture("vgg16", tflops=120)
    cl = sim.Cluster(16, 4, 8, sim.parse_rate("100Gbps"))
    t = {name: sim.simulate(prof, cl, sch, method="symmetric").iteration_s for name, sch in (
        ("adaptive", sim.Scheme()),
        ("fixed 4", sim.Scheme(credit=4, adaptive_credit=False)),
        ("fixed 16", sim.Scheme(credit=16, adaptive_credit=False)))}
    assert t["adaptive"] < 0.93 * t["fixed 4"], t
    assert t["adaptive"] <= 1.01 * t["fixed 16"], t
    M, B = 64 << 20, 1e9 / 8
    slow = {ad: sim.simulate(sim.single_tensor(M), sim.Cluster(8, 4, bandwidth=B),
                             sim.Scheme(adaptive_credit=ad)).iteration_s for ad in (True, False)}
    assert slow[True] <= 1.01 * slow[False], slow


def test_warmup_iterations_carry_the_adaptive_window_over():
    """``simulate(warmup=n)``: the workers' adaptive windows start the reported iteration where
    the earlier ones left them (n = 4, k = 2, 4 MiB at 800 Mbit/s: the window shrinks from
    its 1 MiB start over a few push_pulls and the iteration gets faster); a fixed credit has
    nothing to carry; a negative count is refused."""
    from byteps.errors import InvalidArgumentError

    M, cl = 4 << 20, sim.Cluster(4, 2, bandwidth=95e6, latency=50e-6)
    fresh = sim.simulate(sim.single_tensor(M), cl, sim.Scheme()).iteration_s
    warm = sim.simulate(sim.single_tensor(M), cl, sim.Scheme(), warmup=3).iteration_s
    assert warm < 0.97 * fresh, (warm, fresh)
    fixed = sim.Scheme(adaptive_credit=False)
    assert sim.simulate(sim.single_tensor(M), cl, fixed, warmup=3).iteration_s == \
        pytest.approx(sim.simulate(sim.single_tensor(M), cl, fixed).iteration_s)
    with pytest.raises(InvalidArgumentError):
        sim.simulate(sim.single_tensor(M), cl, sim.Scheme(), warmup=-1)
