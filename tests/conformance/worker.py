"""The program every rank of a conformance job runs (under ``bpslaunch``)::

    python tests/conformance/worker.py <framework> <case-group> [<case-name> ...]

Initialises the framework's shim, runs the group's cases in order (or only the named ones)
and prints, per case, ``CASE <name> OK (<seconds>s)``, ``CASE <name> SKIP missing capability
<cap>: <reason>`` or ``CASE <name> FAIL`` followed by the traceback. After the last case it
prints ``ALL OK <n>`` (n = cases that passed) and exits 0, or ``FAILED <k> of <n>: <names>``
and exits 1. A failing case does not stop the others (a failure after a collective leaves the
ranks in step; one before a collective is bounded by ``BYTEPS_TIMEOUT``).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):  # tests/ (oracle.py), then this directory
    if path not in sys.path:
        sys.path.insert(0, path)

import cases  # noqa: E402
from shims import get_shim  # noqa: E402


def main(argv) -> int:
    if len(argv) < 2 or argv[1] not in cases.GROUPS:
        print(f"usage: worker.py <framework> <group: {'|'.join(cases.GROUPS)}> [case ...]",
              file=sys.stderr)
        return 2
    framework, group, only = argv[0], argv[1], set(argv[2:])
    selected = [c for c in cases.GROUPS[group] if not only or c.name in only]
    unknown = only - {c.name for c in selected}
    if unknown:
        print(f"unknown case(s) in group {group}: {sorted(unknown)}", file=sys.stderr)
        return 2
    shim = get_shim(framework)
    t0 = time.monotonic()
    shim.init()
    print(f"CONFORMANCE {framework} {group} rank={shim.rank()} size={shim.size()} "
          f"init={time.monotonic() - t0:.1f}s", flush=True)
    passed, failed, skipped = 0, [], 0
    for c in selected:
        missing = c.missing(shim)
        if missing:
            reason = shim.missing_reasons.get(missing[0], "not supported by this framework")
            print(f"CASE {c.name} SKIP missing capability {missing[0]}: {reason}", flush=True)
            skipped += 1
            continue
        t = time.monotonic()
        try:
            c.fn(shim)
        except Exception:
            failed.append(c.name)
            print(f"CASE {c.name} FAIL rank={shim.rank()} after {time.monotonic() - t:.1f}s\n"
                  f"{traceback.format_exc()}", flush=True)
            continue
        passed += 1
        print(f"CASE {c.name} OK ({time.monotonic() - t:.2f}s)", flush=True)
    try:
        shim.shutdown()
    except Exception:
        failed.append("<shutdown>")
        print(f"shutdown FAILED\n{traceback.format_exc()}", flush=True)
    if failed:
        print(f"FAILED {len(failed)} of {len(selected)}: {', '.join(failed)}", flush=True)
        return 1
    print(f"ALL OK {passed}" + (f" (skipped {skipped})" if skipped else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
