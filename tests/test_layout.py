"""The layout of the ``byteps`` sources: no import cycle among its modules, one seam between the
adapters and the core, small files (docs/architecture.md §2).

The sources are read with :mod:`ast` (nothing is imported, no framework needed): ``core/`` is
``byteps``, ``adapters/<fw>/`` is ``byteps.<fw>`` (``adapters/tensorflow/standalone_keras/`` is
``byteps.keras``) and ``server/`` is ``byteps.server``, as CMakeLists.txt installs them.

* **No cycle.** Every import of a ``byteps`` module, at the top of a file or inside a function,
  relative or absolute, is an edge of a graph among the package's modules; the graph has no
  cycle. ``from byteps.a import x`` is an edge to ``byteps.a.x`` when that is a module, else to
  ``byteps.a`` (whose ``__init__`` defines ``x``). Importing ``byteps.a.b`` counts as an edge to
  ``byteps.a.b`` only (Python runs ``byteps/a/__init__.py`` first, but a package's
  ``__init__`` that imports nothing back cannot close a cycle through it).
* **One seam.** ``adapters/`` and ``core/dlpack.py`` call the public functions of
  ``byteps.basics`` (and the other public modules): they import neither ``byteps._core`` nor a
  name of ``byteps.basics`` that starts with an underscore, nor read one as an attribute
  (``basics._x``, ``_b._x``), nor import an underscore name of a ``byteps`` module outside
  their own adapter.
* **Small files.** No Python file of the package is over :data:`MAX_LINES` lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the most lines a Python file of the package may have (docs/developers: ~600)
MAX_LINES = 620


def _package_files() -> dict[str, Path]:
    """{installed module name: source file} of every module of ``byteps``."""
    roots = [(ROOT / "core", "byteps"), (ROOT / "server", "byteps.server"),
             (ROOT / "adapters" / "tensorflow" / "standalone_keras", "byteps.keras")]
    roots += [(ROOT / "adapters" / fw, f"byteps.{fw}") for fw in ("torch", "tensorflow", "mxnet")]
    out: dict[str, Path] = {}
    for top, name in roots:
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top)
            if "cpp" in rel.parts[:1] or "__pycache__" in rel.parts:
                continue
            if name == "byteps.tensorflow" and rel.parts[0] == "standalone_keras":
                continue  # installed as byteps.keras
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([name, *parts])] = path
    return out


FILES = _package_files()
#: the package's compiled modules (no source to read)
EXTENSIONS = ("byteps._core",)


def _is_package(module: str) -> bool:
    return FILES[module].name == "__init__.py"


def _resolve(module: str, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(module: str):
    """Yield (imported byteps module, line, the import statement's first name) for every import
    of a byteps module in ``module``'s source, including imports inside functions."""
    tree = ast.parse(FILES[module].read_text(), str(FILES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "byteps" or alias.name.startswith("byteps."):
                    yield alias.name, node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node.level, node.module)
            if not (target == "byteps" or target.startswith("byteps.")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in FILES or sub in EXTENSIONS else target), node.lineno, \
                    alias.name


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in FILES}
    for module in FILES:
        for target, _, _ in _imports(module):
            if target in FILES and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth: the package's import depth (small)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in components:  # a shortest path back to the start, within the component
        members, start = set(comp), min(comp)
        paths = {start: [start]}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = paths[v] + [start]
                        break
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                if found:
                    break
            frontier = nxt
        cycles.append(found or sorted(comp))
    return cycles


def test_the_package_is_found():
    for name in ("byteps", "byteps.basics", "byteps.torch", "byteps.keras", "byteps.server",
                 "byteps.launch.cli", "byteps.sync.cost_model", "byteps.sim"):
        assert name in FILES, name
    assert _resolve("byteps.launch.cli", 1, "common") == "byteps.launch.common"
    assert _resolve("byteps.launch", 1, "common") == "byteps.launch.common"
    assert _resolve("byteps.launch.ray.executor", 2, "contract") == "byteps.launch.contract"


def test_cycle_finder_is_not_vacuous():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = _graph()
    # imports inside functions count: the cost model loads basics (and the core) only there
    assert "byteps.basics" in graph["byteps.sync.cost_model"]
    cycles = _cycles(graph)
    assert not cycles, "import cycles among byteps modules:\n" + "\n".join(
        " -> ".join(c) for c in cycles)


#: the entry points that run ``bpslaunch``: ``python -m byteps.launch`` and the module kept for
#: one release under the old name (``python -m byteps.launcher``)
CLI_ENTRY_POINTS = ("byteps.launch.__main__", "byteps.launcher")


def test_nothing_imports_the_launcher_cli():
    """The engines import ``common``/``contract``/``supervise``; the command line imports the
    engines; only the entry points import the command line."""
    importers = sorted(m for m, targets in _graph().items()
                       if "byteps.launch.cli" in targets and m not in CLI_ENTRY_POINTS)
    assert not importers, importers


def _own_adapter(module: str) -> str:
    """The package an adapter module may reach into: ``byteps.torch`` for ``byteps.torch.x``;
    byteps.keras is the TensorFlow adapter's too."""
    top = ".".join(module.split(".")[:2])
    return "byteps.tensorflow" if top == "byteps.keras" else top


def _seam_violations(module: str) -> list[str]:
    path = FILES[module]
    tree = ast.parse(path.read_text(), str(path))
    own = _own_adapter(module) if module != "byteps.dlpack" else "byteps.dlpack"
    basics_aliases = {"basics"}
    bad = []
    for target, line, name in _imports(module):
        where = f"{path.relative_to(ROOT)}:{line}"
        if target == "byteps._core" or target.startswith("byteps._core."):
            bad.append(f"{where}: imports byteps._core")
        elif target == "byteps.basics" and name.startswith("_"):
            bad.append(f"{where}: imports byteps.basics.{name}")
        elif name.startswith("_") and not (target == own or target.startswith(own + ".")) \
                and name != "__version__":
            bad.append(f"{where}: imports {name} from {target}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name in ("basics", "byteps.basics") and alias.asname:
                    basics_aliases.add(alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            value = node.value
            owner = value.id if isinstance(value, ast.Name) else \
                value.attr if isinstance(value, ast.Attribute) else None
            if owner in basics_aliases or node.attr == "_core":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: reads {owner}.{node.attr}")
    return bad


def test_adapters_use_public_basics_only():
    modules = [m for m, p in FILES.items()
               if ROOT / "adapters" in p.parents or m == "byteps.dlpack"]
    assert "byteps.torch.ops" in modules and "byteps.dlpack" in modules
    bad = [v for m in sorted(modules) for v in _seam_violations(m)]
    assert not bad, "adapters must call byteps.basics' public functions:\n" + "\n".join(bad)


def test_seam_check_is_not_vacuous(tmp_path, monkeypatch):
    src = tmp_path / "ops.py"
    src.write_text("from byteps import _core\nfrom byteps import basics as _b\n"
                   "from byteps.basics import _as_int\nfrom byteps.naming import _private\n"
                   "_b._require_init()\nimport byteps\nbyteps._core.poll(1)\n")
    monkeypatch.setitem(FILES, "byteps.torch.fake_ops", src)
    monkeypatch.setattr("test_layout.ROOT", tmp_path)
    bad = _seam_violations("byteps.torch.fake_ops")
    assert len(bad) == 5, bad


@pytest.mark.parametrize("module", sorted(FILES))
def test_files_are_small(module):
    lines = len(FILES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{FILES[module].relative_to(ROOT)}: {lines} lines"
