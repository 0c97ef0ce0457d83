-- req_hits: one row per request: its block references and ideal (infinite-cache) hits, summed from
-- req_hit_parts (req_hit_parts.sql: per-request sums over chains and block ids).
-- A block reference is a prefix hit when an EARLIER request holds the same prefix-chained block, so
-- the misses of a request are exactly the chains it computes first (chains.first_req = req_idx):
-- hits = blocks - those (hit tokens likewise). A reference is a content hit when an earlier request
-- holds the same block_id at any position (the non-prefix variant, paper Fig 4's contrast); its
-- misses are the references whose block_id first appears in this request. Prefix hits are contiguous
-- from the head by construction: an earlier request holding chain(pos) also held chain(0..pos-1).
CREATE OR REPLACE TEMP TABLE req_hits AS
SELECT req_idx,
       CAST(sum(num_blocks) AS BIGINT) AS num_blocks,
       CAST(sum(num_blocks) - sum(num_miss_blocks) AS BIGINT) AS num_hit_blocks,
       sum(num_tokens) AS num_tokens,
       sum(num_tokens) - sum(num_miss_tokens) AS num_hit_tokens,
       CAST(sum(num_blocks) - sum(num_content_miss_blocks) AS BIGINT) AS num_content_hit_blocks
FROM req_hit_parts
GROUP BY req_idx;
