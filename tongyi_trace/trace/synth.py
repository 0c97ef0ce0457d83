"""Synthetic Qwen-Bailian traces that behave like the paper's Trace A (to-C) and Trace B (to-B).

Source: "KVCache Cache in the Wild" (Wang et al., USENIX ATC 2025); every parameter below names the
figure it is read from, and docs/synth.md explains the generative model. In short:

- to-C (Trace A): users (heavy-tailed activity: Fig 7-10) own sessions; a session has a request type
  (text/image/file/search, Fig 5), maybe one of a few system prompts shared by everybody (the only
  cross-session, hence cross-user, reuse: Fig 6), a turn count (a 2nd turn with a per-type
  probability, then each further turn with a per-session engagement drawn from a Beta: a mixture of
  geometrics giving turn p50 1, p90 5 and a long tail, Fig 9-11) and per-category exponential gaps
  between turns (Fig 12-15); a turn sends the whole conversation so far plus its new input
  (paper-notes "The traces"); a conversation longer than the model's window is not continued.
- to-B (Trace B): API programs (users), each with a fixed system prompt of its own, send single-turn
  requests at a program-specific rate, the whole trace long or in one batch job; one in ~2,000
  requests gets a quick follow-up turn (<0.1% multi-turn, Fig 5).

The calibration targets (issue 3) are checked through the real ingest and analyses by
tests/trace/test_synth_calibration.py. Everything is vectorized with numpy and deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.trace.synth_core import (
    BLOCK_SIZE_TOKENS,
    F64,
    I64,
    SessionRequests,
    SynthTrace,
    assemble,
    group_starts,
    system_prompt_tokens,
    write_jsonl,
)

PROFILES = ("to-c", "to-b")
DEFAULT_NUM_REQUESTS = 43_000  # Trace A: 43,058 requests (paper-notes "The traces")
DEFAULT_DURATION_S = 7_200.0  # Trace A spans ~2 h


@dataclass(frozen=True)
class TypeParams:
    """Per-request-type parameters of the to-C profile (lengths are lognormal: median, sigma)."""

    session_share: float  # share of sessions of this type (Fig 5, request mix)
    multi_turn_prob: float  # P(a 2nd turn) after turn 1 (Fig 5, Fig 9, Fig 11)
    first_input_tokens: tuple[float, float]  # new input of turn 1
    next_input_tokens: tuple[float, float]  # new input of turns 2+
    output_tokens: tuple[float, float]
    gap_mean_s: tuple[float, float, float]  # mean gap to the next turn after turn 1, 2, 3+ (Fig 12-15)


@dataclass(frozen=True)
class ToCParams:
    """The to-C (chatbot, Trace A) generative model; see docs/synth.md for each value's source."""

    types: dict[str, TypeParams] = field(default_factory=lambda: {
        "text": TypeParams(0.58, 0.37, (240, 1.0), (170, 1.0), (240, 0.8), (90.0, 110.0, 130.0)),
        "image": TypeParams(0.14, 0.14, (800, 0.4), (340, 1.2), (160, 0.8), (60.0, 80.0, 100.0)),
        "file": TypeParams(0.12, 0.35, (2560, 0.9), (170, 1.0), (280, 0.8), (140.0, 160.0, 180.0)),
        "search": TypeParams(0.16, 0.35, (1280, 0.5), (1340, 0.6), (320, 0.6), (70.0, 90.0, 110.0)),
    })
    engagement_beta: tuple[float, float] = (5.3, 3.9)  # P(turn k+1 | turn k >= 2) ~ Beta (Fig 9, 11)
    max_turns: int = 250  # Fig 9: max 232 turns in A
    max_context_tokens: int = 32_768  # the served model's window: a longer chat is a new session
    requests_per_user: float = 12.0  # users = requests / this (Fig 10)
    user_activity_sigma: float = 2.0  # lognormal spread of user activity (Fig 8: top 10% users 8.9x turns)
    num_system_prompts: int = 24  # shared system prompts (Fig 6: the little cross-user reuse there is)
    system_prompt_prob: float = 0.6  # share of sessions that start with a shared system prompt
    system_prompt_tokens: tuple[float, float] = (60, 0.6)
    system_prompt_zipf: float = 1.2  # popularity of the shared prompts (Zipf exponent)


