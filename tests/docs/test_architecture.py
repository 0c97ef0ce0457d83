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
