"""The `to-b` profile (Trace B: API calls from programs), docs/synth.md.

Programs (each its own user) with a skewed request rate (lognormal weight) send single-turn requests:
the program's fixed system prompt, then a new input of a program-typical length. Half run the whole
trace, the others one batch job. Reuse comes from two mechanisms of API traffic: the system prompt
(every request of a program starts with it; busy programs reuse it within seconds), and repeated
sends of one request (n-sampling as separate calls and client retries: the same input again a
fraction of a second later, or after a timeout). One request in ~2,000 gets a follow-up turn (<0.1%
multi-turn, Fig 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tongyi_trace.trace.synth_chat import Lognormal, prefix_mask, select_requests, tokens, within_session_cumsum
from tongyi_trace.trace.synth_core import BLOCK_SIZE_TOKENS, F64, MAIN, REGENERATE, SessionRequests, group_starts


@dataclass(frozen=True)
class ApiParams:
    """The to-B generative model; see docs/synth.md for each value's source."""

    requests_per_program: float = 80.0  # programs = requests / this
    program_activity_sigma: float = 3.3  # lognormal spread of program request rates (Fig 7-8)
    system_prompt_tokens: Lognormal = (370, 0.6)  # per program (Fig 4: B ideal hit 54%)
    input_to_prompt_ratio: Lognormal = (1.0, 0.3)  # per program: median new input / prompt
    input_tokens_sigma: float = 0.4  # spread of one program's new inputs
    output_tokens: Lognormal = (150, 0.8)
    always_on_share: float = 0.5  # programs active the whole trace; the others run one batch job
    batch_minutes: Lognormal = (10.0, 1.0)  # a batch job's length
    repeat_prob: float = 0.19  # P(a request is sent again: n-sampling or a retry)
    repeat_gap_s: Lognormal = (0.3, 3.0)  # time to the repeated send
    follow_up_prob: float = 0.0005  # Fig 5: <0.1% multi-turn in B
    follow_up_gap_mean_s: float = 5.0


def _lognormal(rng: np.random.Generator, ln: tuple[F64 | float, F64 | float], size: int) -> F64:
    return np.asarray(ln[0] * np.exp(ln[1] * rng.standard_normal(size)), dtype=np.float64)


def draw_api(rng: np.random.Generator, num_requests: int, duration_s: float,
             p: ApiParams | None = None) -> SessionRequests:
    """Requests of the to-B profile: exactly NUM_REQUESTS inside DURATION_S."""
    p = p or ApiParams()
    duration_ms = round(duration_s * 1000)
    num_programs = max(1, round(num_requests / p.requests_per_program))
    w = np.exp(p.program_activity_sigma * rng.standard_normal(num_programs))
    weights = w / w.sum()
    sys_tokens = tokens(_lognormal(rng, p.system_prompt_tokens, num_programs), lo=BLOCK_SIZE_TOKENS)
    in_median = sys_tokens * _lognormal(rng, p.input_to_prompt_ratio, num_programs)
    always = rng.random(num_programs) < p.always_on_share
    batch_ms = np.minimum(_lognormal(rng, (p.batch_minutes[0] * 60_000, p.batch_minutes[1]), num_programs),
                          duration_ms)
    win_len = np.where(always, duration_ms, np.maximum(batch_ms, 1000)).astype(np.int64)
    win_start = (rng.random(num_programs) * (duration_ms - win_len + 1)).astype(np.int64)

    n_roots = num_requests + 16 + num_requests // 50  # spare: repeats and follow-ups past the end drop
    prog = rng.choice(num_programs, size=n_roots, p=weights)
    t0 = win_start[prog] + (rng.random(n_roots) * win_len[prog]).astype(np.int64)
    repeat = rng.random(n_roots) < p.repeat_prob
    follow = rng.random(n_roots) < p.follow_up_prob
    # rows per root: [repeated send], kept send, [follow-up]
    rows = 1 + repeat + follow
    total = int(rows.sum())
    session = np.repeat(np.arange(n_roots, dtype=np.int64), rows)
    start = group_starts(session)
    k = np.arange(total, dtype=np.int64) - start  # row within the root
    has_rep = repeat[session]
    kind = np.where(has_rep & (k == 0), REGENERATE, MAIN).astype(np.int64)
    turn = np.where(k - has_rep >= 1, 2, 1).astype(np.int64)
    r_prog = prog[session]
    new_tokens = tokens(_lognormal(rng, (in_median[r_prog], p.input_tokens_sigma), total))
    regen = np.flatnonzero(kind == REGENERATE)
    new_tokens[regen] = new_tokens[regen + 1]
    out_tokens = tokens(_lognormal(rng, p.output_tokens, total))
    rep_gap = _lognormal(rng, p.repeat_gap_s, total) * 1000
    fol_gap = rng.exponential(p.follow_up_gap_mean_s * 1000, total)
    gap = np.where(k == 0, 0, np.where(turn == 2, fol_gap, rep_gap))
    arrival_ms = t0[session] + within_session_cumsum(np.rint(gap).astype(np.int64), start)
    sr = SessionRequests(
        session=session, turn=turn, arrival_ms=arrival_ms.astype(np.int64),
        type_code=np.zeros(total, dtype=np.int64), user=r_prog.astype(np.int64),
        sys_id=r_prog.astype(np.int64), new_tokens=new_tokens, output_tokens=out_tokens,
        type_names=("api",), sys_tokens_by_id=sys_tokens, redo_kind=kind)
    out = select_requests(sr, prefix_mask(sr.arrival_ms < duration_ms, sr.session), num_requests)
    if out is None:  # cannot happen: every root is inside the window and n_roots > num_requests
        raise RuntimeError("internal: too few to-B requests drawn")
    return out
