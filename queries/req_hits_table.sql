-- req_hits: one row per request: its block references and ideal (infinite-cache) hits.
-- A block reference is a prefix hit when an EARLIER request holds the same prefix-chained block, so
-- the misses of a request are exactly the chains it computes first (chains.first_req = req_idx):
-- hits = blocks - those (hit tokens likewise). A reference is a content hit when an earlier request
-- holds the same block_id at any position (the non-prefix variant, paper Fig 4's contrast); its
-- misses are the references whose block_id first appears in this request. Prefix hits are contiguous
-- from the head by construction: an earlier request holding chain(pos) also held chain(0..pos-1).
CREATE OR REPLACE TEMP TABLE req_hits AS
WITH tokens AS (
    SELECT req_idx, count(*) AS num_blocks, sum(num_tokens) AS num_tokens
    FROM blocks
    GROUP BY req_idx
),
prefix_miss AS (
    SELECT first_req AS req_idx, count(*) AS num_blocks, sum(first_num_tokens) AS num_tokens
    FROM chains
    GROUP BY first_req
),
content_first AS (
    SELECT block_id, min(req_idx) AS first_req
    FROM blocks
    GROUP BY block_id
),
content_miss AS (
    SELECT b.req_idx, count(*) AS num_blocks
    FROM blocks AS b
    JOIN content_first AS cf ON cf.block_id = b.block_id AND cf.first_req = b.req_idx
    GROUP BY b.req_idx
)
SELECT t.req_idx,
       t.num_blocks,
       t.num_blocks - coalesce(pm.num_blocks, 0) AS num_hit_blocks,
       t.num_tokens,
       t.num_tokens - coalesce(pm.num_tokens, 0) AS num_hit_tokens,
       t.num_blocks - coalesce(cm.num_blocks, 0) AS num_content_hit_blocks
FROM tokens AS t
LEFT JOIN prefix_miss AS pm ON pm.req_idx = t.req_idx
LEFT JOIN content_miss AS cm ON cm.req_idx = t.req_idx;
