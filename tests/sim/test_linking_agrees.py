"""Next-access linking exists twice for speed: the fit's numpy sort (tongyi_trace.fit.events, the
reference, itself held to queries/reuse_events.sql by tests/fit/test_events.py) and the simulator's
per-reference pass (tongyi_trace.sim.stream.next_request_of_refs, used by the oracle and the peak live
set). Both must link every block access to the same next request."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from tongyi_trace.fit.events import load_accesses
from tongyi_trace.run import open_run
from tongyi_trace.sim.stream import load_stream, next_request_of_refs


def _pairs_sim(run_path: Path) -> Counter[tuple[int, int]]:
    s = load_stream(open_run(run_path).tables())
    nxt = next_request_of_refs(s.req_off, s.blk, s.num_ids)
    req = np.repeat(s.req_idx, np.diff(s.req_off))
    nxt_idx = np.where(nxt < s.num_requests, s.req_idx[np.minimum(nxt, s.num_requests - 1)], -1)
    return Counter(zip(req.tolist(), nxt_idx.tolist(), strict=True))


def _pairs_fit(run_path: Path) -> Counter[tuple[int, int]]:
    acc = load_accesses(open_run(run_path).tables())
    return Counter({(int(r), int(n)): int(c) for r, n, c in zip(acc.pair_req, acc.pair_next, acc.pair_count,
                                                                  strict=True)})


def test_simulator_and_fit_link_the_same_next_requests(tiny_bailian_path: Path, tmp_path: Path) -> None:
    from tongyi_trace.trace.ingest import ingest_trace
    from tongyi_trace.trace.synth import synth_to_file

    synth_to_file("to-c", 5, tmp_path / "t.jsonl", num_requests=300, duration_s=600.0)
    for trace, out in ((tiny_bailian_path, tmp_path / "tiny"), (tmp_path / "t.jsonl", tmp_path / "toc")):
        ingest_trace(trace, out)
        sim, fit = _pairs_sim(out), _pairs_fit(out)
        assert sim == fit
        assert sum(c for (_, n), c in sim.items() if n >= 0) > 0  # some block is reused: the check has teeth
