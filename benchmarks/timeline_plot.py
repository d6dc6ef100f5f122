"""A picture of one step of byteps timelines (docs/timeline.md): a Gantt chart PNG.

``python -m benchmarks.timeline_plot OUT.png TRACE.json [TRACE.json ...] [--step N]`` or
:func:`render`. Each input is a ``comm.json`` written with ``BYTEPS_TRACE_ON=1``; one row per
rank and track (the whole push_pulls, then one row per pipeline stage, in pipeline order;
overlapping partitions of a stage share its row, drawn translucent), bars coloured by tensor.
Times are milliseconds from the step's first event over all files (the files' clocks are
wall-clock microseconds, so ranks on one host line up exactly and across hosts as well as their
clocks agree).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

#: pipeline order of the stage rows (docs/architecture.md §3; a device tensor's copy stages
#: first and last, the all-reduce schemes' around PUSH/PULL); any other stage gets a row of its
#: own after these, by name
STAGES = ("COPY_D2H", "COPY_IN", "LOCAL_REDUCE", "COMPRESS", "REDUCE_SCATTER", "PUSH", "PULL",
          "ALL_GATHER", "DECOMPRESS", "COPY_OUT", "COPY_H2D")


def load_events(path: Union[str, Path]) -> list[dict]:
    """The complete ("X") events of one comm.json.

    Raises:
        ValueError: the file is not a Chrome trace (no ``traceEvents`` list).
    """
    with open(path) as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return [e for e in events if e.get("ph") == "X"]


def steps_of(events: Iterable[dict]) -> list[int]:
    """The steps present, sorted."""
    return sorted({int(e["args"]["step"]) for e in events if "step" in e.get("args", {})})


def render(trace_paths: Union[str, Path, Sequence[Union[str, Path]]], out_png: Union[str, Path],
           step: Optional[int] = None, title: Optional[str] = None) -> dict:
    """Draw one step of one or more timelines as a Gantt chart PNG.

    Args:
        trace_paths: one comm.json path or a list of them (e.g. every rank of a job).
        out_png: the PNG to write (parent directories are made).
        step: the step to draw; default: the last step present in every file (the window's
            last, usually the most settled).
        title: the chart's title; default names the step and the files' ranks.

    Returns:
        dict: ``{"step": int, "ranks": [int], "events": int, "span_ms": float, "rows":
        [str]}``: what was drawn (events drawn, the step's span over all files in ms, the row
        labels from the top).

    Raises:
        ValueError: no trace path, a file is not a Chrome trace, or the step is in none of the
            files (the message lists the steps there are).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [trace_paths] if isinstance(trace_paths, (str, Path)) else list(trace_paths)
    if not paths:
        raise ValueError("render: no trace path given")
    per_file = [load_events(p) for p in paths]
    if step is None:
        common = set.intersection(*(set(steps_of(ev)) for ev in per_file))
        if not common:
            raise ValueError(f"render: the files share no step ({[steps_of(e) for e in per_file]})")
        step = max(common)
    events = [e for ev in per_file for e in ev if e.get("args", {}).get("step") == step]
    if not events:
        raise ValueError(f"render: step {step} is in none of the files (steps there: "
                         f"{sorted(set().union(*(steps_of(e) for e in per_file)))})")
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e["dur"]) for e in events)
    ranks = sorted({int(e["pid"]) for e in events})
    tensors = sorted({e["args"].get("tensor", e["name"]) for e in events})
    cmap = plt.get_cmap("tab20")
    colour = {t: cmap(i % 20) for i, t in enumerate(tensors)}

    rows: dict[tuple[int, int, str], list[dict]] = defaultdict(list)
    for e in events:
        cat = e.get("cat", "")
        order = 0 if cat == "push_pull" else 1 + (STAGES.index(cat) if cat in STAGES else 99)
        rows[(int(e["pid"]), order, cat)].append(e)
    keys = sorted(rows)
    labels = []
    for k in keys:
        cat = rows[k][0].get("cat", "")
        labels.append(f"rank {k[0]} {'push_pull' if cat == 'push_pull' else cat}")

    fig_h = max(2.5, 0.45 * len(keys) + 1.5)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    for y, k in enumerate(keys):
        for e in rows[k]:
            start = (float(e["ts"]) - t0) / 1e3
            width = max(float(e["dur"]) / 1e3, (t1 - t0) / 1e3 / 2000)
            tensor = e["args"].get("tensor", e["name"])
            alpha = 0.9 if k[1] == 0 else 0.55
            ax.barh(y, width, left=start, height=0.8, color=colour[tensor], alpha=alpha,
                    edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first event")
    ax.set_title(title or f"byteps timeline, step {step}, rank(s) {', '.join(map(str, ranks))}")
    if len(tensors) <= 20:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=colour[t], label=t) for t in tensors], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), title="tensor")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return {"step": step, "ranks": ranks, "events": len(events), "span_ms": (t1 - t0) / 1e3,
            "rows": labels}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timeline_plot",
                                description="Draw one step of byteps timelines (comm.json) "
                                            "as a Gantt chart PNG.")
    p.add_argument("out_png")
    p.add_argument("traces", nargs="+", help="comm.json files (BYTEPS_TRACE_DIR/<rank>/)")
    p.add_argument("--step", type=int, default=None, help="default: the last common step")
    p.add_argument("--title", default=None)
    a = p.parse_args(argv)
    info = render(a.traces, a.out_png, step=a.step, title=a.title)
    print(f"{a.out_png}: step {info['step']}, ranks {info['ranks']}, {info['events']} events, "
          f"{info['span_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
