"""The house's layers (docs/architecture.md, "The house"): counted by scripts/import_layers.py, the import
graph has no circle, no two packages import each other, every module is in a layer, and at most 4 imports
run from a lower layer to a higher one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_UPWARD_IMPORTS = 4


@pytest.fixture(scope="module")
def layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_layers", ROOT / "scripts" / "import_layers.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["import_layers"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_house_has_no_circle_and_few_upward_imports(layers: ModuleType) -> None:
    graph = layers.build_graph(ROOT)
    assert graph.unplaced == [], "modules in no layer of docs/architecture.md's table"
    assert layers.circles(graph) == []
    assert layers.mutual_packages(graph) == []
    up = layers.upward_imports(graph)
    assert len(up) <= MAX_UPWARD_IMPORTS, up
    assert len(graph.modules) > 100 and sum(map(len, graph.edges.values())) > 400  # the whole package was read


def test_the_count_finds_circles_pairs_and_upward_imports(layers: ModuleType, tmp_path: Path) -> None:
    pkg = tmp_path / "tongyi_trace"
    (pkg / "sim").mkdir(parents=True)
    (pkg / "trace").mkdir()
    files = {
        "__init__.py": "",
        "run.py": "",
        "sim/__init__.py": "",
        "sim/a.py": "from tongyi_trace.sim import b\nfrom tongyi_trace.run import x\n",
        "sim/b.py": "def f():\n    from .a import g  # a lazy import closes the circle\n",
        "sim/c.py": "import tongyi_trace.trace.t\n",
        "trace/__init__.py": "",
        "trace/t.py": "from tongyi_trace.sim.c import y\n",
        "trace/u.py": "",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    doc = tmp_path / "arch.md"
    doc.write_text("| layer | modules |\n|---|---|\n| 3 engine room | `sim/` |\n| 2 trace | `trace/` |\n"
                   "| 1 ground | `run.py`, `__init__.py` |\n")
    graph = layers.build_graph(tmp_path, doc)
    assert layers.circles(graph) == [["tongyi_trace.sim.a", "tongyi_trace.sim.b"],
                                     ["tongyi_trace.sim.c", "tongyi_trace.trace.t"]]
    assert layers.mutual_packages(graph) == [("tongyi_trace.sim", "tongyi_trace.trace")]
    assert layers.upward_imports(graph) == [("tongyi_trace.trace.t", "tongyi_trace.sim.c")]
    doc.write_text("| layer | modules |\n|---|---|\n| 3 engine room | `sim/` |\n| 1 ground | `run.py` |\n")
    assert sorted(layers.build_graph(tmp_path, doc).unplaced) == [
        "tongyi_trace", "tongyi_trace.trace", "tongyi_trace.trace.t", "tongyi_trace.trace.u"]
