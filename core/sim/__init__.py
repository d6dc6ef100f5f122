"""byteps.sim: a what-if simulator of data-parallel training iterations.

A simulation of one training iteration from a model profile (per-layer gradient bytes and
forward / backward times), a cluster (n worker machines, k CPU machines, GPUs per machine, NIC
bandwidth and latency, server summation rate) and a synchronisation scheme (the BytePS
summation service, a native PS, ring / tree all-reduce, hierarchical PS; FIFO or priority +
credit scheduling, partition size, compression ratio). The PS schemes are simulated message by
message, as discrete events on a network of shared ports (:mod:`byteps.sim.ps_sim`); the
all-reduces (ring, tree, HiPS) bucket by bucket, each bucket's time in closed form from the
α-β-γ costs of :mod:`byteps.sync.cost_formulas` (:mod:`byteps.sim.collectives`). It gives the
iteration time, the scaling efficiency and what bounds the iteration (compute, a NIC, a
server's CPU). docs/simulator.md describes the model and its validation against the emulated
cluster.

    from byteps import sim
    res = sim.simulate(sim.profile("resnet50"), sim.Cluster(machines=16, cpu_machines=4,
                       gpus_per_machine=8, bandwidth=sim.parse_rate("100Gbps")),
                       sim.Scheme("byteps"))
    print(res.iteration_s, res.efficiency, res.bound)

``simulate(..., method=...)``: ``full`` (every worker, message by message), ``symmetric``
(BytePS with one representative worker: :mod:`byteps.sim.ps_sym`, fast at hundreds of GPUs)
or ``auto`` (symmetric from :data:`SYMMETRIC_FROM` worker machines up).

CLI: ``python -m byteps.sim --help``.
"""

from .profiles import Layer, Profile, from_architecture, load, save, shipped  # noqa: F401
from .profiles import get as profile  # noqa: F401
from .simulate import (  # noqa: F401
    METHODS,
    SCHEMES,
    SYMMETRIC_FROM,
    Cluster,
    Scheme,
    SimResult,
    parse_rate,
    simulate,
    single_tensor,
    t_opt,
)
