"""A trace file's bytes: the path checks, decompression of .gz and .zst (a damaged or truncated file is
an error naming the file, never a shorter trace), the leading byte-order mark dropped, and the bytes cut
into whole lines."""

from __future__ import annotations

import errno
import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tongyi_trace.errors import InputError, brief
from tongyi_trace.trace.records import ReadStats

BLOCK_BYTES = 1 << 20  # of the file (decompressed) read at a time
UTF8_BOM = b"\xef\xbb\xbf"  # a byte-order mark some editors put first (byte_blocks drops it)


def check_trace_path(path: Path) -> None:
    """Raise InputError unless PATH is a readable regular file (never opened here: a FIFO without a writer
    would block; a pipe, /dev/stdin or a device cannot be read the several times ingest reads a trace)."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: a loop of symbolic links; point it at the trace file") from None
        if e.errno == errno.ENOENT and path.is_symlink():
            raise InputError(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist; check the "
                             "trace path") from None
        if e.errno == errno.ENOENT:
            raise InputError(f"{path}: no such file; check the trace path") from None
        raise InputError(f"{path}: cannot read ({e.strerror}); check the trace path") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory, not a trace file; give the trace file itself")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "a character device"
                if stat.S_ISCHR(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise InputError(f"{path}: is {kind}, not a regular file; a trace is read several times (its hash, its "
                         "format, its records): save it to a file first (e.g. cat > trace.jsonl) and give that")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: not readable (permission denied); check the file's permissions")


def _zstd_blocks(f: IO[bytes], path: Path) -> Iterator[bytes]:
    """Decompressed bytes of every zstd frame in F; a frame cut short is an error, not the end."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    pending = False  # a frame has started and not ended
    while True:
        data = f.read(1 << 20)
        if not data:
            break
        while data:
            out = dobj.decompress(data)
            pending = True
            if out:
                yield out
            if not dobj.eof:
                break
            data, pending = dobj.unused_data, False
            dobj = dctx.decompressobj()
    if pending:
        raise InputError(f"{path}: truncated .zst file (the last zstd frame is cut short); the file is damaged "
                         "or still being written: get a complete copy")


def byte_blocks(path: Path, stats: ReadStats | None = None) -> Iterator[bytes]:
    """The bytes of PATH, decompressed from .gz/.zst, without a leading UTF-8 byte-order mark, in blocks of
    about BLOCK_BYTES; a damaged or truncated compressed file is an InputError naming the file, never a
    shorter trace. STATS.num_bytes_read follows the bytes of the file consumed (reported after each block)."""
    check_trace_path(path)
    kind = path.suffix if path.suffix in (".gz", ".zst") else None
    try:
        with path.open("rb") as raw:
            if kind == ".gz":
                gz = gzip.GzipFile(fileobj=raw, mode="rb")
                blocks: Iterator[bytes] = iter(lambda: gz.read(BLOCK_BYTES), b"")
            elif kind == ".zst":
                blocks = _zstd_blocks(raw, path)
            else:
                blocks = iter(lambda: raw.read(BLOCK_BYTES), b"")
            first = True
            for block in blocks:
                if stats is not None:
                    stats.advanced(raw.tell())
                if first:
                    first = False
                    if block.startswith(UTF8_BOM):  # some editors write one; it is no part of the first record
                        block = block[len(UTF8_BOM):]
                yield block
            if stats is not None:
                stats.num_bytes_read = raw.tell()
    except InputError:
        raise
    except (EOFError, OSError, ValueError, zlib.error) as e:
        if kind is None:
            raise InputError(f"{path}: cannot read ({e}); check the file") from None
        what = "truncated" if isinstance(e, EOFError) else "damaged or not really"
        raise InputError(f"{path}: {what} {kind} file ({brief(str(e))}); get a complete "
                         f"copy, or rename it if it is not {kind}-compressed") from None
    except Exception as e:
        if type(e).__name__ != "ZstdError":
            raise
        raise InputError(f"{path}: damaged or not really .zst file ({e}); get a complete copy, or rename "
                         "it if it is not zstd-compressed") from None


MAX_LINE_BYTES = 64 << 20  # one record: 64 MiB is ~3 million hash ids, far above any real request


def line_segments(path: Path, stats: ReadStats | None = None) -> Iterator[bytes]:
    """The bytes of PATH (as byte_blocks) cut after a newline: whole lines only, the last one perhaps
    without its newline. A line longer than a block is joined once, from its pieces."""
    pending: list[bytes] = []  # the start of a line not yet ended
    num_pending = 0
    for block in byte_blocks(path, stats):
        cut = block.rfind(b"\n") + 1
        if not cut:
            pending.append(block)
            num_pending += len(block)
            if num_pending > MAX_LINE_BYTES:  # e.g. a file of zeros: memory would grow without bound
                raise InputError(f"{path}: a line longer than {MAX_LINE_BYTES >> 20} MiB (no newline in it); a trace "
                                 "has one JSON record a line: is this a trace file?")
            continue
        num_pending = 0
        yield b"".join((*pending, block[:cut])) if pending else block[:cut]
        pending = [block[cut:]] if cut < len(block) else []
    if pending:
        yield b"".join(pending)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of PATH, decompressed and checked as in byte_blocks."""
    line_no = 0
    for segment in line_segments(path):
        lines = segment.split(b"\n")
        last = lines.pop()  # empty when the segment ends with a newline
        for line in lines:
            line_no += 1
            yield line_no, line + b"\n"
        if last:
            yield line_no + 1, last
