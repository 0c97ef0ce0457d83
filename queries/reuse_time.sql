-- Reuse time (paper Fig 12-15): for every block access, the time until the next access of the same
-- prefix-chained block (NULL when never accessed again). Grouped by the category of the access being
-- reused and a log bin of the reuse time (bin k: (10^((k-1)/$bins_per_decade), 10^(k/$bins_per_decade)]
-- seconds, clamped to [$bin_min, $bin_max]; reuse time 0 -> $bin_zero; never reused -> NULL), with
-- exact counts within $short_s and $long_s seconds.
WITH ev AS (
    SELECT r.category,
           lead(r.arrival_s) OVER (PARTITION BY b.chain_idx ORDER BY b.req_idx, b.pos) - r.arrival_s
               AS reuse_time_s
    FROM blocks AS b
    JOIN requests AS r ON r.req_idx = b.req_idx
)
SELECT category,
       CASE WHEN reuse_time_s IS NULL THEN NULL
            WHEN reuse_time_s <= 0 THEN $bin_zero
            ELSE greatest($bin_min, least($bin_max,
                     CAST(ceil($bins_per_decade * log10(reuse_time_s)) AS INTEGER)))
       END AS bin,
       count(*) AS num_accesses,
       count(*) FILTER (WHERE reuse_time_s <= $short_s) AS num_within_short,
       count(*) FILTER (WHERE reuse_time_s <= $long_s) AS num_within_long
FROM ev
GROUP BY ALL
ORDER BY category, bin;