@dataclass(frozen=True)
class ToBParams:
    """The to-B (API, Trace B) generative model; see docs/synth.md for each value's source."""

    requests_per_program: float = 200.0  # programs = requests / this
    program_activity_sigma: float = 2.5  # lognormal spread of program request rates (Fig 7-8: B skew)
    system_prompt_tokens: tuple[float, float] = (800, 0.6)  # per program (Fig 4: B ideal hit 54%)
    input_to_prompt_ratio: tuple[float, float] = (0.75, 0.1)  # per program: median new input / prompt
    input_tokens_sigma: float = 0.4  # spread of one program's new inputs
    output_tokens: tuple[float, float] = (150, 0.8)
    always_on_share: float = 0.5  # programs active the whole trace; the others run one batch job
    batch_minutes: tuple[float, float] = (10.0, 1.0)  # a batch job's length (lognormal median, sigma)
    follow_up_prob: float = 0.0005  # Fig 5: <0.1% multi-turn in B
    follow_up_gap_mean_s: float = 5.0


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

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return dict(self.__dict__)


def _lognormal(rng: np.random.Generator, median: F64 | float, sigma: F64 | float, size: int) -> F64:
    return np.asarray(median * np.exp(sigma * rng.standard_normal(size)), dtype=np.float64)


def activity_weights(rng: np.random.Generator, num: int, sigma: float) -> F64:
    """Lognormal activity weights of NUM users (or programs), normalized to sum 1."""
    w = np.exp(sigma * rng.standard_normal(num))
    return np.asarray(w / w.sum(), dtype=np.float64)


def _tokens(x: F64, lo: int = 1, hi: int = 1 << 20) -> I64:
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


def _within_session_cumsum(values: I64, start: I64) -> I64:
    cs = np.cumsum(values)
    return cs - (cs[start] - values[start])


def select_requests(sr: SessionRequests, keep: np.ndarray, num_requests: int) -> SessionRequests | None:
    """Keep rows KEEP (a prefix of each session) of the first sessions, in order, up to exactly
    NUM_REQUESTS requests (the last session cut short); None when there are too few."""
    kept_sess = sr.session[keep]
    if kept_sess.size < num_requests:
        return None
    # rows of kept requests are session-contiguous and in session order: take the first num_requests
    idx = np.flatnonzero(keep)[:num_requests]
    sess = sr.session[idx]
    _, dense = np.unique(sess, return_inverse=True)
    return SessionRequests(
        session=dense.reshape(-1).astype(np.int64), turn=sr.turn[idx], arrival_ms=sr.arrival_ms[idx],
        type_code=sr.type_code[idx], user=sr.user[idx], sys_id=sr.sys_id[idx],
        new_tokens=sr.new_tokens[idx], output_tokens=sr.output_tokens[idx],
        type_names=sr.type_names, sys_tokens_by_id=sr.sys_tokens_by_id)


def input_tokens_of(sr: SessionRequests) -> I64:
    """Input tokens of each request (system prompt + earlier turns' new input and output + new input)."""
    start = group_starts(sr.session)
    sys_tok = system_prompt_tokens(sr)
    step = sr.new_tokens + sr.output_tokens
    return (_within_session_cumsum(step, start) - step + sys_tok + sr.new_tokens).astype(np.int64)


