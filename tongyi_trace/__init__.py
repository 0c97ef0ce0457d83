"""kvtrace: KV-cache trace characterization, policy fitting, prefix-cache simulation and live vLLM replay.

The Python API (tongyi_trace.api, docs/api.md): `open_run`, `ingest`, `Run`. Names load on first use, so
importing the package (and `kvtrace --help`) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tongyi_trace.api import Run, ingest, open_run

__all__ = ["Run", "__version__", "ingest", "open_run"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("kvtrace")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
            return "0.0.0+source"
    if name in ("Run", "ingest", "open_run"):
        from tongyi_trace import api

        return getattr(api, name)
    raise AttributeError(f"module 'tongyi_trace' has no attribute {name!r}")
