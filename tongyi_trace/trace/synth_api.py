"""The `to-b` profile (Trace B: API calls from programs), docs/synth.md.

Programs (API keys, each its own user) have a very skewed request rate: lognormal weights drawn one
per quantile slice (the population is the same at every seed; only who is who changes) with the
z-score capped, so that most keys send nothing in two hours and a few dozen send most requests;
each sends its expected number of requests, rounded up or down (systematic sampling, not Poisson).
A program calls the model with a few prompt templates (its tasks: a bigger application has more;
Zipf popularity; lengths one per quantile slice within the program): every request is one
template's fixed system prompt, then a new input of the template's typical length; all are
single-turn. Part of each program's traffic is batch jobs (one
template over many inputs within minutes), the rest a steady stream over the whole trace: the jobs
put the prompt reuse within seconds, the steady streams of rarely used templates after 10+ s.
Reuse of the new input comes from sending a request again: n-sampling as separate calls (the same
input a fraction of a second later) and client retries after a timeout (about a minute later).
One request in ~2,000 gets a follow-up turn (<0.1% multi-turn, Fig 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from tongyi_trace.trace.synth_chat import (
    Lognormal,
    prefix_mask,
    select_requests,
    stratified_normal,
    tokens,
    within_session_cumsum,
)
from tongyi_trace.trace.synth_core import BLOCK_SIZE_TOKENS, F64, I64, MAIN, REGENERATE, SessionRequests, group_starts


@dataclass(frozen=True)
class ApiParams:
    """The to-B generative model; see docs/synth.md for each value's source."""

    requests_per_program: float = 18.0  # programs = requests / this (most send nothing in 2 h)
    program_rate_sigma: float = 4.75  # lognormal spread of program request rates (Fig 8: 4% give 90% of hits)
    program_rate_cap_z: float = 3.4  # the busiest programs' rate z-score is capped here
    requests_per_template: float = 400.0  # a program's templates = its expected requests / this (at least 1)
    template_zipf: float = 0.4  # popularity of a program's templates
    system_prompt_tokens: Lognormal = (410, 0.45)  # per template (Fig 4: B ideal hit 54%)
    input_to_prompt_ratio: Lognormal = (0.95, 0.3)  # per template: median new input / prompt
    input_tokens_sigma: float = 0.4  # spread of one template's new inputs
    output_tokens: Lognormal = (150, 0.8)
    batch_share: float = 0.75  # share of requests sent by batch jobs (the rest: steady streams)
    requests_per_job: float = 50.0  # a program's jobs = its expected batch requests / this (at least 1)
    job_s: Lognormal = (120.0, 1.0)  # a batch job's length
    repeat_prob: float = 0.16  # P(a request is sent twice: n-sampling as separate calls)
    repeat_gap_s: Lognormal = (0.3, 1.0)  # time to the second send
    retry_prob: float = 0.016  # P(a request is retried after a client timeout)
    retry_gap_s: Lognormal = (76.0, 0.45)  # time to the retry
    follow_up_prob: float = 0.0005  # Fig 5: <0.1% multi-turn in B
    follow_up_gap_mean_s: float = 5.0


def _lognormal(rng: np.random.Generator, ln: tuple[F64 | float, F64 | float], size: int) -> F64:
    return np.asarray(ln[0] * np.exp(ln[1] * rng.standard_normal(size)), dtype=np.float64)


