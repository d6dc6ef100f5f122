"""push_pull telemetry (``BYTEPS_TELEMETRY_ON``, default on; docs/timeline.md).

:func:`get_pushpull_speed` is upstream BytePS's throughput sample; :func:`get_telemetry` adds a
per-tensor reading. Both count only push_pulls that completed successfully, in this process.
The worker core keeps the counters (atomics, updated once per completed push_pull).
:func:`start_timeline` and :func:`stop_timeline` are Horovod's: a timeline recorded between two
calls instead of ``BYTEPS_TRACE_*``'s step window.
"""

from __future__ import annotations

from . import _core
from .errors import InvalidArgumentError, InvalidTypeError


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


def timeline_file(file_path: str, rank: int) -> str:
    """Where rank ``rank`` writes the timeline that :func:`start_timeline` names
    ``file_path``: rank 0 that path, rank r > 0 ``<file_path>.<r>`` (every process records its
    own operations)."""
    return file_path if rank == 0 else f"{file_path}.{rank}"


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's ``start_timeline``: record every operation this process starts from now on
    (push_pull and the collectives, with their stages: the timeline of docs/timeline.md) until
    :func:`stop_timeline` writes it as Chrome-trace JSON to :func:`timeline_file`
    (``file_path`` on rank 0). Independent of ``BYTEPS_TRACE_ON``'s step window, which it
    replaces until the next ``init()``.

    Args:
        file_path: the file (its folder is made if missing), a non-empty str.
        mark_cycles: Horovod marks its background cycles; byteps has none, so only False.

    Raises:
        byteps.errors.InvalidArgumentError: an empty path, ``mark_cycles=True``, or a timeline
            already being recorded.
        byteps.errors.InvalidTypeError: a path that is not a str.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    if not isinstance(file_path, str):
        raise InvalidTypeError(f"start_timeline: file_path must be a str, got "
                               f"{type(file_path).__name__}")
    if mark_cycles:
        raise InvalidArgumentError("start_timeline: mark_cycles=True marks Horovod's background "
                                   "cycles, which byteps does not have")
    rank = _core.rank()  # NotInitializedError before init()
    _core.start_timeline(timeline_file(file_path, rank))


def stop_timeline() -> None:
    """Horovod's ``stop_timeline``: stop recording and write the file :func:`start_timeline`
    named; returns once it is written.

    Raises:
        byteps.errors.InvalidArgumentError: no timeline is being recorded.
        byteps.errors.NotInitializedError: before ``init()``.
    """
    _core.stop_timeline()  # NotInitializedError before init()
