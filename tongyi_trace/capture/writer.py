"""The captured trace file: JSON lines, plain or compressed by suffix (.gz, .zst), one flushed line each.

Each line is handed to the operating system as its request finishes: plain files directly; .gz with a
sync flush (a gzip reader sees every finished line); .zst with a block flush (a streaming zstd reader sees
every finished line). `close` ends the gzip member / zstd frame, so after a stop (Ctrl-C, SIGTERM) the file
is complete and valid for `kvtrace ingest`.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, Any

from tongyi_trace.errors import UsageError

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")


class LineWriter:
    """Appends lines to a new trace file (refuses an existing one unless OVERWRITE)."""

    def __init__(self, path: Path, overwrite: bool = False) -> None:
        name = path.name.lower()
        if not name.endswith(SUFFIXES):
            raise UsageError(f"-o {path}: the captured trace must be named *.jsonl, *.jsonl.gz or *.jsonl.zst")
        if path.is_dir():
            raise UsageError(f"-o {path}: is a directory; give a file name")
        if path.exists() and not overwrite:
            raise UsageError(f"-o {path}: exists; choose another name or pass --overwrite")
        if not path.parent.is_dir():
            raise UsageError(f"-o {path}: folder {path.parent} does not exist; create it first")
        self.path = path
        self.num_lines = 0
        self._raw: IO[bytes] = path.open("wb")
        self._zst: Any = None
        self._gz: gzip.GzipFile | None = None
        self._out: Any = self._raw
        if name.endswith(".zst"):
            import zstandard

            self._zst = zstandard.ZstdCompressor(level=3).stream_writer(self._raw, closefd=False)
            self._out = self._zst
        elif name.endswith(".gz"):
            self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
            self._out = self._gz

    def write_line(self, line: bytes) -> None:
        """Write LINE (without its newline) and flush it through the compressor to the OS."""
        self._out.write(line + b"\n")
        self.num_lines += 1
        if self._zst is not None:
            import zstandard

            self._zst.flush(zstandard.FLUSH_BLOCK)
        elif self._gz is not None:
            self._gz.flush()
        self._raw.flush()

    def close(self) -> None:
        """End the compressed frame and close the file (idempotent)."""
        if self._raw.closed:
            return
        try:
            if self._zst is not None:
                self._zst.close()
            elif self._gz is not None:
                self._gz.close()
        finally:
            self._raw.close()
