"""Render the knob registry of the C++ core as ``docs/env.md``.

Every ``BYTEPS_*`` / ``DMLC_*`` environment variable is declared once in
``core/cpp/common/knobs.cc``; ``byteps._core.knobs()`` returns that table. Upstream BytePS's
variables and what each does here are declared in ``core/cpp/common/upstream_knobs.cc``;
``byteps._core.upstream_knobs()`` returns that one. This module turns both into the Markdown
reference page (docs/architecture.md §10)::

    python -m byteps.knobs --markdown          # print the page
    python -m byteps.knobs --write docs/env.md # (re)generate the page
    python -m byteps.knobs --check docs/env.md # exit 1 with a diff if the page is stale
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from byteps import _core
from byteps.errors import ConfigError

#: Groups of the page, in order: (title, one-line description).
GROUPS: Tuple[Tuple[str, str], ...] = (
    (
        "Cluster and bootstrap",
        "The upstream `DMLC_*` contract: roles, sizes and where the scheduler is. Existing "
        "BytePS launch scripts keep working unchanged.",
    ),
    (
        "Worker core",
        "Partitioning, scheduling, timeouts, heartbeats and job identity, read by the worker "
        "core (and, where *used by* says so, by the servers and the scheduler too).",
    ),
    ("Server", "The summation service (`python -m byteps.server` with `DMLC_ROLE=server`)."),
    ("Logging", "Log output of the core, in every role."),
)

_HEADER = (
    "| Variable | Type | Default | Accepted values | Used by | Description |\n"
    "|---|---|---|---|---|---|"
)


def _group_of(knob: Dict) -> str:
    """Group title of one knob, by name prefix and ``used_by``."""
    name = knob["name"]
    if name.startswith("DMLC_"):
        return "Cluster and bootstrap"
    if name.startswith("BYTEPS_LOG_"):
        return "Logging"
    used_by = {u.strip() for u in str(knob.get("used_by", "")).split(",") if u.strip()}
    if used_by == {"server"} or name.startswith("BYTEPS_SERVER_"):
        return "Server"
    return "Worker core"


def _number(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def _escape(text: str) -> str:
    """Make text safe inside a Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _accepted(knob: Dict) -> str:
    """The 'accepted values' cell: range, choices, or what the type accepts."""
    kind = knob["type"]
    rng: Optional[Sequence[float]] = knob.get("range")
    choices: List[str] = list(knob.get("choices") or [])
    if kind == "choice" and choices:
        upper = [c for c in choices if c == c.upper()]
        lower = {c.lower() for c in upper}
        rest = [c for c in choices if c not in upper and c not in lower]
        if upper and lower <= set(choices) and not rest and len(upper) < len(choices):
            return ", ".join(f"`{c}`" for c in upper) + " (or lower case)"
        return ", ".join(f"`{c}`" for c in choices)
    if kind == "bool":
        return "`0`/`1`, `true`/`false`, `yes`/`no`, `on`/`off`"
    if kind in ("int", "float"):
        what = "integer" if kind == "int" else "number"
        if rng is not None:
            return f"{what} in [{_number(rng[0])}, {_number(rng[1])}]"
        return f"any {what}"
    return "any string"


def _default(knob: Dict) -> str:
    d = knob.get("default", "")
    return f"`{_escape(d)}`" if d != "" else "*(unset)*"


def _used_by(knob: Dict) -> str:
    return ", ".join(u.strip() for u in str(knob.get("used_by", "")).split(",") if u.strip())


def _description(knob: Dict) -> str:
    text = _escape(knob.get("doc", "")).strip()
    aliases = list(knob.get("aliases") or [])
    if aliases:
        names = ", ".join(f"`{a}`" for a in aliases)
        text += f" Legacy name{'s' if len(aliases) > 1 else ''}: {names}."
    return text


def _row(knob: Dict) -> str:
    cells = [
        f"`{knob['name']}`",
        knob["type"],
        _default(knob),
        _accepted(knob),
        _used_by(knob),
        _description(knob),
    ]
    return "| " + " | ".join(cells) + " |"


_UPSTREAM_TITLE = "Upstream BytePS variables"

_UPSTREAM_HEADER = (
    "| Upstream variable | Here | Values that change nothing | What happens here |\n"
    "|---|---|---|---|"
)

_UPSTREAM_INTRO = (
    "Every variable that upstream BytePS (its core, ps-lite, launcher and build) reads, and "
    "what it does here; declared in `core/cpp/common/upstream_knobs.cc`. When a process (a "
    "worker at `init()`, a server, the scheduler, `bpslaunch`) finds in its environment a "
    "`BYTEPS_*`/`DMLC_*` name that is not a variable of the tables above, it names it in one "
    "warning (once per process), with the closest known name (`did you mean "
    "BYTEPS_PARTITION_BYTES?`) and never its value. An upstream variable that is *replaced* "
    "or *ignored* gets a warning saying what happens instead, or an INFO line when its value "
    "changes nothing (e.g. `DMLC_NUM_PORTS=1`). A *refused* one (none at present), set to any "
    "other value, would stop the process with `byteps.ConfigError` at `init()` (or when a "
    "server or the scheduler starts), and `bpslaunch` would refuse it before starting any "
    "process: ignoring it would train differently. Names marked *not checked* are not specific to BytePS "
    "(container runtimes and other libraries set them), so no process looks for them."
)


