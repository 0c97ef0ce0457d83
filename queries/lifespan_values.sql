-- Block lifespans as a histogram of exact values, for `analyze --executor ray` (analysis/partitioned.py):
-- per category of the first access, whether the block was reused and its lifespan (last access time -
-- first access time), the number of distinct blocks. Histograms of disjoint partitions of the chains add
-- up; lifespan_quantiles.sql's figures are computed from the sum (the same quantile_cont
-- interpolation; the mean from lifespan_us, the lifespan in whole microseconds, as there).
SELECT first_category AS category,
       num_accesses >= 2 AS reused,
       last_arrival_s - first_arrival_s AS lifespan_s,
       CAST(round((last_arrival_s - first_arrival_s) * 1e6) AS BIGINT) AS lifespan_us,
       count(*) AS num_blocks
FROM chains
GROUP BY ALL