def _bases(counts: I64) -> I64:
    """First index of each group when groups of COUNTS items are laid out one after another."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _stratified_per_group(rng: np.random.Generator, counts: I64) -> F64:
    """Standard normal draws for groups of COUNTS items laid out one after another: within each group
    one per equal-probability stratum, in random order."""
    owner = np.repeat(np.arange(counts.size), counts)
    order = np.lexsort((rng.random(owner.size), owner))
    slot = np.empty(owner.size, dtype=np.int64)
    slot[order] = np.arange(owner.size) - _bases(counts)[owner[order]]
    return np.asarray(ndtri((slot + rng.random(owner.size)) / counts[owner]), dtype=np.float64)


def _template_cdf(num_tpl: I64, zipf: float) -> F64:
    """Per template (programs' templates laid out in program order): program index + the cumulative
    Zipf popularity of the program's templates up to this one (the last is program index + 1)."""
    base = _bases(num_tpl)
    owner = np.repeat(np.arange(num_tpl.size), num_tpl)
    pop = (np.arange(owner.size) - base[owner] + 1.0) ** -zipf
    cs = np.cumsum(pop)
    within = cs - np.repeat(cs[base] - pop[base], num_tpl)
    cdf = owner + within / np.bincount(owner, weights=pop)[owner]
    cdf[base + num_tpl - 1] = np.arange(num_tpl.size) + 1.0  # exact ends: no round-off past them
    return np.asarray(cdf, dtype=np.float64)


def _pick_template(rng: np.random.Generator, tpl_cdf: F64, program: I64) -> I64:
    """A template of each PROGRAM, by its popularity."""
    pick = np.searchsorted(tpl_cdf, program + rng.random(program.size), side="right")
    return np.minimum(pick, tpl_cdf.size - 1).astype(np.int64)


def draw_api(rng: np.random.Generator, num_requests: int, duration_s: float,
             p: ApiParams | None = None) -> SessionRequests:
    """Requests of the to-B profile: exactly NUM_REQUESTS inside DURATION_S."""
    p = p or ApiParams()
    duration_ms = round(duration_s * 1000)
    num_programs = max(1, round(num_requests / p.requests_per_program))
    z = np.minimum(stratified_normal(rng, num_programs), p.program_rate_cap_z)
    w = np.exp(p.program_rate_sigma * (z - z.max()))
    weights = w / w.sum()
    expected = weights * num_requests
    num_tpl = np.maximum(1, np.rint(expected / p.requests_per_template)).astype(np.int64)
    tpl_cdf = _template_cdf(num_tpl, p.template_zipf)
    sp, ir = p.system_prompt_tokens, p.input_to_prompt_ratio
    sys_tokens = tokens(sp[0] * np.exp(sp[1] * _stratified_per_group(rng, num_tpl)), lo=BLOCK_SIZE_TOKENS)
    in_median = np.asarray(sys_tokens * ir[0] * np.exp(ir[1] * _stratified_per_group(rng, num_tpl)), dtype=np.float64)
    num_jobs = np.maximum(1, np.rint(expected * p.batch_share / p.requests_per_job)).astype(np.int64)
    job_prog = np.repeat(np.arange(num_programs), num_jobs)
    job_tpl = _pick_template(rng, tpl_cdf, job_prog)
    job_ms = np.clip(_lognormal(rng, (p.job_s[0] * 1000, p.job_s[1]), job_prog.size), 1000, duration_ms)
    job_start = rng.random(job_prog.size) * (duration_ms - job_ms)

    n_roots = num_requests + 16 + num_requests // 50  # spare: repeats and follow-ups past the end drop
    # each program sends its expected share of the requests, rounded up or down (systematic sampling)
    slots = np.searchsorted(np.cumsum(weights) * n_roots, np.arange(n_roots) + rng.random(), side="right")
    prog = rng.permutation(np.minimum(slots, num_programs - 1)).astype(np.int64)
    # a steady request: any of the program's templates at any time; a batch one: in one of its jobs
    tpl = _pick_template(rng, tpl_cdf, prog)
    t0 = rng.integers(0, duration_ms, size=n_roots)
    in_batch = rng.random(n_roots) < p.batch_share
    job = _bases(num_jobs)[prog] + (rng.random(n_roots) * num_jobs[prog]).astype(np.int64)
    tpl = np.where(in_batch, job_tpl[job], tpl)
    t0 = np.where(in_batch, (job_start[job] + rng.random(n_roots) * job_ms[job]).astype(np.int64), t0)
    u = rng.random(n_roots)
    sent_twice = u < p.repeat_prob + p.retry_prob
    retry = u >= p.repeat_prob
    follow = rng.random(n_roots) < p.follow_up_prob
    # rows per root: [first send], kept send, [follow-up]
    rows = 1 + sent_twice + follow
    total = int(rows.sum())
    session = np.repeat(np.arange(n_roots, dtype=np.int64), rows)
    start = group_starts(session)
    k = np.arange(total, dtype=np.int64) - start  # row within the root
    has_rep = sent_twice[session]
    kind = np.where(has_rep & (k == 0), REGENERATE, MAIN).astype(np.int64)
    turn = np.where(k - has_rep >= 1, 2, 1).astype(np.int64)
    r_prog = prog[session]
    r_tpl = tpl[session]
    new_tokens = tokens(_lognormal(rng, (in_median[r_tpl], p.input_tokens_sigma), total))
    regen = np.flatnonzero(kind == REGENERATE)
    new_tokens[regen] = new_tokens[regen + 1]
    out_tokens = tokens(_lognormal(rng, p.output_tokens, total))
    rep_gap = np.where(retry[session], _lognormal(rng, p.retry_gap_s, total),
                       _lognormal(rng, p.repeat_gap_s, total)) * 1000
    fol_gap = rng.exponential(p.follow_up_gap_mean_s * 1000, total)
    gap = np.where(k == 0, 0, np.where(turn == 2, fol_gap, rep_gap))
    arrival_ms = t0[session] + within_session_cumsum(np.rint(gap).astype(np.int64), start)
    sr = SessionRequests(
        session=session, turn=turn, arrival_ms=arrival_ms.astype(np.int64),
        type_code=np.zeros(total, dtype=np.int64), user=r_prog.astype(np.int64),
        sys_id=r_tpl, new_tokens=new_tokens, output_tokens=out_tokens,
        type_names=("api",), sys_tokens_by_id=sys_tokens, redo_kind=kind)
    out = select_requests(sr, prefix_mask(sr.arrival_ms < duration_ms, sr.session), num_requests)
    if out is None:  # cannot happen: every root is inside the window and n_roots > num_requests
        raise RuntimeError("internal: too few to-B requests drawn")
    return out
