"""The conversational generator behind the `to-c`, `thinking` and `coder` profiles (docs/synth.md).

Mechanisms, each as it exists in real chat traffic (paper-notes: "KVCache Cache in the Wild"):

- users with a skewed activity (lognormal weight, capped: how many conversations they open) and a
  skewed engagement (lognormal mean length of their conversations past the 2nd turn, capped,
  correlated with activity: heavy users also hold the longer chats) and pace (a lognormal factor on
  their think times); optionally drawn one per quantile stratum, so the population's shape is the
  same at every seed; the most active users are the heavy users;
- a conversation has a type (the product: text/image/file/search, or one workload type) and, with a
  per-type probability, one of the type's shared system prompts at its head (Zipf popularity);
- a 2nd turn with a per-type probability, then further turns with the user's continuation
  probability: a mixture of geometrics; some of the heavy users' conversations are kept open in the
  background (every think time is a slow return), and a few are long chats of short messages answered quickly
  (companion / role-play chat: the tail of the turn count);
- the gap before a turn is the previous answer's generation time (output / decode speed) plus the
  user's think time: a lognormal body (reading and typing) or, with a small probability, a slow
  lognormal tail (the user comes back tens of minutes later);
- short-term reuse: a turn is sometimes sent twice: first a try the user discards (regenerate: the
  same input again; edit-and-resend: the same history with another new input), then the kept one;
- a turn's input is the conversation so far (system prompt, every kept turn's new input and kept
  output: all of it, or a reasoning model's answer without its reasoning) plus its new input; a
  conversation that outgrows the model window is not continued.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from tongyi_trace.trace.synth_core import (
    BLOCK_SIZE_TOKENS,
    EDIT,
    F64,
    I64,
    MAIN,
    REGENERATE,
    SessionRequests,
    group_starts,
    input_tokens_of,
)

Lognormal = tuple[float, float]  # (median, sigma)


@dataclass(frozen=True)
class ChatType:
    """One request type (product) of a conversational profile; lengths in tokens, lognormal."""

    session_share: float  # share of conversations of this type
    second_turn_prob: float  # P(a 2nd turn)
    first_input: Lognormal  # new input of turn 1
    next_input: Lognormal  # new input of turns 2+
    output: Lognormal  # whole output (with reasoning for a reasoning model)
    prompt_prob: float  # share of conversations that open with one of the type's shared prompts
    num_prompts: int  # shared system prompts of this type (product variants, templates, repos)
    prompt_tokens: Lognormal
    kept_output_share: float = 1.0  # share of the output carried into the next turn's context


@dataclass(frozen=True)
class LongChat:
    """Long conversations of short turns (companion / role-play chat): they give the turn maximum."""

    session_share: float  # share of all conversations
    type_name: str  # the product they run on (a key of ChatParams.types)
    continuation: float  # P(turn k+1 | turn k), from the 1st turn on
    next_input: Lognormal
    output: Lognormal
    think_s: Lognormal  # short messages are answered quickly


@dataclass(frozen=True)
class ChatParams:
    """A conversational profile: types, users, turns, think times, redos (docs/synth.md, per profile)."""

    types: dict[str, ChatType]
    requests_per_user: float  # users = requests / this
    user_activity_sigma: float  # lognormal spread of users' conversation rates
    engagement: Lognormal  # a user's mean number of turns after the 2nd (continuation 1 - 1/(1 + x))
    engagement_activity_corr: float  # correlation of log engagement with log activity
    pace_sigma: float  # lognormal spread of users' think-time factor (median 1)
    think_body_s: Lognormal  # think time before a next turn
    slow_return_prob: float  # P(the user comes back much later)
    slow_return_s: Lognormal
    decode_tokens_per_s: float  # the answer is generated before the user reads it
    regenerate_prob: float  # P(a turn is first sent and discarded, then regenerated)
    edit_prob: float  # P(a turn is first sent and discarded, then edited and resent)
    redo_think_s: Lognormal  # time from the discarded answer to the redo
    prompt_zipf: float  # popularity of a type's shared prompts
    max_turns: int
    max_context_tokens: int  # the model window: a longer conversation is not continued
    activity_cap_z: float = float("inf")  # a person's rate is bounded: activity z-score capped here
    engagement_cap: float = float("inf")  # largest mean number of further turns of a user
    heavy_user_share: float = 0.0  # the most active users: only they keep conversations open in the background
    slow_session_share: float = 0.0  # share of a heavy user's conversations kept open: every think time is slow
    slow_session_turns: float = 1.0  # mean number of further turns of such a conversation (>= 1)
    long_chat: LongChat | None = None
    stratified_users: bool = False  # users' activity and engagement z-scores one per quantile stratum


def _lognormal(rng: np.random.Generator, ln: Lognormal | tuple[F64, F64], size: int) -> F64:
    return np.asarray(ln[0] * np.exp(ln[1] * rng.standard_normal(size)), dtype=np.float64)


def tokens(x: F64, lo: int = 1, hi: int = 1 << 20) -> I64:
    """Round to whole tokens in [LO, HI]."""
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


def within_session_cumsum(values: I64, start: I64) -> I64:
    """Inclusive cumulative sum of VALUES restarting at each session start."""
    cs = np.cumsum(values)
    return np.asarray(cs - (cs[start] - values[start]), dtype=np.int64)


def prefix_mask(ok: np.ndarray, session: I64) -> np.ndarray:
    """Rows before the first not-OK row of their session (turns after a dropped turn are dropped too)."""
    bad = (~ok).astype(np.int64)
    return np.asarray(within_session_cumsum(bad, group_starts(session)) == 0)


def select_requests(sr: SessionRequests, keep: np.ndarray, num_requests: int) -> SessionRequests | None:
    """Keep rows KEEP (a prefix of each session) of the first sessions, in order, up to exactly
    NUM_REQUESTS requests (the last session cut short); None when there are too few."""
    if int(np.count_nonzero(keep)) < num_requests:
        return None
    idx = np.flatnonzero(keep)[:num_requests]
    _, dense = np.unique(sr.session[idx], return_inverse=True)
    return SessionRequests(
        session=dense.reshape(-1).astype(np.int64), turn=sr.turn[idx], arrival_ms=sr.arrival_ms[idx],
        type_code=sr.type_code[idx], user=sr.user[idx], sys_id=sr.sys_id[idx],
        new_tokens=sr.new_tokens[idx], output_tokens=sr.output_tokens[idx],
        type_names=sr.type_names, sys_tokens_by_id=sr.sys_tokens_by_id,
        redo_kind=None if sr.redo_kind is None else sr.redo_kind[idx],
        kept_output_tokens=None if sr.kept_output_tokens is None else sr.kept_output_tokens[idx])


@dataclass(frozen=True)
class Population:
    """Users and shared prompts of one trace."""

    activity: F64  # normalized conversation-rate weights
    continuation: F64  # P(turn k+1 | turn k >= 2)
    pace: F64  # think-time factor
    heavy: np.ndarray  # the most active users (heavy_user_share of them)
    prompt_tokens: I64  # every type's prompts, type after type
    prompt_base: I64  # first prompt id of each type


def stratified_normal(rng: np.random.Generator, size: int) -> F64:
    """SIZE standard normal draws, one from each of SIZE equal-probability strata, in random order."""
    u = (rng.permutation(size) + rng.random(size)) / size
    return np.asarray(ndtri(u), dtype=np.float64)


def draw_population(rng: np.random.Generator, num_users: int, p: ChatParams) -> Population:
    """Users (activity, engagement, pace) and the shared prompts of every type."""
    normal = stratified_normal if p.stratified_users else (lambda g, n: g.standard_normal(n))
    z_act = normal(rng, num_users)
    z_eng = p.engagement_activity_corr * z_act + np.sqrt(1 - p.engagement_activity_corr ** 2) * \
        normal(rng, num_users)
    act = np.exp(p.user_activity_sigma * np.minimum(z_act, p.activity_cap_z))
    more_turns = np.minimum(p.engagement[0] * np.exp(p.engagement[1] * z_eng), p.engagement_cap)
    pace = np.exp(p.pace_sigma * rng.standard_normal(num_users))
    heavy = np.zeros(num_users, dtype=bool)
    if p.heavy_user_share > 0:
        heavy = z_act >= np.quantile(z_act, 1.0 - p.heavy_user_share)
    lens = [tokens(_lognormal(rng, t.prompt_tokens, t.num_prompts), lo=BLOCK_SIZE_TOKENS)
            for t in p.types.values()]
    base = np.concatenate([[0], np.cumsum([x.size for x in lens])[:-1]]).astype(np.int64)
    return Population(act / act.sum(), 1.0 - 1.0 / (1.0 + more_turns), pace, heavy,
                      np.concatenate(lens).astype(np.int64), base)


def _draw_sessions(rng: np.random.Generator, num_sessions: int, duration_ms: int, p: ChatParams,
                   pop: Population, rate_shape: F64 | None) -> SessionRequests:
    tp = list(p.types.values())
    share = np.array([t.session_share for t in tp])
    s_type = rng.choice(len(tp), size=num_sessions, p=share / share.sum())
    lc = p.long_chat
    s_long = np.zeros(num_sessions, dtype=bool)
    if lc is not None:
        s_long = rng.random(num_sessions) < lc.session_share
        s_type[s_long] = list(p.types).index(lc.type_name)
    s_user = rng.choice(pop.activity.size, size=num_sessions, p=pop.activity)
    if rate_shape is None:
        s_t0 = rng.integers(0, duration_ms, size=num_sessions)
    else:  # conversations open at the recorded rate shape (equal bins over the trace)
        bins = rng.choice(rate_shape.size, size=num_sessions, p=rate_shape / rate_shape.sum())
        s_t0 = ((bins + rng.random(num_sessions)) * (duration_ms / rate_shape.size)).astype(np.int64)
    s_slow = np.zeros(num_sessions, dtype=bool)
    if p.slow_session_share > 0:  # heavy users keep some conversations open in the background
        s_slow = pop.heavy[s_user] & ~s_long & (rng.random(num_sessions) < p.slow_session_share)
    s_sys = np.full(num_sessions, -1, dtype=np.int64)
    for k, t in enumerate(tp):
        m = np.flatnonzero((s_type == k) & (rng.random(num_sessions) < t.prompt_prob))
        ranks = np.arange(1, t.num_prompts + 1, dtype=np.float64) ** -p.prompt_zipf
        s_sys[m] = pop.prompt_base[k] + rng.choice(t.num_prompts, size=m.size, p=ranks / ranks.sum())
    second = rng.random(num_sessions) < np.array([t.second_turn_prob for t in tp])[s_type]
    c = np.minimum(pop.continuation[s_user], 0.999)
    turns = np.where(second, 1 + rng.geometric(1.0 - c), 1)
    if p.slow_session_share > 0:
        turns = np.where(s_slow, 1 + rng.geometric(1.0 / p.slow_session_turns, num_sessions), turns)
    if lc is not None:
        turns = np.where(s_long, rng.geometric(1.0 - lc.continuation, num_sessions), turns)
    turns = np.minimum(turns, p.max_turns).astype(np.int64)

    # kept turns, then a discarded try inserted before some of them
    total = int(turns.sum())
    k_sess = np.repeat(np.arange(num_sessions, dtype=np.int64), turns)
    k_turn = np.arange(total, dtype=np.int64) - group_starts(k_sess) + 1
    u = rng.random(total)
    redo = np.where(u < p.regenerate_prob, REGENERATE,
                    np.where(u < p.regenerate_prob + p.edit_prob, EDIT, MAIN)).astype(np.int64)
    copies = 1 + (redo != MAIN)
    row_of = np.repeat(np.arange(total), copies)  # kept turn of each row
    n = row_of.size
    first_copy = np.ones(n, dtype=bool)
    first_copy[1:] = row_of[1:] != row_of[:-1]
    kind = np.where(first_copy & (copies[row_of] == 2), redo[row_of], MAIN).astype(np.int64)
    session, turn = k_sess[row_of], k_turn[row_of]
    r_type = s_type[session]
    is_first = turn == 1

    def per_type(get: str, idx: int) -> F64:
        return np.array([getattr(t, get)[idx] for t in tp])[r_type]

    new_med = np.where(is_first, per_type("first_input", 0), per_type("next_input", 0))
    new_sig = np.where(is_first, per_type("first_input", 1), per_type("next_input", 1))
    out_med, out_sig = per_type("output", 0), per_type("output", 1)
    long_row = s_long[session]
    if lc is not None:
        later = long_row & ~is_first
        new_med, new_sig = np.where(later, lc.next_input[0], new_med), np.where(later, lc.next_input[1], new_sig)
        out_med, out_sig = np.where(long_row, lc.output[0], out_med), np.where(long_row, lc.output[1], out_sig)
    new_tok = tokens(_lognormal(rng, (new_med, new_sig), n))
    # a regenerate sends exactly the input of the kept row after it
    regen = np.flatnonzero(kind == REGENERATE)
    new_tok[regen] = new_tok[regen + 1]
    out_tok = tokens(_lognormal(rng, (out_med, out_sig), n))
    kept_share = np.array([t.kept_output_share for t in tp])[r_type]
    kept_out = np.where(kept_share < 1.0, tokens(out_tok * kept_share), out_tok)

    # gaps: a kept turn k >= 2 arrives after the previous kept answer's generation + think time; a
    # discarded try arrives first and the kept row after its answer + a short redo time
    user = s_user[session]
    pace = pop.pace[user]
    slow = (rng.random(n) < p.slow_return_prob) | s_slow[session]
    think = np.where(slow, _lognormal(rng, p.slow_return_s, n),
                     _lognormal(rng, p.think_body_s, n) * pace)
    if lc is not None:
        think = np.where(long_row, _lognormal(rng, lc.think_s, n), think)
    redo_wait = _lognormal(rng, p.redo_think_s, n)
    gen_s = out_tok / p.decode_tokens_per_s
    prev_gen = np.concatenate([[0.0], gen_s[:-1]])
    after_redo = np.concatenate([[False], kind[:-1] != MAIN])
    gap_s = np.where(after_redo, prev_gen + redo_wait, 0.0)
    # the think gap goes before the first row of each kept turn k >= 2 (the discarded try, if any)
    turn_head = first_copy & (turn > 1)
    prev_kept_gen = _previous_kept(gen_s, kind, session)
    gap_s = np.where(turn_head, prev_kept_gen + think, gap_s)
    gap_ms = np.where(gap_s > 0, np.maximum(1, np.rint(gap_s * 1000)), 0).astype(np.int64)
    start = group_starts(session)
    arrival = s_t0[session] + within_session_cumsum(gap_ms, start)
    return SessionRequests(
        session=session, turn=turn, arrival_ms=arrival.astype(np.int64), type_code=r_type.astype(np.int64),
        user=user.astype(np.int64), sys_id=s_sys[session].astype(np.int64), new_tokens=new_tok,
        output_tokens=out_tok, type_names=tuple(p.types), sys_tokens_by_id=pop.prompt_tokens,
        redo_kind=kind, kept_output_tokens=kept_out.astype(np.int64))


def _previous_kept(values: F64, kind: I64, session: I64) -> F64:
    """VALUES of the last kept (MAIN) row before each row in its session (0 at a session's start)."""
    idx = np.arange(values.size)
    last = np.maximum.accumulate(np.where(kind == MAIN, idx, -1))
    prev = np.concatenate([[-1], last[:-1]])
    ok = (prev >= 0) & (session[np.maximum(prev, 0)] == session)
    return np.where(ok, values[np.maximum(prev, 0)], 0.0)


def draw_chat(rng: np.random.Generator, num_requests: int, duration_s: float, p: ChatParams,
              num_users: int | None = None, rate_shape: F64 | None = None) -> SessionRequests:
    """Conversations of profile P, cut to exactly NUM_REQUESTS requests inside DURATION_S (NUM_USERS
    users, default requests / requests_per_user; conversations open uniformly or at RATE_SHAPE)."""
    duration_ms = round(duration_s * 1000)
    users = num_users if num_users is not None else max(1, round(num_requests / p.requests_per_user))
    pop = draw_population(rng, users, p)
    num_sessions = max(8, num_requests // 2)
    while True:
        sr = _draw_sessions(rng, num_sessions, duration_ms, p, pop, rate_shape)
        ok = (sr.arrival_ms < duration_ms) & (input_tokens_of(sr) <= p.max_context_tokens)
        out = select_requests(sr, prefix_mask(ok, sr.session), num_requests)
        if out is not None:
            return out
        num_sessions *= 2
