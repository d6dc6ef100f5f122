"""``python -m benchmarks``: run the benchmarks, write ``docs/performance.md`` and its plots.

    python -m benchmarks [--quick] [--out docs/performance.md] [--img-dir docs/img]
                         [--only e2e,cluster,sched,compression,pipeline,schemes,collectives,micro,sum] [--e2e]
                         [--compression [PARTS]]
                         [--json FILE | --from-json FILE [FILE ...]]

Run it from the repository root (the ``bench`` extra gives matplotlib and tqdm; root for the
emulated cluster). ``--out`` defaults to the repository's ``docs/performance.md``, the plots go
to ``img/`` next to it, and the page ends with a link to the hand-written notes
(``docs/performance-notes.md``, not copied into the page).

Benchmarks (``--only``, comma-separated; default: all available):

* ``micro``   loopback microbenchmarks (:mod:`benchmarks.micro`): push_pull vs gloo
  all_reduce vs raw TCP, one-tensor-at-a-time, first-use cost, the forced-distributed job on
  each van (``--vans``; :mod:`benchmarks.vans`);
* ``sum``     summation kernels vs NumPy and memory bandwidth (:mod:`benchmarks.sumbench`);
* any module listed in :data:`PLUGINS` (``e2e``: :mod:`benchmarks.e2e`, real training with
  byteps against torch DDP on the emulated cluster; ``cluster``: :mod:`benchmarks.table1`, its byteps
  jobs on each van of ``--cluster-vans``; ``sched``: :mod:`benchmarks.sched`; ``compression``:
  :mod:`benchmarks.compression`, its parts chosen by ``--compression``; ``pipeline``:
  :mod:`benchmarks.pipeline`, PipeDream's plan against data parallelism; ``schemes``:
  :mod:`benchmarks.schemes_cluster`, the synchronisation schemes and ``BYTEPS_SYNC=auto``;
  ``collectives``: :mod:`benchmarks.collectives_bench`, Horovod's collectives against gloo's) that
  defines ``bench_settings(quick) -> plan``, ``bench_steps(plan) -> int``,
  ``bench_run(plan, progress) -> dict`` (JSON-able; ``progress(label)`` once per step) and
  ``bench_markdown(results, img_dir, img_rel) -> (markdown, targets)`` (targets as made by
  :func:`benchmarks.report.target`). A module may also name, in ``REUSES``, sections whose
  results it reads: when the same run measures all of them first, its plan gets ``reused``
  (``bench_steps`` should then count 0) and it is called ``bench_run(plan, progress,
  reused={section: results})`` instead of measuring again (``sim`` reads ``cluster`` and
  ``sched``).

``--quick`` is the CI smoke run (under 4 minutes on 2 cores); the full run takes under 20.
``--json`` saves the raw results, ``--from-json`` re-renders a report from them without
measuring again (several files: their sections together, e.g. a full run's and a later
``--compression`` run's; the header's machine, date and command are the first file's).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

from . import ROOT, micro, report, sumbench

#: section order in the report: plugins first (the emulated cluster is the headline).
PLUGINS = {"e2e": f"{__package__}.e2e", "cluster": f"{__package__}.table1",
           "sched": f"{__package__}.sched", "compression": f"{__package__}.compression",
           "sim": f"{__package__}.sim_validate", "pipeline": f"{__package__}.pipeline",
           "schemes": f"{__package__}.schemes_cluster",
           "collectives": f"{__package__}.collectives_bench"}


class Bench:
    """One benchmark: how to plan, count steps, run and render it."""

    def __init__(self, name: str, settings: Callable, steps: Callable, run: Callable,
                 markdown: Callable):
        self.name, self.settings, self.steps, self.run, self.markdown = (
            name, settings, steps, run, markdown)
        self.reuses: List[str] = []  # sections whose results run(..., reused=) reads


def available() -> Dict[str, Bench]:
    benches: Dict[str, Bench] = {}
    for name, modname in PLUGINS.items():
        try:
            mod = importlib.import_module(modname)
        except Exception:
            continue
        fns = [getattr(mod, f"bench_{f}", None) for f in ("settings", "steps", "run", "markdown")]
        if all(callable(f) for f in fns):
            benches[name] = Bench(name, *fns)
            benches[name].reuses = list(getattr(mod, "REUSES", None) or ())
    benches["micro"] = Bench("micro", micro.settings, micro.steps,
                             lambda plan, progress: micro.run(plan, progress=progress),
                             report.micro_markdown)
    benches["sum"] = Bench("sum", sumbench.settings, lambda plan: 1 + len(plan["dtypes"]),
                           lambda plan, progress: sumbench.run(plan, progress=progress),
                           report.sum_markdown)
    return benches


def _progress_bar(total: int, enabled: bool):
    """A tqdm bar (plain stderr lines where tqdm is missing); returns (advance, close)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not enabled:
        state = {"i": 0}

        def advance(label: str) -> None:
            state["i"] += 1
            if enabled:
                print(f"[{state['i']}/{total}] {label}", file=sys.stderr, flush=True)

        return advance, lambda: None
    bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)
    first = {"v": True}

    def advance(label: str) -> None:
        if not first["v"]:
            bar.update(1)
        first["v"] = False
        bar.set_description(label)

    def close() -> None:
        if not first["v"]:
            bar.update(1)
        bar.close()

    return advance, close


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="CI smoke run: fewer sizes and dtypes, one repeat (< 3 min on 2 cores)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"),
                   help="Markdown report to write (default: docs/performance.md of this "
                   "repository)")
    p.add_argument("--img-dir", default=None,
                   help="where the PNG plots go (default: img/ next to --out)")
    p.add_argument("--only", default=None,
                   help="comma-separated benchmarks to run (default: all available)")
    p.add_argument("--sizes", nargs="+", help="micro: tensor sizes, e.g. 4K 1M 64M")
    p.add_argument("--repeats", type=int, help="micro: runs of every job (the best is kept)")
    p.add_argument("--count", type=int, help="micro: one-tensor-at-a-time tensors")
    p.add_argument("--sum-size-mib", type=float, help="sum: MiB per buffer")
    p.add_argument("--env", action="append", help="micro: KEY=VAL for the byteps jobs")
    p.add_argument("--vans", help="micro: comma-separated vans of the forced-distributed job "
                   "(benchmarks/vans.py; default: tcp, plus ucx-shm where byteps has UCX)")
    p.add_argument("--cluster-vans", help="cluster: comma-separated vans of the byteps jobs "
                   "(default: tcp, plus ucx-tcp where byteps has UCX)")
    p.add_argument("--compression", nargs="?", const="", metavar="PARTS",
                   help="run the gradient compression section (alone, unless --only names "
                   "others too); PARTS: comma-separated of cluster, throughput, training "
                   "(default: all)")
    p.add_argument("--e2e", action="store_true",
                   help="run the end-to-end training section (byteps vs torch DDP; alone, "
                   "unless --only names others too)")
    p.add_argument("--json", help="also write the raw results (JSON) here")
    p.add_argument("--from-json", nargs="+", metavar="FILE",
                   help="render the report from saved results (several files: their sections "
                   "merged, later files winning); measure nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _reuses(bench: Bench, before: Sequence[str]) -> List[str]:
    """The sections run before this one whose results it reads instead of measuring again:
    all of its module's ``REUSES`` when every one of them is among ``before``, else none."""
    return bench.reuses if bench.reuses and all(w in before for w in bench.reuses) else []


def _plans(args: argparse.Namespace, benches: Dict[str, Bench]) -> Dict[str, dict]:
    plans = {}
    for name, b in benches.items():
        if name == "micro":
            sizes = [micro.parse_size(s) for s in args.sizes] if args.sizes else None
            plans[name] = micro.settings(args.quick, sizes, repeats=args.repeats,
                                         count=args.count, env=args.env,
                                         vans=args.vans.split(",") if args.vans else None)
        elif name == "sum":
            plans[name] = sumbench.settings(
                args.quick, size=int(args.sum_size_mib * (1 << 20)) if args.sum_size_mib else None)
        elif name == "cluster" and args.cluster_vans:
            plans[name] = b.settings(args.quick, vans=args.cluster_vans.split(","))
        elif name == "compression" and args.compression:
            plans[name] = b.settings(args.quick, parts=args.compression.split(","))
        else:
            plans[name] = b.settings(args.quick)
    return plans


def _shown(argv: List[str]) -> List[str]:
    """The command line without options that do not change the measurement."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--json", "--from-json"):
            skip = True
        elif a != "--no-progress" and not a.startswith(("--json=", "--from-json=")):
            out.append(a)
    return out


def _dated(section: report.Section, saved: dict, first: dict) -> report.Section:
    """``section`` with a line under its heading naming the run it comes from (date, commit,
    command), when that is not the page header's run and the section does not say so itself."""
    text, targets = section
    if saved is first or "\nMeasured " in text:
        return section
    commit = (saved.get("machine") or {}).get("commit")
    line = (f"Measured {saved.get('date', '?')}" + (f" at commit {commit}" if commit else "")
            + f" (`{saved.get('command', '?')}`), merged into this page with `--from-json`.")
    head, _, rest = text.partition("\n")
    return f"{head}\n\n{line}\n{rest}", targets


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    benches = available()
    if args.from_json:
        saved = []
        for path in args.from_json:
            with open(path) as f:
                saved.append(json.load(f))
        results = {k: v for s in saved for k, v in s["results"].items()}
        origin = {k: s for s in saved for k in s["results"]}  # the file each section is from
        command, info, date = saved[0]["command"], saved[0].get("machine"), saved[0].get("date")
        times = [s.get("elapsed_s") for s in saved]
        elapsed = sum(times) if all(times) else None
        chosen = [n for n in benches if n in results]
    else:
        only = [s for s in (args.only or "").split(",") if s]
        if args.compression is not None:
            only.append("compression")
        if args.e2e:
            only.append("e2e")
        only = only or list(benches)
        unknown = [s for s in only if s not in benches]
        if unknown:
            print(f"python -m benchmarks: unknown or unavailable benchmark(s): {', '.join(unknown)}; "
                  f"available: {', '.join(benches)}", file=sys.stderr)
            return 2
        chosen = [n for n in benches if n in only]
        plans = _plans(args, {n: benches[n] for n in chosen})
        reuses = {n: _reuses(benches[n], chosen[:i]) for i, n in enumerate(chosen)}
        for n, r in reuses.items():
            if r:
                plans[n]["reused"] = sorted(r)
        total = sum(int(benches[n].steps(plans[n])) for n in chosen)
        advance, close = _progress_bar(total, not args.no_progress)
        t0 = time.perf_counter()
        results: Dict[str, dict] = {}
        try:
            for n in chosen:
                if reuses[n]:
                    results[n] = benches[n].run(plans[n], advance,
                                                reused={k: results[k] for k in reuses[n]})
                else:
                    results[n] = benches[n].run(plans[n], advance)
        finally:
            close()
        elapsed = time.perf_counter() - t0
        command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in _shown(argv_list))
        info, date = report.machine(), time.strftime("%Y-%m-%d %H:%M")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"command": command, "elapsed_s": elapsed, "machine": info,
                           "date": date, "results": results}, f, indent=1)
    img_dir = args.img_dir or os.path.join(os.path.dirname(os.path.abspath(args.out)), "img")
    img_rel = os.path.relpath(img_dir, os.path.dirname(os.path.abspath(args.out)))
    sections: List[report.Section] = [
        benches[n].markdown(results[n], img_dir, img_rel) for n in chosen]
    if args.from_json:  # a section measured apart from the header's run says when and where
        sections = [_dated(sec, origin[n], saved[0]) for n, sec in zip(chosen, sections)]
    page = report.render(sections, command=command.strip(), elapsed_s=elapsed, info=info,
                         date=date)
    report.write(args.out, page)
    targets = [t for _, ts in sections for t in ts]
    for t in targets:
        mark = {True: "met   ", False: "MISSED", None: "info  "}[t["met"]]
        print(f"{mark} {t['ratio']:7.2f}x  {t['name']}  ({t['measured']})")
    print(f"python -m benchmarks: wrote {args.out} and plots under {img_dir}"
          + (f" in {elapsed:.0f} s" if elapsed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
