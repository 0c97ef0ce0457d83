"""`kvtrace synth --profile P --check`: measure a profile's calibrated figures against their bands.

The trace is generated, written, ingested (`kvtrace ingest`), characterized (`kvtrace analyze`'s
analyses) and replayed through the exact LRU curve of the simulator (tongyi_trace.sim.lru_curve); every
figure is read from those results, nothing is recomputed here. Bands: issue "Synthetic traces that
tell the truth" (to-C: the paper's Trace A figures and third-party figures on the public file; to-B,
thinking, coder: the published figures +-10%, ideal hit +-0.03). docs/synth.md lists them per profile.
The turn band is over conversations (their deepest turn: the paper's turn-count distribution); over
requests it cannot hold together with Fig 11's next-turn probabilities (analysis/request_mix.py).

At a reduced --scale only the scale-free bands are checked (shares, probabilities, quantiles); counts
are checked scaled; the turn maximum and the oracle's live set x HBM need the full size.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tongyi_trace.analysis.runner import run_analyses
from tongyi_trace.models import PRESETS
from tongyi_trace.run import RunDir
from tongyi_trace.sim.capacity import parse_capacities
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.stream import load_stream
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file

ANALYSES = ["hit_ratio", "request_mix", "turn_hits", "skew", "next_turn", "reuse_time",
            "lifespan", "live_set"]
LRU_POINTS = ("1%", "5%", "10%", "25%", "50%")


@dataclass(frozen=True)
class Band:
    """A calibrated figure: its key in the measurements, allowed range, and whether it depends on size."""

    key: str
    label: str
    lo: float
    hi: float
    kind: str = "free"  # free: scale-free; count: scales with --scale; full: checked at full size only


def _pm(key: str, label: str, value: float, rel: float = 0.10, kind: str = "free") -> Band:
    return Band(key, label, value * (1 - rel), value * (1 + rel), kind)


BANDS: dict[str, tuple[Band, ...]] = {
    "to-c": (
        Band("num_requests", "requests", 42_000, 44_000, "count"),
        Band("num_block_refs", "block refs", 6.0e6, 6.6e6, "count"),
        Band("reuse_within_600s", "reuses within 10 min", 0.75, 0.85),
        *(Band(f"lru_{p}", f"LRU hit at {p} of distinct blocks", v - 0.03, v + 0.03)
          for p, v in zip(LRU_POINTS, (0.176, 0.410, 0.500, 0.562, 0.578), strict=True)),
        Band("top10_block_reuse_share", "top-10% blocks' share of reuses", 0.70, 0.84),
        Band("conversation_turns_p50", "turns per conversation p50", 1, 1),
        Band("conversation_turns_p90", "turns per conversation p90", 4, 6),
        Band("turn_max", "turn max", 150, float("inf"), "full"),
        Band("single_turn_next_prob", "next-turn prob after single-turn", 0.4, 0.6),
        Band("multi_turn_next_prob", "next-turn prob within multi-turn", 0.7, 0.9),
        Band("ideal_hit", "ideal hit", 0.57, 0.63),
        Band("lifespan_p90_s", "lifespan P90 (s)", 520, 700),
        Band("top10_turn_ratio", "top-10% users' turns / average", 7.5, 10),
        Band("users_for_90pct_hits", "users giving 90% of hits", 0.14, 0.24),
        Band("live_x_hbm_llama3-70b", "oracle peak live set, Llama3-70B (x HBM)", 3, 5, "full"),
    ),
    "to-b": (
        _pm("num_requests", "requests", 172_800, kind="count"),
        _pm("num_block_refs", "block refs", 9.96e6, kind="count"),
        Band("ideal_hit", "ideal hit", 0.51, 0.57),
        _pm("reuse_within_10s", "reuses within 10 s", 0.80),
        Band("single_turn_hit_share", "hits from single-turn requests", 0.97 * 0.9, 1.0),
        Band("multi_turn_share", "multi-turn requests", 0.0, 0.001),
        _pm("lifespan_p90_s", "lifespan P90 (s)", 0.3),
        _pm("lifespan_p99_s", "lifespan P99 (s)", 97),
        _pm("users_for_90pct_hits", "users giving 90% of hits", 0.04),
        Band("lru_2x_hbm_gap_qwen2-7b", "ideal - LRU at 2x HBM, Qwen2-7B", 0.0, 0.02, "full"),
    ),
    "thinking": (
        _pm("num_requests", "requests", 10_812, kind="count"),
        _pm("num_block_refs", "block refs", 3.22e6, kind="count"),
        Band("ideal_hit", "ideal hit", 0.432, 0.492),
    ),
    "coder": (
        _pm("num_requests", "requests", 43_011, kind="count"),
        _pm("num_block_refs", "block refs", 15.47e6, kind="count"),
        Band("ideal_hit", "ideal hit", 0.634, 0.694),
    ),
}


@dataclass(frozen=True)
class CheckRow:
    """One figure: measured value, band (scaled for counts) and the verdict (None = not checked here)."""

    key: str
    label: str
    value: float | None
    lo: float
    hi: float
    ok: bool | None

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return dict(self.__dict__)


def measure(run: RunDir) -> dict[str, float]:
    """The figures of every band, read from the analyses and the simulator's LRU curve of RUN."""
    report = run_analyses(run, only=ANALYSES, write=False)
    h = {name: res.headline for name, res in report.results.items()}
    prov = run.provenance()
    stream = load_stream(run.tables())
    curve = lru_curve(stream)
    caps = parse_capacities(",".join(LRU_POINTS), num_distinct=stream.num_ids, block_size_tokens=stream.block_size,
                            model=None)
    ideal = h["hit_ratio"]["hit_ratio"]
    qwen = parse_capacities("2x", num_distinct=stream.num_ids, block_size_tokens=stream.block_size,
                            model=PRESETS["qwen2-7b"])[0]
    m: dict[str, Any] = {
        "num_requests": prov["num_requests"],
        "num_block_refs": prov["num_block_refs"],
        "ideal_hit": ideal,
        "reuse_within_600s": h["reuse_time"]["share_within_600s"],
        "reuse_within_10s": h["reuse_time"]["share_within_10s"],
        **{f"lru_{c.label}": curve.hit_ratio(c.num_blocks) for c in caps},
        "lru_2x_hbm_gap_qwen2-7b": ideal - curve.hit_ratio(qwen.num_blocks),
        "top10_block_reuse_share": h["skew"].get("top10_block_reuse_share"),
        "users_for_90pct_hits": h["skew"].get("key_share_for_90pct_hits"),
        "conversation_turns_p50": h["request_mix"].get("conversation_turns_p50"),
        "conversation_turns_p90": h["request_mix"].get("conversation_turns_p90"),
        "turn_max": h["request_mix"].get("turn_max"),
        "multi_turn_share": h["request_mix"].get("multi_turn_share"),
        "top10_turn_ratio": h["request_mix"].get("top10_turn_ratio"),
        "single_turn_next_prob": h["next_turn"].get("single_turn_next_prob"),
        "multi_turn_next_prob": h["next_turn"].get("multi_turn_next_prob"),
        "single_turn_hit_share": h["turn_hits"].get("single_turn_hit_share"),
        "lifespan_p90_s": h["lifespan"].get("p90_s"),
        "lifespan_p99_s": h["lifespan"].get("p99_s"),
        "live_x_hbm_llama3-70b": h["live_set"].get("models", {}).get("llama3-70b", {}).get("peak_x_hbm"),
    }
    return {k: float(v) for k, v in m.items() if v is not None}


def judge(profile: str, figures: dict[str, float], scale: float = 1.0) -> list[CheckRow]:
    """Each band of PROFILE against FIGURES (counts scaled by SCALE; full-size bands only at SCALE 1)."""
    rows = []
    for b in BANDS[profile]:
        f = scale if b.kind == "count" else 1.0
        lo, hi = b.lo * f, b.hi * f
        v = figures.get(b.key)
        checked = v is not None and (b.kind != "full" or scale == 1.0)
        rows.append(CheckRow(b.key, b.label, v, lo, hi, (lo <= v <= hi) if checked and v is not None else None))
    return rows


def check_profile(profile: str, seed: int, scale: float = 1.0, work_dir: Path | None = None
                  ) -> list[CheckRow]:
    """Generate PROFILE at SEED and SCALE, ingest it, measure it and judge every band."""
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        trace = Path(tmp) / f"{profile}.jsonl"
        synth_to_file(profile, seed, trace, scale=scale)
        ingest_trace(trace, Path(tmp) / "run")
        return judge(profile, measure(RunDir(Path(tmp) / "run")), scale)
