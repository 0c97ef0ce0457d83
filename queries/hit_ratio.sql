-- Ideal prefix hit ratio (paper Fig 4): per (type, category), block and token counts and hits.
-- Overall and per-type figures are sums of these rows.
SELECT r.type,
       r.category,
       count(*) AS num_requests,
       coalesce(sum(h.num_blocks), 0) AS num_blocks,
       coalesce(sum(h.num_hit_blocks), 0) AS num_hit_blocks,
       coalesce(sum(h.num_tokens), 0) AS num_tokens,
       coalesce(sum(h.num_hit_tokens), 0) AS num_hit_tokens,
       coalesce(sum(h.num_content_hit_blocks), 0) AS num_content_hit_blocks
FROM requests AS r
LEFT JOIN req_hits AS h ON h.req_idx = r.req_idx
GROUP BY r.type, r.category
ORDER BY r.category;
