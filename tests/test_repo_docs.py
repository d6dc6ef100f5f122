"""The repository stands alone and its architecture page stays true to the code.

* README.md and docs/*.md link only to files inside the repository (and to headings that exist);
* nothing cites a document outside the repository or an issue tracker;
* docs/architecture.md agrees with the code on what a reader would look up there: the pipeline
  stages and the plan of each machine layout, the message types, the partition, credit and
  engine-thread defaults, and every "docs/architecture.md §N" that a code comment cites exists;
* its §2 names every folder of the C++ core and every module of the Python package, and its
  table of messages has a row for every message type, citing files that exist.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCH = ROOT / "docs" / "architecture.md"
CPP = ROOT / "core" / "cpp"


def _markdown_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(path: Path):
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", path.read_text(), re.M)}


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository(md):
    bad = []
    for target in _LINK.findall(md.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, bad


def _tracked_text_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    files = []
    for name in out.stdout.splitlines():
        p = ROOT / name
        if p.suffix in {".py", ".md", ".h", ".cc", ".txt", ".toml", ".cfg", ".sh", ""} and \
                p.is_file():
            files.append(p)
    return files


#: Citations of documents outside the repository, and issue-tracker references.
_OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|upstream-byteps\.md")
_TRACKER = re.compile(r"(?i)\bissues?\s*#?\d+\b|\b(this|that|foundation|previous|next) issue\b"
                      r"|\bPR\s*#\d+|\bgh-\d+\b")


def test_no_outside_or_tracker_references():
    hits = []
    for p in _tracked_text_files():
        rel = str(p.relative_to(ROOT))
        if rel == "tests/test_repo_docs.py":
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line) or _TRACKER.search(line):
                hits.append(f"{rel}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_tracker_pattern_is_not_vacuous():
    for text in ("fixed in issue 5", "see issue #12", "(foundation issue)", "later in this issue",
                 "PR #3"):
        assert _TRACKER.search(text), text
    for text in ("synchronise in reverse order of issue", "issued all at once", "no issues"):
        assert not _TRACKER.search(text), text
    assert _OUTSIDE.search("see ../shared/DESIGN.md")


# ---------------------------------------------------------------------------- architecture
def _section(number: int) -> str:
    text = ARCH.read_text()
    m = re.search(rf"^## {number}\. .*?(?=^## \d+\. |\Z)", text, re.M | re.S)
    assert m, f"docs/architecture.md has no section {number}"
    return m.group(0)


def _enum_names(header: Path, enum: str, name_file: Path, kind: str):
    """Names (from the name function in name_file) of every enumerator of `enum`."""
    body = re.search(rf"enum class {enum}\b[^{{]*\{{(.*?)\}};", header.read_text(), re.S).group(1)
    members = [m for m in re.findall(r"^\s*(k\w+)\s*=", body, re.M) if m != "kCount"]
    names = dict(re.findall(rf"case {kind}::(k\w+):\s*return \"(\w+)\";", name_file.read_text()))
    missing = [m for m in members if m not in names]
    assert not missing, f"{enum} members without a name: {missing}"
    return [names[m] for m in members]


def _stage_rows(device=False, all_reduce=False, nccl=False):
    """(name, [slot per layout], compressed_only) of every row of the stage table, in order;
    the rows of device tensors only (device_only) with ``device``; the rows of an all-reduce
    tensor's plan (``/*schemes=*/`` kAny or kAllReduceOnly) with ``all_reduce``, those of the
    summation service's (kAny or kPsOnly) without, every row with ``all_reduce=None``. The
    slots are the ``where`` columns, or with ``nccl`` the ``nccl`` ones (an NCCL tensor's)."""
    text = (CPP / "pipeline" / "stage_table.cc").read_text()
    text = text[text.index("StageTable::rows[kStageCount] = {"):]
    rows = re.findall(r'\{Stage::k\w+, "(\w+)",([^{}]*)\{([^{}]*)\},\s*\{([^{}]*)\}\},',
                      text)
    skip = {None: "-", True: "kPsOnly", False: "kAllReduceOnly"}[all_reduce]
    return [(name, [s.strip() for s in (by_nccl if nccl else slots).split(",")],
             "compressed_only=*/true" in middle)
            for name, middle, slots, by_nccl in rows
            if (device or "device_only=*/true" not in middle)
            and f"schemes=*/{skip}" not in middle]


def test_stage_list_matches_the_code():
    rows = _stage_rows(device=True, all_reduce=None)
    stages = [name for name, _, _ in rows]
    assert stages[:4] == ["REDUCE", "COPY_D2H", "COPY_IN", "LOCAL_REDUCE"]  # the table parsed
    table = re.findall(r"^\s*\| `(\w+)` \|", _section(3), re.M)
    assert table == stages, f"§3 stage table {table} != the stage table's rows {stages}"


def test_stage_layouts_match_the_code():
    """§3's layout table is the stage table read by column: the stages of each layout's plan and
    the gates in front of them (a gate already passed earlier in a plan is not waited for
    again), and a row of its own for a compressed tensor and for an all-reduce tensor (ring,
    tree: docs/schemes.md) where its plan differs. A device tensor's plan is the same between
    COPY_D2H and COPY_H2D (test below)."""
    ps_rows, ar_rows = _stage_rows(), _stage_rows(all_reduce=True)
    doc = re.findall(r"^\s*\| ([^`|][^|]*?) \| `([A-Z_]+(?: → [A-Z_]+)*)` \| ([^|]*?) \|$",
                     _section(3), re.M)
    want = []
    for column in range(len(ps_rows[0][1])):
        plans = []
        for variant in ("plain", "compressed", "all-reduce"):
            compressed = variant == "compressed"
            rows = ar_rows if variant == "all-reduce" else ps_rows
            plan, gates, passed = [], [], set()
            for name, slots, only in rows:
                if slots[column] == "kNo" or (only and not compressed):
                    continue
                plan.append(name)
                gate = re.fullmatch(r"After\(k(\w+)\)", slots[column])
                if gate and gate.group(1) not in passed:
                    passed.add(gate.group(1))
                    gates.append(f"`{gate.group(1).upper()}` before `{name}`")
            if variant != "plain" and plan == plans[0][0]:
                continue
            plans.append((plan, gates))
            want.append((variant, " → ".join(plan), ", ".join(gates) or "–"))
    assert len(ps_rows[0][1]) == 5 and len(doc) == len(want), (doc, want)
    for (layout, doc_stages, doc_gates), (variant, plan, gates) in zip(doc, want):
        assert layout.endswith(", compressed tensor") == (variant == "compressed"), (layout, plan)
        assert layout.endswith(", all-reduce tensor") == (variant == "all-reduce"), (layout, plan)
        assert doc_stages == plan, (layout, plan)
        assert doc_gates == gates, (layout, gates)


def test_device_stages_frame_every_plan():
    """The device-only rows are COPY_D2H, first in every layout's plan but one process on one
    machine's, and COPY_H2D, last; §3 says so, and that COPY_OUT copies within the device
    there."""
    host = {name for name, _, _ in _stage_rows()}
    rows = [row for row in _stage_rows(device=True) if set(row[1]) != {"kNo"}]  # host plans'
    device = [(name, slots) for name, slots, _ in rows if name not in host]
    assert [name for name, _ in device] == ["COPY_D2H", "COPY_H2D"]
    assert rows[0][0] == "COPY_D2H" and rows[-1][0] == "COPY_H2D"
    # the first column is one process on one machine (Layout::kOneProcess)
    assert all(slots[0] == "kNo" and all(s == "kQueue" for s in slots[1:])
               for _, slots in device), device
    text = " ".join(_section(3).split())
    assert ("A device tensor's plan is the layout's plan with `COPY_D2H` first and `COPY_H2D` "
            "last") in text
    assert "in every layout but one process on one machine" in text


def test_message_types_match_the_code():
    types = _enum_names(CPP / "ps" / "protocol.h", "MsgType", CPP / "ps" / "protocol.cc",
                        "MsgType")
    assert "PUSH" in types and "REGISTER" in types
    text = _section(6)
    frames = text[text.index("**Frames**"):text.index("**Push and pull.**")]
    listed = set(re.findall(r"`([A-Z_]+)`", frames))
    assert listed == set(types), (f"§6 lists {sorted(listed - set(types))} that the code does "
                                  f"not have and misses {sorted(set(types) - listed)}")


def _layout_tree() -> str:
    """The code block of §2: the tree of the code."""
    return re.search(r"```\n(.*?)```", _section(2), re.S).group(1)


def test_layout_tree_names_every_folder_and_module():
    tree = _layout_tree()
    folders = sorted(p.relative_to(CPP).as_posix() for p in CPP.rglob("*")
                     if p.is_dir() and "__pycache__" not in p.parts)
    missing = [f for f in folders if f"{f.rsplit('/', 1)[-1]}/" not in tree]
    assert not missing, f"§2's tree leaves out the C++ folders {missing}"
    core = ROOT / "core"
    modules = sorted(p.relative_to(core).with_suffix("").as_posix() for p in core.rglob("*.py")
                     if p.stem not in ("__init__", "__main__"))
    missing = [m for m in modules if not re.search(rf"\b{m.rsplit('/', 1)[-1]}\b", tree)]
    assert not missing, f"§2's tree leaves out the Python modules {missing}"
    for package in sorted(p.parent for p in core.rglob("__init__.py") if p.parent != core):
        name = package.relative_to(core).as_posix().rsplit("/", 1)[-1]
        assert f"{name}/" in tree, f"§2's tree leaves out the package core/{name}/"


def _message_rows():
    text = _section(2)
    table = text[text.index("| message | sent by | handled by (file) |"):]
    return [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_message_table_covers_every_type_and_cites_real_files():
    rows = _message_rows()
    first = {line.split("|")[1].strip(): line for line in rows}
    ps = set()
    for cell in first:
        if not cell.startswith(("p2p ", "local ")):
            ps |= set(re.findall(r"`([A-Z_]+)`", cell))
    types = _enum_names(CPP / "ps" / "protocol.h", "MsgType", CPP / "ps" / "protocol.cc",
                        "MsgType")
    assert ps == set(types), (f"§2's messages list {sorted(ps - set(types))} that the code does "
                              f"not have and miss {sorted(set(types) - ps)}")
    local = set()
    for cell in first:
        if cell.startswith("local "):
            local |= set(re.findall(r"`([A-Z_]+)`", cell))
    body = re.search(r"enum class LocalSignalType\b[^{]*\{(.*?)\};",
                     (CPP / "pipeline" / "local_channel.h").read_text(), re.S).group(1)
    signals = {re.sub(r"(?<!^)([A-Z])", r"_\1", m).upper()
               for m in re.findall(r"^\s*k(\w+)\s*=", body, re.M)}
    assert local == signals, (sorted(local - signals), sorted(signals - local))
    p2p = set(re.findall(r"`([A-Z_]+)`", next(c for c in first if c.startswith("p2p "))))
    body = re.search(r"enum class P2pMsg\b[^{]*\{(.*?)\};",
                     (CPP / "p2p" / "channel.h").read_text(), re.S).group(1)
    assert p2p == {m.upper() for m in re.findall(r"k(\w+)\s*=", body)}
    cited = set(re.findall(r"`((?:ps|pipeline|p2p|comm)/[\w/]+\.(?:cc|h))`", "\n".join(rows)))
    assert cited and not [c for c in cited if not (CPP / c).exists()], cited


def _knob_default(name: str) -> str:
    m = re.search(rf'\w+\("{name}", "([^"]*)"', (CPP / "common" / "knobs.cc").read_text())
    assert m, name
    return m.group(1)


def _digits(text: str) -> str:
    return re.sub(r"(?<=\d)[ \u00a0\u202f](?=\d{3}\b)", "", text)


def test_defaults_match_the_code():
    s4 = _digits(_section(4))
    assert f"**{_knob_default('BYTEPS_PARTITION_BYTES')} bytes**" in s4
    single = re.search(r"kSingleMachinePartitionBytes = (\d+) << 20;",
                       (CPP / "pipeline" / "worker_config.h").read_text())
    assert f"**{single.group(1)} MiB**" in s4
    assert f"(default {_knob_default('BYTEPS_SCHEDULING_CREDIT')})" in _section(5)
    assert f"(default {_knob_default('BYTEPS_SERVER_ENGINE_THREAD')})" in _section(7)
    s8 = _section(8)
    for knob, shown in (("BYTEPS_HEARTBEAT_INTERVAL", "1 s"), ("BYTEPS_HEARTBEAT_TIMEOUT", "15 s"),
                        ("BYTEPS_TIMEOUT", "120 s"), ("BYTEPS_STALL_WARNING_SECONDS", "60 s")):
        assert f"{_knob_default(knob)} s" == shown and f"`{knob}` ({shown}" in s8, knob


def test_cited_sections_exist():
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", ARCH.read_text(), re.M)}
    cite = re.compile(r"docs/architecture\.md\s+§(\d+)((?:[,;]?\s*(?:[a-z ]+:\s*)?§\d+)*)")
    bad = []
    for p in list(ROOT.glob("core/**/*")) + list(ROOT.glob("adapters/**/*")) + \
            list(ROOT.glob("benchmarks/*.py")) + list(ROOT.glob("tests/*.py")) + \
            _markdown_files():
        if not p.is_file() or p.suffix not in {".py", ".h", ".cc", ".md"}:
            continue
        for m in cite.finditer(p.read_text()):
            numbers = [int(m.group(1))] + [int(n) for n in re.findall(r"§(\d+)", m.group(2))]
            bad += [f"{p.relative_to(ROOT)}: §{n}" for n in numbers if n not in sections]
    assert not bad, bad


def test_nccl_plans_match_the_code():
    """docs/gpu.md's table of an NCCL tensor's plans is the stage table's `nccl` columns of the
    multi-process layouts (a plain tensor of the summation service), with their gates; the
    single-process columns are empty."""
    rows = _stage_rows(device=True, nccl=True)
    assert [name for name, _, _ in rows][:2] == ["REDUCE", "COPY_D2H"], rows
    assert all(slots[0] == slots[1] == "kNo" for _, slots, _ in rows), rows
    text = (ROOT / "docs" / "gpu.md").read_text()
    section = text[text.index("The plans, per layout"):]
    doc = re.findall(r"^\| (L processes[^|]*?) \| `([A-Z_0-9]+(?: → [A-Z_0-9]+)*)` \| ([^|]*?) \|$",
                     section, re.M)
    layouts = {2: "L processes, one machine",
               3: "L processes per machine, distributed, local root",
               4: "L processes per machine, distributed, other local ranks"}
    want = []
    for column, layout in layouts.items():
        plan, gates = [], []
        for name, slots, only in rows:
            if slots[column] == "kNo" or only:
                continue
            plan.append(name)
            gate = re.fullmatch(r"After\(k(\w+)\)", slots[column])
            if gate:
                gates.append(f"`{gate.group(1).upper()}` before `{name}`")
        want.append((layout, " → ".join(plan), ", ".join(gates) or "–"))
    assert doc == want, (doc, want)