def _draw_toc_sessions(rng: np.random.Generator, num_sessions: int, num_users: int, duration_ms: int,
                       p: ToCParams, user_weights: F64, sys_tokens: I64) -> SessionRequests:
    names = tuple(p.types)
    tp = [p.types[k] for k in names]
    share = np.array([t.session_share for t in tp])
    s_type = rng.choice(len(names), size=num_sessions, p=share / share.sum())
    s_user = rng.choice(num_users, size=num_sessions, p=user_weights)
    s_t0 = rng.integers(0, duration_ms, size=num_sessions)
    ranks = np.arange(1, p.num_system_prompts + 1, dtype=np.float64) ** -p.system_prompt_zipf
    s_sys = np.where(rng.random(num_sessions) < p.system_prompt_prob,
                     rng.choice(p.num_system_prompts, size=num_sessions, p=ranks / ranks.sum()), -1)
    # turn count: a 2nd turn w.p. multi_turn_prob, then each further turn w.p. a per-session
    # engagement c ~ Beta (a mixture of geometrics: the long tail of Fig 9)
    multi = np.array([t.multi_turn_prob for t in tp])[s_type]
    engage = rng.beta(*p.engagement_beta, size=num_sessions)
    more = rng.geometric(1.0 - np.minimum(engage, 0.999))  # turns after the first, >= 1
    turns = np.where(rng.random(num_sessions) >= multi, 1, 1 + more)
    turns = np.minimum(turns, p.max_turns).astype(np.int64)

    total = int(turns.sum())
    session = np.repeat(np.arange(num_sessions, dtype=np.int64), turns)
    start = group_starts(session)
    turn = np.arange(total, dtype=np.int64) - start + 1
    r_type = s_type[session]
    first = turn == 1
    med_new = np.where(first, np.array([t.first_input_tokens[0] for t in tp])[r_type],
                       np.array([t.next_input_tokens[0] for t in tp])[r_type])
    sig_new = np.where(first, np.array([t.first_input_tokens[1] for t in tp])[r_type],
                       np.array([t.next_input_tokens[1] for t in tp])[r_type])
    new_tokens = _tokens(_lognormal(rng, med_new, sig_new, total))
    out_tokens = _tokens(_lognormal(rng, np.array([t.output_tokens[0] for t in tp])[r_type],
                                    np.array([t.output_tokens[1] for t in tp])[r_type], total))
    # gap before turn k (k >= 2) ~ Exp(mean of the category of turn k-1)
    gap_means = np.array([t.gap_mean_s for t in tp])  # [type, bucket of the previous turn]
    prev_bucket = np.clip(turn - 2, 0, 2)
    gap_ms = np.maximum(1, np.rint(rng.exponential(1.0, total) * gap_means[r_type, prev_bucket] * 1000))
    gap_ms = np.where(first, 0, gap_ms).astype(np.int64)
    arrival_ms = s_t0[session] + _within_session_cumsum(gap_ms, start)
    return SessionRequests(
        session=session, turn=turn, arrival_ms=arrival_ms.astype(np.int64), type_code=r_type.astype(np.int64),
        user=s_user[session].astype(np.int64), sys_id=s_sys[session].astype(np.int64),
        new_tokens=new_tokens, output_tokens=out_tokens, type_names=names, sys_tokens_by_id=sys_tokens)


def _prefix_mask(ok: np.ndarray, session: I64) -> np.ndarray:
    """Rows before the first not-OK row of their session (turns after a dropped turn are dropped too)."""
    bad = (~ok).astype(np.int64)
    start = group_starts(session)
    return np.asarray(_within_session_cumsum(bad, start) == 0)


