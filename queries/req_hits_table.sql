-- req_hits: one row per request that has blocks: its ideal (infinite-cache) hits.
-- A block reference is a prefix hit when an EARLIER request holds the same prefix-chained block
-- (req_idx > the chain's first_req); a content hit when an earlier request holds the same block_id
-- anywhere (the non-prefix variant, paper Fig 4's contrast). Hits are contiguous from the head by
-- construction: an earlier request holding chain(pos) also held chain(0..pos-1).
CREATE OR REPLACE TEMP TABLE req_hits AS
WITH content_first AS (
    SELECT block_id, min(req_idx) AS first_req
    FROM blocks
    GROUP BY block_id
)
SELECT b.req_idx,
       count(*) AS num_blocks,
       count(*) FILTER (WHERE b.req_idx > c.first_req) AS num_hit_blocks,
       sum(b.num_tokens) AS num_tokens,
       coalesce(sum(b.num_tokens) FILTER (WHERE b.req_idx > c.first_req), 0) AS num_hit_tokens,
       count(*) FILTER (WHERE b.req_idx > cf.first_req) AS num_content_hit_blocks
FROM blocks AS b
JOIN chains AS c ON c.chain_idx = b.chain_idx
JOIN content_first AS cf ON cf.block_id = b.block_id
GROUP BY b.req_idx;
