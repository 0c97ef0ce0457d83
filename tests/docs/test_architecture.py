"""docs/architecture.md names only functions, classes and constants that exist, in the modules it puts them."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
_MODULE = re.compile(r"tongyi_trace/[\w/]+?(?:\.py|/)(?=[\s`),.:;']|$)")
_TOKEN = re.compile(r"`([^`]+)`")
_NAME = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)(?:\(.*\))?$")


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").rstrip("/").replace("/", ".")


def misplaced_names(text: str) -> list[str]:
    """Every `name` of TEXT that is not defined in the module named before it (in its bullet, else in its
    section heading), as 'name (module): why'. Tokens that are not Python names, or that follow no module
    mention, are prose and not checked."""
    problems: list[str] = []
    for section in re.split(r"\n(?=## )", text):
        heading, _, body = section.partition("\n")
        found = _MODULE.findall(heading)
        heading_module = _module_name(found[-1]) if found else None
        for bullet in re.split(r"\n(?=- )", body):
            module = heading_module
            events = sorted([(m.start(), "module", m.group(0)) for m in _MODULE.finditer(bullet)]
                            + [(m.start(), "token", m.group(1)) for m in _TOKEN.finditer(bullet)])
            for _, kind, value in events:
                if kind == "module":
                    module = _module_name(value)
                    continue
                name = _NAME.match(value)
                if module is None or name is None or value.startswith("tongyi_trace/"):
                    continue
                problems += _check(module, name.group(1))
    return problems


def _check(module_name: str, dotted: str) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        return [f"{dotted} ({module_name}): no such module ({e})"]
    obj: object = module
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return [f"{dotted} ({module_name}): not defined there"]
        obj = getattr(obj, part)
    home = getattr(obj, "__module__", None)
    if (inspect.isfunction(obj) or inspect.isclass(obj)) and home != module_name:
        return [f"{dotted} ({module_name}): defined in {home}"]
    return []


def test_architecture_names_exist_where_it_says() -> None:
    assert misplaced_names(DOC.read_text(encoding="utf-8")) == []


def test_the_check_finds_missing_and_misplaced_names() -> None:
    text = ("## Code layout\n"
            "- `tongyi_trace/run.py`: `RunDir`, `read_requests`, `read_blocks`, `atomic_write_text`.\n"
            "  `tongyi_trace/trace/ingest.py`: `ingest_trace`, `run_identity`.\n"
            "- `requests`, `blocks` are views (no module: prose).\n"
            "## Integrity (tongyi_trace/run.py)\n"
            "- `RunDir.lock`, `RunDir.unlock`, `--overwrite`, `analysis/`.\n")
    assert misplaced_names(text) == [
        "read_requests (tongyi_trace.run): not defined there",
        "read_blocks (tongyi_trace.run): not defined there",
        "atomic_write_text (tongyi_trace.run): defined in tongyi_trace.atomic",
        "run_identity (tongyi_trace.trace.ingest): defined in tongyi_trace.run",
        "RunDir.unlock (tongyi_trace.run): not defined there",
    ]


PACKAGE = DOC.parents[1] / "tongyi_trace"
_MAP_TOKEN = re.compile(r"(tongyi_trace/(?:[\w]+/)*)|\b(\w+\.py)\b")


def unnamed_modules(text: str, package: Path) -> list[str]:
    """Every module file of PACKAGE that TEXT does not name: neither by its path (tongyi_trace/x/y.py) nor,
    in the section "## Module map", by its file name after its folder (tongyi_trace/x/: y.py, ...)."""
    named = set(re.findall(r"tongyi_trace/[\w/]+\.py", text))
    _, _, rest = text.partition("## Module map")
    for bullet in re.split(r"\n(?=- )", rest.split("\n## ", 1)[0]):
        folder = None
        for m in _MAP_TOKEN.finditer(bullet):
            if m.group(1):
                folder = m.group(1)
            elif folder is not None:
                named.add(folder + m.group(2))
    root = package.parent
    return sorted(p.relative_to(root).as_posix() for p in package.rglob("*.py")
                  if (p.relative_to(root).as_posix() not in named and p.name != "__init__.py") or
                  (p == package / "__init__.py" and "tongyi_trace/__init__.py" not in named))


def test_architecture_names_every_module() -> None:
    assert unnamed_modules(DOC.read_text(encoding="utf-8"), PACKAGE) == []


def test_the_module_check_finds_an_unnamed_module(tmp_path: Path) -> None:
    pkg = tmp_path / "tongyi_trace"
    (pkg / "sim").mkdir(parents=True)
    for name in ("__init__.py", "run.py", "sim/__init__.py", "sim/kernel.py", "sim/stream.py"):
        (pkg / name).write_text("")
    text = ("## Code layout\n- `tongyi_trace/run.py`: `RunDir`.\n"
            "## Module map\n- tongyi_trace/ (the top): __init__.py\n- tongyi_trace/sim/: kernel.py\n")
    assert unnamed_modules(text, pkg) == ["tongyi_trace/sim/stream.py"]
