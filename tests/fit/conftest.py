"""Run folders with KNOWN per-category reuse parameters, written by hand per docs/architecture.md.

Generator (issue 4, "Accuracy"): conversations start uniformly over the trace (Poisson arrivals); a turn
of category w = `<type>-<turn bucket>` is followed by its conversation's next turn with probability p_w,
after an Exp(lambda_w) delay; the next turn holds every block of the previous one (the prefix) plus
`new_blocks` new ones. So a block accessed by a request of category w is accessed again only by that
conversation's next turn: its reuse time follows F_w(d) = p_w (1 - exp(-lambda_w d)) exactly, and turns
that would come after the trace end are simply absent (right-censoring).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

ReuseSpec = dict[str, tuple[float, float]]  # category -> (p, rate_per_s)

# Six categories; file-1 is the long-delay one (mean reuse 600 s) where censoring matters.
KNOWN_SPEC: ReuseSpec = {
    "text-1": (0.5, 1 / 60),
    "text-2": (0.7, 1 / 120),
    "text-3+": (0.8, 1 / 200),
    "file-1": (0.6, 1 / 600),
    "file-2": (0.4, 1 / 300),
    "file-3+": (0.5, 1 / 100),
}


def bucket(turn: int) -> str:
    """Turn bucket name with buckets [1, 2, 3]: 1, 2, 3+."""
    return "3+" if turn >= 3 else str(turn)


def write_run(path: Path, requests: list[tuple[float, str | None, int | None, list[int]]],
              block_size: int = 16) -> Path:
    """Write a run folder from (arrival_s, type, turn, chain ids) per request (any order)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i][0])
    reqs = [requests[i] for i in order]
    n = len(reqs)
    arrival = [r[0] for r in reqs]
    types = [r[1] for r in reqs]
    turns = [r[2] for r in reqs]
    category = [f"{t}-{bucket(k)}" if t is not None and k is not None else "all"
                for t, k in zip(types, turns, strict=True)]
    nblocks = [len(r[3]) for r in reqs]
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame({
        "req_idx": np.arange(n, dtype=np.int64),
        "chat_id": np.arange(n, dtype=np.int64),
        "parent_chat_id": np.full(n, -1, dtype=np.int64),
        "session_id": np.arange(n, dtype=np.int64),
        "user_id": pl.Series([None] * n, dtype=pl.Utf8),
        "arrival_s": np.array(arrival, dtype=np.float64),
        "input_tokens": np.array(nblocks, dtype=np.int64) * block_size,
        "output_tokens": np.full(n, 10, dtype=np.int64),
        "type": pl.Series(types, dtype=pl.Utf8),
        "turn": pl.Series(turns, dtype=pl.Int64),
        "category": category,
        "num_blocks": np.array(nblocks, dtype=np.int64),
    }).write_parquet(path / "requests.parquet")
    req_idx = np.repeat(np.arange(n, dtype=np.int64), nblocks)
    pos = np.concatenate([np.arange(k, dtype=np.int64) for k in nblocks]) if n else np.empty(0, np.int64)
    chain = np.array([c for r in reqs for c in r[3]], dtype=np.int64)
    _, first = np.unique(chain, return_index=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    uniq = np.unique(chain)
    chain_idx = rank[np.searchsorted(uniq, chain)]
    pl.DataFrame({"req_idx": req_idx, "pos": pos, "block_id": chain, "chain_id": chain,
                  "chain_idx": chain_idx, "num_tokens": np.full(len(chain), block_size, dtype=np.int64),
                  }).write_parquet(path / "blocks.parquet")
    has_types = any(t is not None for t in types)
    (path / "provenance.json").write_text(json.dumps({
        "schema": "kvtrace.run/1", "source": "tests/fit generator", "sha256": "0" * 64, "format": "bailian",
        "block_size": block_size, "num_requests": n, "num_block_refs": len(chain),
        "num_distinct_blocks": len(uniq), "duration_s": max(arrival, default=0.0) - min(arrival, default=0.0),
        "has_types": has_types, "has_turns": has_types, "has_users": False, "has_sessions": True,
        "turn_buckets": [1, 2, 3], "findings": {}, "finding_examples": {}, "created_by": "tests",
    }))
    return path


def generate_requests(spec: ReuseSpec, num_sessions_per_type: int, duration_s: float, seed: int,
                      new_blocks: int = 1, max_turns: int = 40,
                      ) -> list[tuple[float, str | None, int | None, list[int]]]:
    """Requests of conversations following SPEC (see the module docstring)."""
    rng = np.random.default_rng(seed)
    types = sorted({c.rsplit("-", 1)[0] for c in spec})
    out: list[tuple[float, str | None, int | None, list[int]]] = []
    next_id = 0
    for t in types:
        for start in rng.uniform(0.0, duration_s, num_sessions_per_type):
            now, turn, blocks = float(start), 1, []
            while now < duration_s and turn <= max_turns:
                blocks = [*blocks, *range(next_id, next_id + new_blocks)]
                next_id += new_blocks
                out.append((now, t, turn, blocks))
                p, rate = spec[f"{t}-{bucket(turn)}"]
                if rng.random() >= p:
                    break
                now += float(rng.exponential(1.0 / rate))
                turn += 1
    return out


@pytest.fixture(scope="session")
def known_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-hour run with KNOWN_SPEC: 12,000 conversations per type, about 60,000 requests and 190,000
    block accesses (every category has 5,000+ samples even in a 3,000 s window)."""
    reqs = generate_requests(KNOWN_SPEC, num_sessions_per_type=12000, duration_s=7200.0, seed=7)
    return write_run(tmp_path_factory.mktemp("known") / "run", reqs)


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """Write a run folder from a list of (arrival_s, type, turn, chain ids) under tmp_path."""
    def make(requests: list[tuple[float, str | None, int | None, list[int]]], name: str = "run") -> Path:
        return write_run(tmp_path / name, requests)
    return make
