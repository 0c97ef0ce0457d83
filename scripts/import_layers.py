"""Count kvtrace's import graph against the layer table of docs/architecture.md.

Prints the import circles (modules that import each other in a loop, lazy imports inside functions
included), the pairs of packages that import each other, and every import from a lower layer to a higher
one. Each layer row of the table in docs/architecture.md ("## The house") names its packages and
modules in backticks (`sim/`, `study.py`); a module belongs to the row naming its longest prefix. An
import of a package that holds the importer (`from tongyi_trace import __version__`) is not counted:
Python loads it before the importer anyway.

    python scripts/import_layers.py            # the sheet in words; exit 1 when a circle is found
    python scripts/import_layers.py --json     # the same as JSON

Standard library only (ast): nothing of the project is imported or run.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tongyi_trace"
_ROW = re.compile(r"^\|\s*(\d+)\s+([\w ]+?)\s*\|(.*)\|\s*$")
_NAME = re.compile(r"`([\w/.]+)`")


@dataclass
class Graph:
    """The modules of the package, their imports of each other and the layer of each module."""

    modules: list[str]
    edges: dict[str, set[str]]
    layer_of: dict[str, tuple[int, str]]
    unplaced: list[str] = field(default_factory=list)


def read_layers(doc: Path) -> list[tuple[int, str, list[str]]]:
    """The layer table of DOC: (number, name, [package or module path under tongyi_trace/, ...]) per row."""
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            rows.append((int(m.group(1)), m.group(2).strip(), _NAME.findall(m.group(3))))
    if not rows:
        raise SystemExit(f"{doc}: no layer table (rows '| N name | `pkg/`, `module.py` |')")
    return rows


def _module_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module of the package that TREE imports (at the top or inside a function)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def build_graph(root: Path = ROOT, doc: Path | None = None) -> Graph:
    """The import graph of ROOT/tongyi_trace, each module placed in its layer of DOC's table."""
    doc = doc or root / "docs" / "architecture.md"
    files = sorted((root / PACKAGE).rglob("*.py"))
    names = {_module_of(f, root): f for f in files}
    edges: dict[str, set[str]] = {}
    for name, f in names.items():
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        targets = {t for t in _imports(tree, name, f.name == "__init__.py") if t in names}
        edges[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    layer_of: dict[str, tuple[int, str]] = {}
    prefixes: list[tuple[str, int, str]] = []
    for number, label, paths in read_layers(doc):
        for p in paths:
            dotted = p.removesuffix(".py").rstrip("/").replace("/", ".")
            prefixes.append((PACKAGE if dotted == "__init__" else f"{PACKAGE}.{dotted}", number, label))
    unplaced = []
    for name in names:
        best = max((pre for pre in prefixes
                    if name == pre[0] or (pre[0] != PACKAGE and name.startswith(pre[0] + "."))),
                   key=lambda pre: len(pre[0]), default=None)
        if best is None:
            unplaced.append(name)
        else:
            layer_of[name] = (best[1], best[2])
    return Graph(sorted(names), edges, layer_of, unplaced)


def circles(graph: Graph) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.edges.get(v, ())):
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
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph.modules:
        if v not in index:
            visit(v)
    return sorted(found)


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def mutual_packages(graph: Graph) -> list[tuple[str, str]]:
    """Pairs of packages (tongyi_trace.X) that import each other, each pair once."""
    pkg_edges = {(_package(a), _package(b)) for a, targets in graph.edges.items() for b in targets
                 if _package(a) != _package(b)}
    return sorted((a, b) for a, b in pkg_edges if (b, a) in pkg_edges and a < b)


def upward_imports(graph: Graph) -> list[tuple[str, str]]:
    """Every import (importer, imported) from a lower layer to a higher one."""
    up = []
    for a in graph.modules:
        for b in sorted(graph.edges.get(a, ())):
            if a in graph.layer_of and b in graph.layer_of and graph.layer_of[a][0] < graph.layer_of[b][0]:
                up.append((a, b))
    return up


def main(argv: list[str] | None = None) -> int:
    """Print the circles, the mutual packages and the upward imports; exit 1 on a circle or an unplaced module."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    graph = build_graph()
    result = {
        "num_modules": len(graph.modules),
        "num_imports": sum(len(t) for t in graph.edges.values()),
        "circles": circles(graph),
        "mutual_packages": [list(p) for p in mutual_packages(graph)],
        "upward_imports": [[a, b, graph.layer_of[a][1], graph.layer_of[b][1]] for a, b in upward_imports(graph)],
        "unplaced_modules": graph.unplaced,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['num_modules']} modules, {result['num_imports']} imports between them")
        print(f"circles: {len(result['circles'])}")
        for c in result["circles"]:
            print("  " + " -> ".join(c))
        print(f"packages importing each other: {len(result['mutual_packages'])}")
        for a, b in result["mutual_packages"]:
            print(f"  {a} <-> {b}")
        print(f"upward imports: {len(result['upward_imports'])}")
        for a, b, la, lb in result["upward_imports"]:
            print(f"  {a} ({la}) -> {b} ({lb})")
        if graph.unplaced:
            print(f"modules in no layer of docs/architecture.md: {', '.join(graph.unplaced)}")
    return 1 if result["circles"] or graph.unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
