-- Block lifespan percentiles (paper Fig 19-20), interpolated (quantile_cont) at $qs, overall
-- (category NULL) and per category of the first access; over all distinct blocks (never reused = 0 s)
-- and over reused blocks only. The mean is an exact sum of lifespans in whole microseconds (each rounded to
-- 1 us) / 1e6 / count: equal in any summation order (analysis/partitioned.py computes it the same way).
SELECT first_category AS category,
       count(*) AS num_blocks,
       count(*) FILTER (WHERE num_accesses >= 2) AS num_reused_blocks,
       CAST(sum(CAST(round((last_arrival_s - first_arrival_s) * 1e6) AS BIGINT)) AS DOUBLE) / 1e6 / count(*)
           AS mean_lifespan_s,
       quantile_cont(last_arrival_s - first_arrival_s, $qs) AS lifespan_q_s,
       quantile_cont(last_arrival_s - first_arrival_s, $qs) FILTER (WHERE num_accesses >= 2)
           AS reused_lifespan_q_s
FROM chains
GROUP BY GROUPING SETS ((first_category), ())
ORDER BY category NULLS FIRST;
