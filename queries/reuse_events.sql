-- reuse_events: one row per block access (a block reference of a request), in arrival order, with the
-- time of that block's NEXT access. Source: paper section 3 "Reuse time" (Fig 12-15) and "Lifespan"
-- (Fig 19-20); the fit (`kvtrace fit`, issue 4) uses it for F_w(d) = p_w (1 - exp(-lambda_w d)).
--
-- A block is its prefix-chained identity `chain_idx` (equal iff the whole prefix up to it is equal), so
-- a request never holds the same chain_idx twice. The next access of a row is the next request, in
-- arrival order (req_idx), holding the same chain_idx: next_access_s / next_req_idx are NULL when the
-- block is never accessed again in the trace. reuse time d = next_access_s - access_s (>= 0).
-- category / type / turn are those of the ACCESSING request (w in the paper).
--
-- Views: requests, blocks (the run folder's Parquet files). No parameters: windowing (and
-- right-censoring at a window's end) is up to the caller.
-- Output columns: req_idx, pos, chain_idx, access_s, category, type, turn, next_access_s, next_req_idx
-- Ordered by req_idx, pos.
SELECT
    b.req_idx,
    b.pos,
    b.chain_idx,
    r.arrival_s AS access_s,
    r.category,
    r.type,
    r.turn,
    lead(r.arrival_s) OVER w AS next_access_s,
    lead(b.req_idx) OVER w AS next_req_idx
FROM blocks AS b
JOIN requests AS r USING (req_idx)
WINDOW w AS (PARTITION BY b.chain_idx ORDER BY b.req_idx)
ORDER BY b.req_idx, b.pos
