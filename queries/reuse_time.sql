-- Reuse time (paper Fig 12-15), over the reuse_events view (reuse_events.sql: one row per block
-- access with the time of the same block's next access). reuse_time_s = next_access_s - access_s,
-- NULL when never accessed again. Grouped by the category of the access being reused and a log bin
-- (bin k holds (10^((k-1)/$bins_per_decade), 10^(k/$bins_per_decade)] seconds, clamped to
-- [$bin_min, $bin_max]; reuse time 0 -> $bin_zero; never reused -> NULL), with exact counts within
-- $short_s and $long_s seconds and the summed reuse times, all and after $long_s (a block waits
-- through each of its reuse times: their sum is the time integral of the oracle's live set), in whole
-- microseconds (each reuse time rounded to 1 us): integer sums are exact in any order, so the sums of
-- partitions (`analyze --executor ray`) equal the whole run's to the bit.
WITH ev AS (
    SELECT category, next_access_s - access_s AS reuse_time_s
    FROM reuse_events
)
SELECT category,
       CASE WHEN reuse_time_s IS NULL THEN NULL
            WHEN reuse_time_s <= 0 THEN $bin_zero
            ELSE greatest($bin_min, least($bin_max,
                     CAST(ceil($bins_per_decade * log10(reuse_time_s)) AS INTEGER)))
       END AS bin,
       count(*) AS num_accesses,
       count(*) FILTER (WHERE reuse_time_s <= $short_s) AS num_within_short,
       count(*) FILTER (WHERE reuse_time_s <= $long_s) AS num_within_long,
       coalesce(sum(CAST(round(reuse_time_s * 1e6) AS BIGINT)), 0) AS reuse_us,
       coalesce(sum(CAST(round(reuse_time_s * 1e6) AS BIGINT)) FILTER (WHERE reuse_time_s > $long_s), 0)
           AS reuse_us_after_long
FROM ev
GROUP BY ALL
ORDER BY category, bin;
