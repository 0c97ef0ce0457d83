"""`fit --capacity` departs from LRU only on a significant gain (paired block bootstrap, fit/tune.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.fit.tune import Candidate, CapacityTuning, WindowBootstrap
from tongyi_trace.policy.file import choice_table, load_policy
from tongyi_trace.sim.bootstrap import make_resampler
from tongyi_trace.sim.capacity import Capacity
from tongyi_trace.sim.recommend import choice_answer

Request = tuple[float, str | None, int | None, list[int]]


def uniform_requests(seed: int, n: int = 4000, num_prefixes: int = 200) -> list[Request]:
    """Every request one of NUM_PREFIXES 4-block prefixes, uniformly at random (independent reference
    model): every online policy has the same expected hit ratio, any difference between two is noise."""
    rng = np.random.default_rng(seed)
    return [(float(i), None, None, [h * 4 + k for k in range(4)])
            for i, h in enumerate(rng.integers(0, num_prefixes, n))]


def scan_requests(seed: int, n: int = 4000, hot: int = 40) -> list[Request]:
    """Half the requests one of a few hot 4-block prefixes (mostly 40 of them), half one-time 6-block scans:
    LRU lets the scans flush the hot set, S3-FIFO's small queue filters them out."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    fresh = 10_000
    for i in range(n):
        if rng.random() < 0.5:
            h = int(rng.integers(hot)) if rng.random() < 0.9 else int(rng.integers(hot, 4 * hot))
            out.append((float(i), None, None, [h * 4 + k for k in range(4)]))
        else:
            out.append((float(i), None, None, list(range(fresh, fresh + 6))))
            fresh += 6
    return out


def test_a_baseline_ahead_of_lru_by_noise_only_leaves_lru(make_run: Callable[..., Path], tmp_path: Path) -> None:
    out = fit_policy(make_run(uniform_requests(0)), tmp_path / "p.json", capacities="400", min_samples=1, jobs=1)
    ch = out.policy.choices[0]
    best = ch.train["best_candidate_gain_vs_lru_pp"]
    # S3-FIFO is ahead on the held-out half (+1.86 points): the old rule (any margin) would have run it
    assert ch.train["best_candidate"] == "s3fifo" and best["point"] > 1.0
    assert best["lo"] <= 0 < best["hi"]  # but its 95% interval holds 0
    assert ch.policy == "lru" and not ch.train["significant"] and ch.train["num_significant"] == 0
    assert ch.train["reason"] == f"best candidate s3fifo {best['point']:+.2f} +- {(best['hi'] - best['lo']) / 2:.2f} " \
                                 "points: not significant at 95%"
    assert ch.train["resampled"] == "time slices" and ch.train["num_groups"] == 50  # no sessions in this trace
    assert choice_answer(ch).startswith("At 400 (400 blocks) run LRU (the fitted choice): no policy is "
                                        "significantly better here at 95% (best: s3fifo +1.86 +- ")
    columns, rows = choice_table(load_policy(tmp_path / "p.json").choices)  # the policy file keeps it
    assert rows[0][columns.index("why")] == ch.train["reason"]
    assert rows[0][columns.index("vs LRU")] == "+0.00 +- 0.00"


def test_a_baseline_that_wins_clearly_is_chosen(make_run: Callable[..., Path], tmp_path: Path) -> None:
    out = fit_policy(make_run(scan_requests(1)), tmp_path / "p.json", capacities="120", test="0:", min_samples=1,
                     jobs=1)
    ch = out.policy.choices[0]
    gain = ch.train["gain_vs_lru_pp"]
    assert ch.policy == "s3fifo" and ch.train["significant"]
    assert gain["lo"] > 8.0 and gain["point"] == pytest.approx(100 * ch.train["gain_vs_lru"])
    assert ch.train["reason"].endswith(f"points over LRU, significant at 95% (lower bound {gain['lo']:+.2f})")
    assert ch.test["gain_vs_lru_pp"]["lo"] > 8.0  # the whole trace as the test window: an interval there too
    assert choice_answer(ch) == f"At 120 (120 blocks) run the fitted choice (s3fifo): {gain['point']:+.2f} +- " \
                                f"{(gain['hi'] - gain['lo']) / 2:.2f} points over LRU (significant at 95%)."


def _rows(hits: dict[str, np.ndarray]) -> list[dict]:
    refs = 10 * len(next(iter(hits.values())))
    return [{"candidate": name, "hit_ratio": float(h.sum()) / refs, "num_hits": int(h.sum()), "num_refs": refs,
             "req_hit_blocks": h} for name, h in hits.items()]


def test_the_highest_lower_bound_wins_not_the_highest_point() -> None:
    n = 400
    base = np.random.default_rng(3).integers(2, 7, n)
    steady = base + (np.arange(n) % 10 == 0)  # +1 hit on every tenth request: +1.0 point, little spread
    wild = base + np.where(np.random.default_rng(2).random(n) < 0.55, 2, -2)  # +2.3 points, but noisy
    names = ["lru", "fifo", "s3fifo"]
    t = CapacityTuning(Capacity("10", 10), 1.0, [Candidate(p, {}) for p in names],
                       _rows({"lru": base, "fifo": wild, "s3fifo": steady}))
    boot = WindowBootstrap(make_resampler(np.arange(n) // 4), np.full(n, 10), "sessions")
    t.choose(boot)
    fifo, s3 = (boot.gain(r, t.train_rows[0]) for r in t.train_rows[1:])
    assert fifo.point > s3.point and fifo.significant and s3.significant and s3.lo > fifo.lo
    assert t.chosen == Candidate("s3fifo", {}) and t.train["num_significant"] == 2
    assert t.train["best_candidate"] == "fifo"


def test_a_bad_confidence_is_refused(make_run: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--confidence 1\.0: give a confidence level strictly between 0 and 1"):
        fit_policy(make_run(uniform_requests(0, n=50)), tmp_path / "p.json", capacities="40", confidence=1.0)


def test_a_policy_file_without_intervals_still_reads() -> None:
    """Files written before the intervals (same schema kvtrace.policy/2, fewer keys in `train`): the point gain."""
    from tongyi_trace.policy.file import PolicyChoice

    old = PolicyChoice(capacity="1L", capacity_blocks=100, policy="s3fifo", params={},
                       train={"hit_ratio": 0.5, "lru_hit_ratio": 0.45, "gain_vs_lru": 0.05, "best_baseline": "s3fifo",
                              "gain_vs_best_baseline": 0.0})
    columns, rows = choice_table([old])
    assert rows[0][columns.index("vs LRU")] == "+5.00" and rows[0][columns.index("why")] == "-"
    assert choice_answer(old) == ("At 1L (100 blocks) run the fitted choice (s3fifo): +5.00 points over LRU "
                                  "(no interval in this file).")
