-- req_hit_parts: the per-request sums req_hits_table.sql adds up, from the three places they come from,
-- one row per request and source (zeros in the other columns):
-- - its block references and tokens (blocks, grouped by request);
-- - its prefix misses: the chains it computes first (chains.first_req = req_idx) and their tokens;
-- - its content misses: the references whose block_id first appears in this request (content_blocks).
-- Every row is a sum over whole chains (blocks, chains) or whole block ids (content_blocks), so the rows of
-- disjoint partitions of the chains and of the block ids (`analyze --executor ray`, analysis/partitioned.py)
-- add up to those of the whole run. Locally blocks and content_blocks are the same table.
SELECT req_idx, count(*) AS num_blocks, CAST(sum(num_tokens) AS BIGINT) AS num_tokens,
       0::BIGINT AS num_miss_blocks, 0::BIGINT AS num_miss_tokens, 0::BIGINT AS num_content_miss_blocks
FROM blocks
GROUP BY req_idx
UNION ALL
SELECT first_req, 0, 0, count(*), CAST(sum(first_num_tokens) AS BIGINT), 0
FROM chains
GROUP BY first_req
UNION ALL
SELECT b.req_idx, 0, 0, 0, 0, count(*)
FROM content_blocks AS b
JOIN (SELECT block_id, min(req_idx) AS first_req FROM content_blocks GROUP BY block_id) AS cf
  ON cf.block_id = b.block_id AND cf.first_req = b.req_idx
GROUP BY b.req_idx
