"""Synthetic Qwen-Bailian traces that behave like the published traces: the paper's Trace A (`to-c`,
chatbot) and Trace B (`to-b`, API), and the public release's `thinking` and `coder` workloads.

Source: "KVCache Cache in the Wild" (Wang et al., USENIX ATC 2025) and the public
qwen-bailian-usagetraces-anon sizes (paper-notes "The traces"). The generators are
synth_chat.py (conversations: to-c, thinking, coder) and synth_api.py (to-b); docs/synth.md gives each
profile's model, every parameter and the figure or assumption it comes from, and calibration/profiles.py
measures the calibrated figures through the real ingest, analyses and simulator
(`kvtrace synth --profile P --check`). Everything is vectorized with numpy and deterministic for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.run import check_not_run_table
from tongyi_trace.trace.synth_api import ApiParams, draw_api
from tongyi_trace.trace.synth_chat import ChatParams, ChatType, LongChat, draw_chat
from tongyi_trace.trace.synth_core import BLOCK_SIZE_TOKENS, SessionRequests, SynthTrace, assemble, write_jsonl

MAX_REQUESTS = 20_000_000  # ~3 GB of JSONL at to-C sizes: a larger ask is a mistake, not a trace
MAX_DURATION_S = 366 * 86_400.0

TO_C = ChatParams(
    types={
        # share, P(2nd turn), first input, next input, output, P(shared prompt), prompts, prompt length
        "text": ChatType(0.58, 0.39, (300, 1.2), (120, 1.1), (200, 0.8), 0.25, 400, (500, 0.6)),
        "image": ChatType(0.14, 0.20, (800, 0.4), (150, 1.2), (200, 0.8), 0.30, 100, (300, 0.5)),
        "file": ChatType(0.12, 0.55, (3000, 0.9), (150, 1.0), (300, 0.8), 0.40, 100, (700, 0.5)),
        "search": ChatType(0.16, 0.50, (1500, 0.5), (500, 0.6), (350, 0.6), 0.40, 50, (900, 0.4)),
    },
    requests_per_user=12.0, user_activity_sigma=3.1, activity_cap_z=2.6, stratified_users=True,
    engagement=(0.25, 1.0), engagement_cap=2.5, engagement_activity_corr=0.6, pace_sigma=0.4,
    think_body_s=(50.0, 0.8), slow_return_prob=0.035, slow_return_s=(900.0, 0.6), heavy_user_share=0.1,
    slow_session_share=0.08, slow_session_turns=3.0, decode_tokens_per_s=40.0, regenerate_prob=0.02,
    edit_prob=0.01, redo_think_s=(8.0, 0.8), prompt_zipf=0.9, max_turns=250, max_context_tokens=131_072,
    long_chat=LongChat(0.00015, "text", 0.999, (8, 0.6), (25, 0.5), (5.0, 0.5)),
)
THINKING = ChatParams(
    types={"thinking": ChatType(1.0, 0.2, (1700, 1.2), (300, 1.2), (1500, 0.8), 0.2, 6, (300, 0.5),
                                kept_output_share=0.3)},
    requests_per_user=8.0, user_activity_sigma=1.5, engagement=(0.3, 1.4), engagement_activity_corr=0.5,
    pace_sigma=0.5, think_body_s=(60.0, 1.1), slow_return_prob=0.12, slow_return_s=(900.0, 0.8),
    decode_tokens_per_s=40.0, regenerate_prob=0.04, edit_prob=0.03, redo_think_s=(10.0, 0.8),
    prompt_zipf=1.1, max_turns=250, max_context_tokens=131_072,
)
CODER = ChatParams(
    types={"coder": ChatType(1.0, 0.5, (1700, 1.0), (400, 1.2), (300, 0.9), 0.5, 300, (1500, 0.6))},
    requests_per_user=40.0, user_activity_sigma=1.5, activity_cap_z=2.33, engagement=(0.4, 1.2),
    engagement_cap=12.0, engagement_activity_corr=0.5,
    pace_sigma=0.5, think_body_s=(3.0, 1.0), slow_return_prob=0.05, slow_return_s=(600.0, 0.8),
    decode_tokens_per_s=60.0, regenerate_prob=0.02, edit_prob=0.02, redo_think_s=(5.0, 0.8),
    prompt_zipf=1.0, max_turns=250, max_context_tokens=32_768,
)
TO_B = ApiParams()


@dataclass(frozen=True)
class Profile:
    """A named profile: its default size and its generator."""

    name: str
    description: str
    num_requests: int
    duration_s: float
    draw: Callable[[np.random.Generator, int, float], SessionRequests]


PROFILE_TABLE: dict[str, Profile] = {p.name: p for p in (
    Profile("to-c", "trace A, chatbot", 43_000, 7_200.0, lambda rng, n, d: draw_chat(rng, n, d, TO_C)),
    Profile("to-b", "trace B, API", 172_800, 7_200.0, lambda rng, n, d: draw_api(rng, n, d, TO_B)),
    Profile("thinking", "reasoning-model chat", 10_812, 7_200.0,
            lambda rng, n, d: draw_chat(rng, n, d, THINKING)),
    Profile("coder", "agentic coding", 43_011, 7_200.0, lambda rng, n, d: draw_chat(rng, n, d, CODER)),
)}
PROFILES = tuple(PROFILE_TABLE)


@dataclass(frozen=True)
class SynthSummary:
    """What `kvtrace synth` wrote."""

    path: str
    profile: str
    seed: int
    num_requests: int
    num_block_refs: int
    num_distinct_block_ids: int
    num_sessions: int
    num_users: int
    duration_s: float
    multi_turn_share: float  # requests with turn >= 2 (as request_mix counts them)
    type_share: dict[str, float]
    block_size: int  # tokens per hash id written (synth_core.BLOCK_SIZE_TOKENS)
    source_block_size: int | None = None  # --like: the measured trace's (None: a profile, or not recorded)

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return dict(self.__dict__)


def trace_size(seed: int, num_requests: float, duration_s: float, scale: float) -> tuple[int, float]:
    """Validate the size options (one-line UsageErrors) and return (requests, duration_s)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UsageError(f"--seed must be an integer >= 0, got {seed}")
    if not math.isfinite(scale) or scale <= 0:
        raise UsageError(f"--scale must be a finite number > 0, got {scale}")
    if not math.isfinite(duration_s) or not duration_s > 0 or duration_s > MAX_DURATION_S:
        raise UsageError(f"--duration must be a finite number of seconds in (0, {MAX_DURATION_S:,.0f}], "
                         f"got {duration_s}")
    if not math.isfinite(num_requests) or num_requests * scale > MAX_REQUESTS:
        raise UsageError(f"the trace would have {num_requests * scale:,.0f} requests (--requests x --scale); "
                         f"the limit is {MAX_REQUESTS:,}")
    n = round(num_requests * scale)
    if n < 1:
        raise UsageError(f"the trace would have {n} requests; use --requests >= 1")
    return n, float(duration_s)


