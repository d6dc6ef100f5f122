"""Throughput of byteps' SIMD summation kernels (thin wrapper of ``byteps.bench.sumbench``).

The measurement lives in the ``byteps-bench`` package now (``byteps-bench --only sum`` writes
it into docs/performance.md): every dtype and ISA next to NumPy ``a += b`` and a memory-bandwidth
probe, single- and multi-threaded, GB/s counting every byte read and written.

    python benchmarks/sum_throughput.py [--size-mib 64] [--repeats 10] [--threads N]
"""

from byteps.bench.sumbench import main

if __name__ == "__main__":
    main()
