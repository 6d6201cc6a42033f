"""sr's layers: no import climbs to a layer above its module's, and no import loop.

Every import of every module of `sr/` counts, read with `ast`: at the top, inside a
function and under `if TYPE_CHECKING:` alike, since each one ties the importer to what it
names. The only exceptions are the lazy package faces (`sr`, `sr.pool`), whose names
resolve on first use (sr.lazy_names): what they import eagerly is held to sr.lazy_names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import sr

# The layers, bottom to top: a module may import its own layer and those below it.
# - base: services every room uses (errors, events, logs, request ids, the settings read
#   from the environment, the shape of an HTTP answer) and the small shared pieces (the
#   LRU, the error-answer reader, Prometheus text, thread budgets); `sr` is here for
#   `__version__`, its lazy names aside.
# - http: the HTTP/1.1 stack, for the router's front door, the workers and the client.
# - config and devices: the schema, its validation and placement over the host's devices.
# - models, then worker: the families, and the process that serves one of them.
# - api: the typed Python API; below the pool because the Supervisor holds it, and it
#   reaches the pool only through its Dispatch protocol.
# - pool, router, then the command line, which only dispatches to each command's module.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "sr",
        "sr.answer",
        "sr.errors",
        "sr.events",
        "sr.logs",
        "sr.request_id",
        "sr.settings",
        "sr.traces",
        "sr.lru",
        "sr.error_answer",
        "sr.exposition",
        "sr.thread_budget",
        "sr.lazy_names",
    ),
    ("sr.http",),
    ("sr.config", "sr.devices"),
    ("sr.models",),
    ("sr.worker",),
    ("sr.api",),
    ("sr.pool",),
    ("sr.router",),
    ("sr.cli", "sr.__main__"),
)
LAZY_FACES = frozenset({"sr", "sr.pool"})
SR_ROOT = Path(sr.__file__).parent

Graph = Mapping[str, set[str]]


def module_sources(root: Path) -> dict[str, str]:
    """Every module under `root` (a package folder named `sr`), by dotted name."""
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        sources[".".join(parts)] = path.read_text()
    return sources


def imported_modules(name: str, source: str, known: Iterable[str], *, package: bool) -> set[str]:
    """The sr modules `source` (module `name`) imports, anywhere in it: `from P import X`
    names module P.X when there is one, else P; an unknown name counts as its longest known
    parent."""
    known = set(known)
    home = name if package else name.rpartition(".")[0]

    def known_prefix(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = home.split(".")[: len(home.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            resolved = known_prefix(target) if target.split(".")[0] == "sr" else None
            if resolved is not None and resolved != name:
                found.add(resolved)
    return found


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    return {
        name: imported_modules(name, text, sources, package=_is_package(name, sources))
        for name, text in sources.items()
    }


def _is_package(name: str, sources: Mapping[str, str]) -> bool:
    return any(other.startswith(name + ".") for other in sources)


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest entry `module` is or sits under."""
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            inside = module == entry or module.startswith(entry + ".")
            if inside and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def upward_imports(graph: Graph, exempt: frozenset[str] = LAZY_FACES) -> list[str]:
    found = []
    for importer, targets in sorted(graph.items()):
        if importer in exempt:
            continue
        for target in sorted(targets):
            if (layer_of(target) or 0) > (layer_of(importer) or 0):
                found.append(f"{importer} -> {target}")
    return found


def import_cycles(graph: Graph, exempt: frozenset[str] = LAZY_FACES) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan), faces' imports left out."""
    edges = {name: sorted(targets) for name, targets in graph.items() if name not in exempt}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def sr_graph() -> dict[str, set[str]]:
    return import_graph(module_sources(SR_ROOT))


def test_every_module_has_a_layer():
    assert [name for name in sr_graph() if layer_of(name) is None] == []


def test_no_import_climbs_to_a_higher_layer():
    assert upward_imports(sr_graph()) == []


def test_no_import_cycle():
    assert import_cycles(sr_graph()) == []


def test_the_lazy_faces_import_only_the_lazy_names_helper_at_run_time():
    """The faces are exempt above because their names resolve on first use; what runs
    when they are imported is sr.lazy_names alone (their TYPE_CHECKING block never runs)."""
    sources = module_sources(SR_ROOT)
    for face in sorted(LAZY_FACES):
        tree = ast.parse(sources[face])
        eager = [
            node
            for node in tree.body
            if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
        ]
        else_branches = [
            statement
            for node in tree.body
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for statement in node.orelse
        ]
        source = "\n".join(ast.unparse(node) for node in [*eager, *else_branches])
        imports = imported_modules(face, source, sources, package=True)
        assert imports <= {"sr.lazy_names"}, (face, imports)


def test_the_checks_see_function_local_and_type_checking_imports(tmp_path):
    root = tmp_path / "sr"
    (root / "http").mkdir(parents=True)
    (root / "pool").mkdir()
    for package in (root, root / "http", root / "pool"):
        (package / "__init__.py").write_text("")
    (root / "errors.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sr.http import client\n"
    )
    (root / "http" / "client.py").write_text("def f():\n    from sr.pool import replica\n")
    (root / "pool" / "replica.py").write_text("from sr import errors\n")
    graph = import_graph(module_sources(root))
    assert upward_imports(graph) == [
        "sr.errors -> sr.http.client",
        "sr.http.client -> sr.pool.replica",
    ]
    assert import_cycles(graph) == [["sr.errors", "sr.http.client", "sr.pool.replica"]]
