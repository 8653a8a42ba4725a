#!/usr/bin/env python3
"""Check hark's import contracts: the layers in order, a sans-I/O session core, engines
that know nothing of the session, and no import cycles between modules.

Run from the repository root (``scripts/test`` does): ``python scripts/check_layers.py``.
It walks ``src/hark`` with :mod:`ast`, so it counts imports wherever they are (module level
or inside a function); imports under ``if TYPE_CHECKING:`` are left out, as they never run.
The exit status is 1 when an import breaks a contract and is not in an allow-list below.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

# The layers, lowest first: a module may import from its own layer and those below it,
# never from one above. docs/architecture.md ("Layers") shows the same table.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("eventloop",),
    ("protocol",),
    ("audio",),
    ("engines",),
    ("observability",),
    ("tools",),
    ("session",),
    ("driver",),
    ("cluster",),
    ("edge",),
    ("transports",),
    ("config",),
    ("server",),
    ("bench",),
    ("cli",),
)

# The session core is sans-I/O: nothing under session/ does I/O, keeps time or runs threads;
# driver/ runs it on the event loop.
CORE_FORBIDDEN = frozenset({"asyncio", "time", "socket", "threading"})
ENGINES_FORBIDDEN = ("hark.session", "hark.protocol", "hark.config")

# Imports that run against the layers today, each with why it is there and what would
# remove it. A new one fails the check; removing the cause should remove the entry.
LAYER_ALLOWED: dict[tuple[str, str], str] = {}

# Import cycles between modules, given as one import on each cycle that is allowed for now;
# the check leaves these imports out and then wants no cycle at all.
CYCLE_ALLOWED: dict[tuple[str, str], str] = {}


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "hark":
        return None
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    return None


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """Yield every module this tree imports at run time (not under TYPE_CHECKING)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield sub if sub in known else target
        stack.extend(ast.iter_child_nodes(node))


def collect(src: Path) -> dict[str, set[str]]:
    """Map each module under ``src`` to the modules it imports at run time."""
    files = {_module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[module] = set(_imports(tree, module, path.name == "__init__.py", known))
    return graph


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """Imports that break a contract: (importer, imported, which contract)."""
    found = []
    for module, targets in sorted(graph.items()):
        own = _layer_of(module)
        for target in sorted(targets):
            root = target.split(".")[0]
            if module.startswith("hark.session.") and root in CORE_FORBIDDEN:
                found.append((module, target, "the session core is sans-I/O"))
            if module.startswith("hark.engines") and any(
                target == f or target.startswith(f + ".") for f in ENGINES_FORBIDDEN
            ):
                found.append((module, target, "engines know no session, protocol or config"))
            theirs = _layer_of(target)
            if own is not None and theirs is not None and theirs > own:
                found.append((module, target, "imports a layer above its own"))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), among hark's modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0

    def edges(module: str) -> list[str]:
        return sorted(
            t
            for t in graph[module]
            if t in graph and t != module and (module, t) not in CYCLE_ALLOWED
        )

    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(edges(start))))
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "src"
    graph = collect(src)
    violations = layer_violations(graph)
    new = [v for v in violations if (v[0], v[1]) not in LAYER_ALLOWED]
    groups = cycles(graph)
    imports = {(module, target) for module, targets in graph.items() for target in targets}
    stale = [edge for edge in CYCLE_ALLOWED if edge not in imports and edge[0] in graph]
    stale += [edge for edge in LAYER_ALLOWED if edge not in {v[:2] for v in violations}]
    stale = [edge for edge in stale if edge[0] in graph]
    for module, target in stale:
        print(f"layers: {module} no longer imports {target}: remove it from the allow-list")
    for module, target, why in new:
        print(f"layers: {module} imports {target}: {why}")
    for group in groups:
        print(f"layers: import cycle among {', '.join(group)}")
    allowed = len(violations) - len(new)
    print(
        f"layers: {len(graph)} modules, {len(new)} new violations, {allowed} allowed, "
        f"{len(groups)} cycles"
    )
    return 1 if new or groups or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
