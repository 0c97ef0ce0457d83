-- Block skew (paper Fig 7): histogram of reuses per distinct block (num_reuses = references - 1).
SELECT num_accesses - 1 AS num_reuses, count(*) AS num_blocks
FROM chains
GROUP BY 1
ORDER BY 1 DESC;
