"""The run folder: where the normalized tables and every later artifact of one trace live."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tongyi_trace.errors import InputError

RUN_SCHEMA = "kvtrace.run/1"


@dataclass(frozen=True)
class RunDir:
    """Paths of one run folder's artifacts."""

    path: Path

    @property
    def provenance_path(self) -> Path:
        return self.path / "provenance.json"

    @property
    def requests_path(self) -> Path:
        return self.path / "requests.parquet"

    @property
    def blocks_path(self) -> Path:
        return self.path / "blocks.parquet"

    def subdir(self, name: str) -> Path:
        """RUN_DIR/name, created on first use (analysis, fit, sim, replay...)."""
        d = self.path / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def provenance(self) -> dict[str, Any]:
        """The provenance record written by ingest."""
        return load_provenance(self)

    def requests(self) -> pl.DataFrame:
        """The normalized requests table."""
        return pl.read_parquet(self.requests_path)

    def blocks(self, columns: list[str] | None = None) -> pl.DataFrame:
        """The normalized blocks table (optionally only some columns)."""
        return pl.read_parquet(self.blocks_path, columns=columns)


def is_run_dir(path: Path) -> bool:
    """True when PATH holds the normalized tables of an ingested trace."""
    return path.is_dir() and (path / "provenance.json").is_file() and (path / "blocks.parquet").is_file()


def open_run(path: str | Path) -> RunDir:
    """Open an existing run folder, or raise InputError saying how to make one."""
    p = Path(path)
    if not is_run_dir(p):
        raise InputError(f"{p}: not a kvtrace run folder (no provenance.json/blocks.parquet); "
                         f"run 'kvtrace ingest TRACE -o {p}' first")
    run = RunDir(p)
    load_provenance(run)
    return run


def load_provenance(run: RunDir) -> dict[str, Any]:
    """Read and check provenance.json."""
    try:
        prov: dict[str, Any] = json.loads(run.provenance_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{run.provenance_path}: unreadable ({e}); re-run 'kvtrace ingest'") from e
    if prov.get("schema") != RUN_SCHEMA:
        raise InputError(f"{run.provenance_path}: field 'schema' is {prov.get('schema')!r}, expected "
                         f"{RUN_SCHEMA!r}; re-run 'kvtrace ingest' with this kvtrace version")
    return prov


def write_json(path: Path, obj: Any) -> None:
    """Write OBJ as indented JSON atomically (temp file + rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
