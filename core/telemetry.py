"""push_pull telemetry (``BYTEPS_TELEMETRY_ON``, default on; docs/timeline.md).

:func:`get_pushpull_speed` is upstream BytePS's throughput sample; :func:`get_telemetry` adds a
per-tensor reading. Both count only push_pulls that completed successfully, in this process.
The worker core keeps the counters (atomics, updated once per completed push_pull).
"""

from __future__ import annotations

from . import _core


def get_pushpull_speed() -> tuple[int, float]:
    """The oldest unread push_pull throughput sample of this process, as upstream BytePS.

    Every ``BYTEPS_TELEMETRY_INTERVAL`` seconds of traffic (default 10, upstream's fixed period)
    the core closes a sample: the bytes of the push_pulls completed since the previous sample
    over the time since (the tensor's size, once per push_pull, as upstream counts it). Each
    call takes the oldest sample not yet read off the queue (at most 1024 are kept).

    Returns:
        tuple[int, float]: ``(ms_since_epoch, MB_per_s)``: when the sample closed, in
        milliseconds since the Unix epoch, and the throughput in MB/s (MB = 10**6 bytes).
        ``(0, -5.0)`` when there is no unread sample: no sample period has passed yet,
        ``BYTEPS_TELEMETRY_ON=0``, or byteps is not initialised (upstream's answer too).

    Source: ``core/cpp/pipeline/telemetry.cc``.
    """
    ms, speed = _core.get_pushpull_speed()
    return int(ms), float(speed)


def get_telemetry() -> dict[str, dict[str, float]]:
    """Per-tensor push_pull telemetry of this process since ``init()``.

    Returns:
        dict[str, dict[str, float]]: tensor name -> ``{"bytes": int, "count": int,
        "mean_ms": float, "MB_per_s": float}``: bytes pushed and pulled (the tensor's size
        times ``count``), completed push_pulls, their mean duration in milliseconds (from the
        call that started one to its completion in the core), and ``bytes / total duration``
        in MB/s (MB = 10**6 bytes). Only tensors with at least one completed push_pull are
        listed; empty when ``BYTEPS_TELEMETRY_ON=0``.

    Raises:
        NotInitializedError: byteps is not initialised.

    Source: ``core/cpp/pipeline/worker_ops.cc`` (``WorkerCore::OpCompleted``).
    """
    out = {}
    for name, (nbytes, count, ns) in _core.tensor_telemetry().items():
        out[name] = {
            "bytes": int(nbytes),
            "count": int(count),
            "mean_ms": ns / count / 1e6,
            "MB_per_s": nbytes * 1e3 / ns if ns > 0 else 0.0,
        }
    return out
