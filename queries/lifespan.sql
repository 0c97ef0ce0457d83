-- Block lifespan (paper Fig 19-20): per distinct block, last access time - first access time (0 for a
-- block never reused), grouped by the category of the request that first computed it, whether it was
-- ever reused, and a log bin (same bins as reuse_time.sql).
WITH life AS (
    SELECT first_category AS category,
           num_accesses >= 2 AS reused,
           last_arrival_s - first_arrival_s AS lifespan_s
    FROM chains
)
SELECT category,
       reused,
       CASE WHEN lifespan_s <= 0 THEN $bin_zero
            ELSE greatest($bin_min, least($bin_max,
                     CAST(ceil($bins_per_decade * log10(lifespan_s)) AS INTEGER)))
       END AS bin,
       count(*) AS num_blocks
FROM life
GROUP BY ALL
ORDER BY category, reused, bin;