def _status_cell(var: Dict) -> str:
    """The 'here' cell: implemented / replaced by X / ignored / refused."""
    status = var["status"]
    if status == "replaced":
        by = var.get("replaced_by", "")
        by = f"`{by}`" if by.replace("_", "").isalnum() and by.isupper() else _escape(by)
        cell = f"replaced by {by}"
    elif status == "refused":
        cell = "**refused** (`ConfigError`)"
    else:
        cell = status
    if not var.get("checked", True):
        cell += " (not checked)"
    return cell


def _same_cell(var: Dict) -> str:
    values = [f"`{_escape(v)}`" for v in var.get("same") or []]
    if var.get("same_off"):
        values.append("empty, `0`, `false`, `no`, `off` (any case)")
    return ", ".join(values) if values else "-"


def _anchor(title: str) -> str:
    """GitHub's anchor of a ``## title`` heading."""
    return "-".join("".join(c for c in title.lower() if c.isalnum() or c == " ").split())


def _upstream_row(var: Dict, sections: Dict[str, str]) -> str:
    """One row; ``sections`` maps each knob's name to the title of its section above."""
    name = var["name"]
    # A knob links to its own row's section (and no second row starts with `NAME`).
    first = f"[`{name}`](#{_anchor(sections[name])})" if name in sections else f"`{name}`"
    here = _escape(var.get("here", "")).strip() or "Same name and meaning."
    here = here[0].upper() + here[1:]
    return "| " + " | ".join([first, _status_cell(var), _same_cell(var), here]) + " |"


def render_markdown(knobs: Optional[List[Dict]] = None,
                    upstream: Optional[List[Dict]] = None) -> str:
    """The whole ``docs/env.md`` page for ``knobs`` and ``upstream`` (default: the core's
    registry and its upstream table)."""
    if knobs is None:
        knobs = list(_core.knobs())
    if upstream is None:
        upstream = list(_core.upstream_knobs())
    lines = [
        "# Environment variables",
        "",
        "<!-- Generated by `python -m byteps.knobs --write docs/env.md`; do not edit by hand. -->",
        "",
        "Every variable of the tables below is declared once, in `core/cpp/common/knobs.cc` "
        "(name, type, default, accepted values, description, legacy aliases), and this page is "
        "generated from that table. Each is read once, at `init()` (or when a server or the "
        "scheduler starts), validated against its declaration, and logged at INFO. A bad value "
        "raises `byteps.ConfigError` naming the variable, its value and what is accepted, "
        "before any thread or socket starts. Any other `BYTEPS_*`/`DMLC_*` variable is named "
        "in a warning; upstream BytePS's variables, and what each does here, are listed in the "
        f"[last section](#{_anchor(_UPSTREAM_TITLE)}).",
    ]
    by_group: Dict[str, List[Dict]] = {title: [] for title, _ in GROUPS}
    for k in knobs:
        by_group.setdefault(_group_of(k), []).append(k)
    for title, blurb in GROUPS:
        group = by_group.get(title) or []
        if not group:
            continue
        lines += ["", f"## {title}", "", blurb, "", _HEADER]
        lines += [_row(k) for k in group]
    sections = {k["name"]: _group_of(k) for k in knobs}
    lines += ["", f"## {_UPSTREAM_TITLE}", "", _UPSTREAM_INTRO, "", _UPSTREAM_HEADER]
    lines += [_upstream_row(v, sections) for v in upstream]
    return "\n".join(lines) + "\n"


def report_environment(env: Mapping[str, str], prog: str = "bpslaunch", out=None) -> Optional[str]:
    """Check the names of ``env`` the way every byteps process does, for a launcher.

    Prints one ``<prog>: warning: ...`` line on ``out`` (default ``sys.stderr``) per unknown
    ``BYTEPS_*``/``DMLC_*`` name (with the closest known name) and per upstream variable that
    is replaced or ignored here. Values are not validated (the processes do that).

    Args:
        env (Mapping[str, str]): the environment the launched processes would get.
        prog (str): prefix of the lines.
        out: text stream; default ``sys.stderr``.

    Returns:
        Optional[str]: ``None``, or the message of a refused upstream variable (none is at
        present): the caller must not start any process.
    """
    out = sys.stderr if out is None else out
    try:
        notices = _core.check_environment(dict(env))
    except ConfigError as err:
        return str(err)
    for notice in notices:
        if notice["warning"]:
            print(f"{prog}: warning: {notice['text']}", file=out)
    return None


def check(path: str, out=sys.stdout) -> int:
    """0 when ``path`` holds exactly :func:`render_markdown`'s page, else 1 (diff on ``out``)."""
    expected = render_markdown()
    try:
        with open(path, encoding="utf-8") as f:
            actual = f.read()
    except FileNotFoundError:
        print(f"{path} does not exist; run: python -m byteps.knobs --write {path}", file=out)
        return 1
    if actual == expected:
        return 0
    diff = difflib.unified_diff(
        actual.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=path,
        tofile=f"{path} (generated)",
    )
    out.writelines(diff)
    print(f"\n{path} is out of date; run: python -m byteps.knobs --write {path}", file=out)
    return 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m byteps.knobs",
        description="Render the BYTEPS_*/DMLC_* environment variables (docs/env.md).",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--markdown", action="store_true", help="print the Markdown page")
    mode.add_argument("--check", metavar="FILE", help="exit 1 with a diff if FILE is stale")
    mode.add_argument("--write", metavar="FILE", help="write the Markdown page to FILE")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(render_markdown())
        return 0
    if args.check:
        return check(args.check)
    with open(args.write, "w", encoding="utf-8") as f:
        f.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
