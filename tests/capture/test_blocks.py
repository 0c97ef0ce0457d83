"""Keyed chained block hashes and their dense ids (tongyi_trace/capture/blocks.py)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import numpy as np
import pytest

from tongyi_trace.capture.blocks import DenseBlockIds, chained_block_hashes, load_salt
from tongyi_trace.errors import InputError

SALT = bytes(range(32))


def test_hashes_follow_the_definition_of_the_module_doc() -> None:
    toks = [5, 6, 7, 8, 9, 10]
    h0 = hashlib.blake2b(bytes(16) + np.array([5, 6, 7, 8], "<i8").tobytes(), key=SALT, digest_size=16).digest()
    h1 = hashlib.blake2b(h0 + np.array([9, 10], "<i8").tobytes(), key=SALT, digest_size=16).digest()
    assert chained_block_hashes(toks, 4, SALT) == [h0, h1]  # the last partial block is hashed too
    assert chained_block_hashes([], 4, SALT) == []


def test_equal_hash_iff_equal_prefix() -> None:
    a = chained_block_hashes(list(range(12)), 4, SALT)
    b = chained_block_hashes([*range(8), 99, 9, 10, 11], 4, SALT)
    assert a[:2] == b[:2] and a[2] != b[2]
    # the same block content after a different prefix is another block (prefix-chained identity)
    c = chained_block_hashes([*range(4, 8), *range(4)], 4, SALT)
    d = chained_block_hashes([*range(4), *range(4, 8)], 4, SALT)
    assert c[1] != d[0] and c[0] != d[1]
    # a partial block differs from the full block it starts
    assert chained_block_hashes(list(range(3)), 4, SALT)[0] != a[0]


def test_the_key_changes_every_hash() -> None:
    other = bytes(32)
    a, b = chained_block_hashes(list(range(40)), 16, SALT), chained_block_hashes(list(range(40)), 16, other)
    assert not set(a) & set(b)


def test_dense_ids_in_order_of_first_appearance() -> None:
    dense = DenseBlockIds()
    h = chained_block_hashes(list(range(12)), 4, SALT)
    g = chained_block_hashes([*range(8), 99, 9, 10, 11], 4, SALT)
    assert dense.ids(h) == [0, 1, 2]
    assert dense.ids(g) == [0, 1, 3]
    assert dense.ids(h + g[2:]) == [0, 1, 2, 3] and len(dense) == 4


def test_shared_ids_are_the_same_in_two_captures_and_63_bit() -> None:
    h = chained_block_hashes(list(range(50)), 16, SALT)
    one, two = DenseBlockIds(shared=True), DenseBlockIds(shared=True)
    ids = one.ids(h)
    assert two.ids(list(reversed(h))) == list(reversed(ids))
    assert all(0 <= i < 2**63 for i in ids) and len(set(ids)) == 4
    assert ids[0] == int.from_bytes(h[0][:8], "little") & (2**63 - 1)


def test_salt_file_is_created_private_then_reused(tmp_path: Path) -> None:
    path = tmp_path / "capture.salt"
    salt = load_salt(path)
    assert len(salt) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == salt.hex()
    assert load_salt(path) == salt
    assert load_salt(None) != load_salt(None)  # a fresh key per capture without a file


def test_a_file_that_is_not_a_salt_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    with pytest.raises(InputError, match=r"notes.txt: not a kvtrace salt file \(64 hex digits"):
        load_salt(bad)
