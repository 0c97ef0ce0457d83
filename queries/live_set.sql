-- Oracle live set (paper Fig 22): after each request, the number of blocks already computed that some
-- later request reuses (chains with first_req <= req_idx < last_req). A block enters when first
-- computed and leaves at its last reuse; blocks never reused never enter.
WITH ev AS (
    SELECT first_req AS req_idx, 1 AS delta FROM chains WHERE last_req > first_req
    UNION ALL
    SELECT last_req AS req_idx, -1 AS delta FROM chains WHERE last_req > first_req
),
d AS (
    SELECT req_idx, sum(delta) AS delta FROM ev GROUP BY req_idx
)
SELECT r.req_idx,
       r.arrival_s,
       sum(coalesce(d.delta, 0)) OVER (ORDER BY r.req_idx ROWS UNBOUNDED PRECEDING) AS num_live_blocks
FROM requests AS r
LEFT JOIN d ON d.req_idx = r.req_idx
ORDER BY r.req_idx;
