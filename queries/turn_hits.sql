-- Single- vs multi-turn contribution to ideal hits (paper Fig 5): per type, hits of first-turn
-- requests (turn = 1, 'single') and of follow-up turns (turn >= 2, 'multi').
SELECT r.type,
       CASE WHEN r.turn = 1 THEN 'single' ELSE 'multi' END AS turn_kind,
       count(*) AS num_requests,
       coalesce(sum(h.num_blocks), 0) AS num_blocks,
       coalesce(sum(h.num_hit_blocks), 0) AS num_hit_blocks
FROM requests AS r
LEFT JOIN req_hits AS h ON h.req_idx = r.req_idx
WHERE r.turn IS NOT NULL
GROUP BY ALL
ORDER BY r.type, turn_kind DESC;