def generate(profile: str, seed: int, num_requests: int | None = None, duration_s: float | None = None,
             scale: float = 1.0) -> SynthTrace:
    """Draw a synthetic trace of PROFILE (see PROFILES); deterministic for SEED.

    NUM_REQUESTS and DURATION_S default to the profile's published size; SCALE multiplies the
    requests (the population of users or programs grows with them, so per-user behaviour is kept)."""
    prof = PROFILE_TABLE.get(profile)
    if prof is None:
        raise UsageError(f"unknown profile {profile!r}; use one of: {', '.join(PROFILES)}")
    n, d = trace_size(seed, num_requests if num_requests is not None else prof.num_requests,
                      duration_s if duration_s is not None else prof.duration_s, scale)
    return assemble(prof.draw(np.random.default_rng(seed), n, d))


def summarize(trace: SynthTrace, path: Path, profile: str, seed: int,
              source_block_size: int | None = None) -> SynthSummary:
    """Headline counts of a generated trace (SOURCE_BLOCK_SIZE: --like's measured trace's block size)."""
    roots = trace.parent_chat_id < 0
    counts = np.bincount(trace.type_code, minlength=len(trace.type_names))
    span_ms = int(trace.arrival_ms.max() - trace.arrival_ms.min()) if trace.num_requests else 0
    return SynthSummary(
        path=str(path), profile=profile, seed=seed, num_requests=trace.num_requests,
        num_block_refs=trace.num_block_refs, num_distinct_block_ids=int(trace.hash_ids.max()) + 1,
        num_sessions=int(roots.sum()), num_users=int(np.unique(trace.user[trace.user >= 0]).size),
        duration_s=span_ms / 1000.0,
        multi_turn_share=float(np.mean(trace.turn >= 2)) if trace.num_requests else 0.0,
        type_share={name: float(c / trace.num_requests) for name, c in zip(trace.type_names, counts,
                                                                            strict=True) if c},
        block_size=BLOCK_SIZE_TOKENS, source_block_size=source_block_size,
    )


def synth_to_file(profile: str, seed: int, out: str | Path, num_requests: int | None = None,
                  duration_s: float | None = None, scale: float = 1.0) -> SynthSummary:
    """Generate a PROFILE trace and write it to OUT as Bailian JSONL (.gz/.zst compressed by suffix)."""
    path = Path(out)
    check_not_run_table(path, "-o")
    trace = generate(profile, seed, num_requests, duration_s, scale)
    write_jsonl(trace, path)
    return summarize(trace, path, profile, seed)
