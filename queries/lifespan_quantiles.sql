-- Block lifespan percentiles (paper Fig 19-20), interpolated (quantile_cont) at $qs, overall
-- (category NULL) and per category of the first access; over all distinct blocks (never reused = 0 s)
-- and over reused blocks only.
SELECT first_category AS category,
       count(*) AS num_blocks,
       count(*) FILTER (WHERE num_accesses >= 2) AS num_reused_blocks,
       avg(last_arrival_s - first_arrival_s) AS mean_lifespan_s,
       quantile_cont(last_arrival_s - first_arrival_s, $qs) AS lifespan_q_s,
       quantile_cont(last_arrival_s - first_arrival_s, $qs) FILTER (WHERE num_accesses >= 2)
           AS reused_lifespan_q_s
FROM chains
GROUP BY GROUPING SETS ((first_category), ())
ORDER BY category NULLS FIRST;
