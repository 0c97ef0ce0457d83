"""Keyed, prefix-chained block hashes of a captured prompt, and their dense renumbering.

Definition. A prompt's token ids are cut into blocks of `block_size_tokens` (the last one may be partial).
Block k's hash is
    h_k = BLAKE2b-128(key = salt, data = h_{k-1} || token ids of block k as little-endian int64)
with h_{-1} = 16 zero bytes: equal iff the prompts agree on every token up to the end of block k (the
prefix-chained identity vLLM's prefix cache keys on; ingest's chain ids give the same partition). The salt
is 32 random bytes drawn per capture and never written, so an id reveals nothing about the tokens: without
the salt nobody can test a guessed prompt against it. Ids are then renumbered densely 0, 1, 2, ... in order
of first appearance (`DenseBlockIds`), as the public traces are; with a shared salt file (`load_salt`) the
ids are instead the hash's first 63 bits, equal across every capture that uses the same file.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tongyi_trace.errors import InputError, UsageError

SALT_BYTES = 32
_ROOT = bytes(16)
_ID_MASK = (1 << 63) - 1


def load_salt(salt_file: Path | None) -> bytes:
    """The capture's secret key: fresh random bytes when SALT_FILE is None; else the hex key in SALT_FILE,
    which is created (mode 0600, a new random key) when it does not exist yet."""
    if salt_file is None:
        return secrets.token_bytes(SALT_BYTES)
    try:
        fd = os.open(salt_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        text = salt_file.read_text(encoding="ascii", errors="replace").strip()
        try:
            salt = bytes.fromhex(text)
        except ValueError:
            salt = b""
        if len(salt) != SALT_BYTES:
            raise InputError(f"{salt_file}: not a kvtrace salt file ({2 * SALT_BYTES} hex digits expected); "
                             "give the file an earlier capture created, or a path that does not exist yet") from None
        return salt
    except OSError as e:
        raise UsageError(f"--salt-file {salt_file}: cannot create it ({e.strerror}); check the folder") from None
    salt = secrets.token_bytes(SALT_BYTES)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(salt.hex() + "\n")
    return salt


def chained_block_hashes(token_ids: Sequence[int] | np.ndarray, block_size_tokens: int, salt: bytes) -> list[bytes]:
    """The keyed prefix-chained hash (16 bytes) of every block, the last partial one included (module doc)."""
    toks = np.asarray(token_ids, dtype="<i8")
    out: list[bytes] = []
    h = _ROOT
    for start in range(0, toks.shape[0], block_size_tokens):
        h = hashlib.blake2b(h + toks[start:start + block_size_tokens].tobytes(), key=salt, digest_size=16).digest()
        out.append(h)
    return out


class DenseBlockIds:
    """Block hashes -> trace ids: dense integers in order of first appearance (per capture), or, when
    SHARED (a salt file), the hash's first 63 bits (the same in every capture with that salt)."""

    def __init__(self, shared: bool = False) -> None:
        self.shared = shared
        self._ids: dict[bytes, int] = {}

    def __len__(self) -> int:
        """Distinct blocks seen so far."""
        return len(self._ids)

    def ids(self, hashes: Sequence[bytes]) -> list[int]:
        """The trace ids of HASHES (new hashes get the next dense ids)."""
        table = self._ids
        out = []
        for h in hashes:
            v = table.get(h)
            if v is None:
                v = int.from_bytes(h[:8], "little") & _ID_MASK if self.shared else len(table)
                table[h] = v
            out.append(v)
        return out
