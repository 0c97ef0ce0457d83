-- reuse_events: one row per block access (a block reference of a request) with the time of that
-- block's NEXT access. Source: paper section 3 "Reuse time" (Fig 12-15) and "Lifespan" (Fig 19-20);
-- `kvtrace fit` (issue 4) fits F_w(d) = p_w (1 - exp(-lambda_w d)) on the same definition
-- (tongyi_trace/fit/events.py computes it with numpy for speed; tests/fit check both agree).
--
-- A block is its prefix-chained identity `chain_idx` (equal iff the whole prefix up to it is equal), so
-- a request never holds the same chain_idx twice. The next access of a row is the next request in
-- arrival order (req_idx) holding the same chain_idx; next_access_s / next_req_idx are NULL when the
-- block is never accessed again in the trace. Reuse time d = next_access_s - access_s (>= 0).
-- category / type / turn are those of the ACCESSING request (w in the paper).
--
-- Views: requests, blocks (the run folder's Parquet files). No parameters: windowing (and
-- right-censoring at a window's end) is up to the caller. Rows come unordered (add ORDER BY req_idx,
-- pos when needed): one global sort by (chain_idx, req_idx) is much faster than a partitioned window.
-- Output columns: req_idx, pos, chain_idx, access_s, category, type, turn, next_access_s, next_req_idx
WITH nxt AS (
    SELECT req_idx, pos, chain_idx,
           CASE WHEN lead(chain_idx) OVER w = chain_idx THEN lead(req_idx) OVER w END AS next_req_idx
    FROM blocks
    WINDOW w AS (ORDER BY chain_idx, req_idx)
)
SELECT
    n.req_idx,
    n.pos,
    n.chain_idx,
    r.arrival_s AS access_s,
    r.category,
    r.type,
    r.turn,
    r2.arrival_s AS next_access_s,
    n.next_req_idx
FROM nxt AS n
JOIN requests AS r ON r.req_idx = n.req_idx
LEFT JOIN requests AS r2 ON r2.req_idx = n.next_req_idx
