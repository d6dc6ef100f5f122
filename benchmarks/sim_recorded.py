"""The emulated cluster's measured numbers the simulator (:mod:`byteps.sim`) is validated
against (:mod:`benchmarks.sim_compare`).

Copied from docs/performance.md (the architecture table and the scheduling workload), with
the commit each was measured at. Times: seconds (medians of the slowest process); goodput:
the measured TCP goodput of one link, Mbit/s (10^6 bit/s), rounded as the page prints it.
"""

#: The architecture table ("Emulated cluster: the architecture table"), default settings
#: (256 KiB partitions, credit 4), TCP van, links shaped to 800 Mbit/s.
TABLE1 = {
    "commit": "9709bfd",
    "measured": "2026-11-22 20:57, python -m benchmarks",
    # (n, k, M bytes, goodput Mbit/s, byteps default s, gloo s)
    "rows": [
        (2, 0, 4 << 20, 765, 0.042, 0.043),
        (2, 2, 4 << 20, 763, 0.046, 0.041),
        (4, 0, 4 << 20, 765, 0.066, 0.066),
        (4, 2, 4 << 20, 765, 0.057, 0.067),
        (4, 4, 4 << 20, 765, 0.050, 0.066),
        (2, 0, 64 << 20, 765, 0.702, 0.699),
        (2, 2, 64 << 20, 763, 0.708, 0.699),
        (4, 0, 64 << 20, 765, 1.062, 1.056),
        (4, 2, 64 << 20, 765, 0.876, 1.053),
        (4, 4, 64 << 20, 765, 0.733, 1.055),
        (2, 0, 256 << 20, 765, 2.921, 2.813),
        (2, 2, 256 << 20, 763, 2.854, 2.812),
        (4, 0, 256 << 20, 765, 4.356, 4.318),
        (4, 2, 256 << 20, 765, 3.473, 4.308),
        (4, 4, 256 << 20, 765, 2.905, 4.259),
    ],
}

#: One CPU machine beside two worker machines (k = n/2 at n = 2, where t_opt is the same as
#: at k = 0), measured to check the mixed placement: same setup and settings as TABLE1.
TABLE1_MIXED = {
    "commit": "f40c557",
    "measured": "2026-11-23 05:40, python -m benchmarks.table1 --sizes-mib 64 "
                "--configs 2,0 2,1 4,0 4,2 --vans tcp",
    "rows": [
        (2, 1, 64 << 20, 765, 0.720, 0.701),
    ],
}

#: The scheduling workload ("Scheduling: a training-shaped workload"): n = 2, k = 0, links
#: shaped to 800 Mbit/s, compute per iteration = 1 x t_opt of the model's gradients.
SCHED = {
    "commit": "4fe2ef2",
    "measured": "2026-11-23 03:39, python -m benchmarks --only sched",
    "n": 2, "k": 0, "goodput_mbit": 765, "compute_ratio": 1.0,
    # model -> [(mode, partition bytes, credit, iteration s)]; fifo: unlimited credit
    "rows": {
        "vgg16": [("fifo", 262144, 0, 7.727), ("priority", 131072, 8, 5.981),
                  ("priority", 262144, 4, 5.894), ("priority", 262144, 8, 5.833),
                  ("priority", 524288, 4, 5.838), ("priority", 1048576, 4, 5.904),
                  ("priority", 4096000, 4, 6.262)],
        "resnet50": [("fifo", 262144, 0, 1.440), ("priority", 131072, 8, 1.105),
                     ("priority", 262144, 4, 1.110), ("priority", 262144, 8, 1.137),
                     ("priority", 524288, 4, 1.126), ("priority", 1048576, 4, 1.181),
                     ("priority", 4096000, 4, 1.440)],
    },
}

#: The synchronisation schemes (docs/schemes.md, "Measured on the emulated cluster"): n = 4
#: worker hosts, links shaped to 800 Mbit/s, one job per scheme (the tree of the core's default
#: width 2, HiPS in groups of 2), default settings; k = 0: a server on every worker host, k = 4:
#: four CPU-server hosts. Goodput: bytes/s of one link as the run's simulated column used it
#: (94.6 and 95.7 MB/s as the page prints them; these reproduce each of its simulated cells).
SCHEMES = {
    "commit": "0396f0d",
    "measured": "2026-11-23 12:24, python -m benchmarks.schemes_cluster",
    "n": 4,
    "goodput_Bps": {0: 94.570e6, 4: 95.680e6},
    # (k, scheme, bytes, measured s)
    "rows": [
        (k, scheme, size, ms / 1e3)
        for k, table in (
            (0, {"ps": (0.415, 4.16, 67.54, 1066), "ring": (0.472, 3.84, 65.98, 1069),
                 "tree": (0.419, 3.86, 66.33, 1069), "hips": (0.545, 10.58, 184, 2896)}),
            (4, {"ps": (0.446, 2.99, 50.57, 738), "ring": (0.449, 3.74, 66.15, 1067),
                 "tree": (0.376, 3.81, 71.91, 1087), "hips": (0.651, 7.85, 153, 2269)}))
        for scheme, times in table.items()
        for size, ms in zip((4 << 10, 256 << 10, 4 << 20, 64 << 20), times)
    ],
}

#: Latency of the emulated cluster's links: no delay is added (veth pairs behind a bridge);
#: the simulator takes 50 µs per message (kernel and thread hand-offs), an assumption.
EMULATED_LATENCY_S = 50e-6

#: The token bucket of each shaped link direction of the emulated cluster at 800 Mbit/s, bytes:
#: ``tbf`` burst = 4 ms at the shaped rate, at least 128 KiB (benchmarks/netns.py). Each
#: timed push_pull of the architecture table starts on idle links (after a barrier), so its
#: first bytes pass the full buckets above the shaped rate: up to 4 ms of a 4 MiB push_pull's
#: 44-66 ms.
EMULATED_SHAPER_BURST = 400_000