def draw_to_c(rng: np.random.Generator, num_requests: int, duration_s: float,
              p: ToCParams | None = None) -> SessionRequests:
    """Sessions of the to-C profile, cut to exactly NUM_REQUESTS requests inside DURATION_S."""
    p = p or ToCParams()
    duration_ms = round(duration_s * 1000)
    num_users = max(1, round(num_requests / p.requests_per_user))
    user_weights = activity_weights(rng, num_users, p.user_activity_sigma)
    sys_tokens = _tokens(_lognormal(rng, p.system_prompt_tokens[0], p.system_prompt_tokens[1],
                                    p.num_system_prompts), lo=BLOCK_SIZE_TOKENS)
    num_sessions = max(8, num_requests // 2)
    while True:
        sr = _draw_toc_sessions(rng, num_sessions, num_users, duration_ms, p, user_weights, sys_tokens)
        ok = (sr.arrival_ms < duration_ms) & (input_tokens_of(sr) <= p.max_context_tokens)
        out = select_requests(sr, _prefix_mask(ok, sr.session), num_requests)
        if out is not None:
            return out
        num_sessions *= 2


def draw_to_b(rng: np.random.Generator, num_requests: int, duration_s: float,
              p: ToBParams | None = None) -> SessionRequests:
    """Requests of the to-B profile: exactly NUM_REQUESTS inside DURATION_S."""
    p = p or ToBParams()
    duration_ms = round(duration_s * 1000)
    num_programs = max(1, round(num_requests / p.requests_per_program))
    weights = activity_weights(rng, num_programs, p.program_activity_sigma)
    sys_tokens = _tokens(_lognormal(rng, p.system_prompt_tokens[0], p.system_prompt_tokens[1], num_programs),
                         lo=BLOCK_SIZE_TOKENS)
    in_median = sys_tokens * _lognormal(rng, p.input_to_prompt_ratio[0], p.input_to_prompt_ratio[1],
                                        num_programs)
    always = rng.random(num_programs) < p.always_on_share
    batch_ms = np.minimum(_lognormal(rng, p.batch_minutes[0] * 60_000, p.batch_minutes[1], num_programs),
                          duration_ms)
    win_len = np.where(always, duration_ms, np.maximum(batch_ms, 1000)).astype(np.int64)
    win_start = (rng.random(num_programs) * (duration_ms - win_len + 1)).astype(np.int64)

    n_roots = num_requests + 16 + num_requests // 200  # a few spare: follow-ups past the end drop
    prog = rng.choice(num_programs, size=n_roots, p=weights)
    t0 = win_start[prog] + (rng.random(n_roots) * win_len[prog]).astype(np.int64)
    follow = rng.random(n_roots) < p.follow_up_prob
    turns = np.where(follow, 2, 1).astype(np.int64)
    total = int(turns.sum())
    session = np.repeat(np.arange(n_roots, dtype=np.int64), turns)
    start = group_starts(session)
    turn = np.arange(total, dtype=np.int64) - start + 1
    r_prog = prog[session]
    new_tokens = _tokens(_lognormal(rng, in_median[r_prog], p.input_tokens_sigma, total))
    out_tokens = _tokens(_lognormal(rng, p.output_tokens[0], p.output_tokens[1], total))
    gap_ms = np.maximum(1, np.rint(rng.exponential(p.follow_up_gap_mean_s * 1000, total))).astype(np.int64)
    arrival_ms = t0[session] + np.where(turn == 1, 0, gap_ms)
    sr = SessionRequests(
        session=session, turn=turn, arrival_ms=arrival_ms.astype(np.int64),
        type_code=np.zeros(total, dtype=np.int64), user=r_prog.astype(np.int64),
        sys_id=r_prog.astype(np.int64), new_tokens=new_tokens, output_tokens=out_tokens,
        type_names=("api",), sys_tokens_by_id=sys_tokens)
    keep = _prefix_mask(sr.arrival_ms < duration_ms, sr.session)
    out = select_requests(sr, keep, num_requests)
    if out is None:  # cannot happen: every root is inside the window
        raise UsageError("internal: too few to-B requests drawn")
    return out


def generate(profile: str, seed: int, num_requests: int | None = None, duration_s: float | None = None,
             scale: float = 1.0) -> SynthTrace:
    """Draw a synthetic trace of PROFILE ('to-c' or 'to-b'); deterministic for SEED.

    NUM_REQUESTS defaults to 43,000 x SCALE, DURATION_S to 7,200 s (the population of users or programs
    grows with the number of requests, so SCALE keeps every per-user behaviour)."""
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}; use one of: {', '.join(PROFILES)}")
    if scale <= 0:
        raise UsageError(f"--scale must be > 0, got {scale}")
    n = round((num_requests if num_requests is not None else DEFAULT_NUM_REQUESTS) * scale)
    d = duration_s if duration_s is not None else DEFAULT_DURATION_S
    if n < 1:
        raise UsageError(f"the trace would have {n} requests; use --requests >= 1")
    if not d > 0:
        raise UsageError(f"--duration must be > 0 seconds, got {d}")
    rng = np.random.default_rng(seed)
    sr = draw_to_c(rng, n, d) if profile == "to-c" else draw_to_b(rng, n, d)
    return assemble(sr)


def summarize(trace: SynthTrace, path: Path, profile: str, seed: int) -> SynthSummary:
    """Headline counts of a generated trace."""
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
    )


def synth_to_file(profile: str, seed: int, out: str | Path, num_requests: int | None = None,
                  duration_s: float | None = None, scale: float = 1.0) -> SynthSummary:
    """Generate a PROFILE trace and write it to OUT as Bailian JSONL (.gz/.zst compressed by suffix)."""
    trace = generate(profile, seed, num_requests, duration_s, scale)
    path = Path(out)
    write_jsonl(trace, path)
    return summarize(trace, path, profile, seed)
