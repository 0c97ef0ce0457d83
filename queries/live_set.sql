-- Oracle live set (paper Fig 22): after each request, the number of blocks already computed that some
-- later request reuses (chains with first_req <= req_idx < last_req). A block enters when first
-- computed and leaves at its last reuse; blocks never reused never enter. Over live_deltas
-- (live_deltas.sql: per request, +1 for each reused chain it computes first, -1 at each last reuse).
WITH d AS (
    SELECT req_idx, sum(delta) AS delta FROM live_deltas GROUP BY req_idx
)
SELECT r.req_idx,
       r.arrival_s,
       sum(coalesce(d.delta, 0)) OVER (ORDER BY r.req_idx ROWS UNBOUNDED PRECEDING) AS num_live_blocks
FROM requests AS r
LEFT JOIN d ON d.req_idx = r.req_idx
ORDER BY r.req_idx;
