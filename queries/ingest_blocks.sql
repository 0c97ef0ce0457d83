-- Re-keying pass of `kvtrace ingest`, used only when the trace's timestamps are out of order:
-- block rows written in file order are re-keyed to arrival order (req_idx) and the prefix-chained
-- id is densely renumbered again (chain_idx) in order of first appearance in arrival order.
-- Views: file_blocks(req_idx = index in file order, pos, block_id, chain_id, num_tokens),
--        req_order(raw_idx, req_idx).
-- A chain id always sits at the same position (it encodes the prefix length), so first appearance is
-- (min req_idx, pos).
WITH b AS (
    SELECT o.req_idx, r.pos, r.block_id, r.chain_id, r.num_tokens
    FROM file_blocks r JOIN req_order o ON r.req_idx = o.raw_idx
),
firsts AS (
    SELECT chain_id, row_number() OVER (ORDER BY min(req_idx), min(pos)) - 1 AS chain_idx
    FROM b GROUP BY chain_id
)
SELECT b.req_idx, b.pos, b.block_id, b.chain_id, f.chain_idx, b.num_tokens
FROM b JOIN firsts f USING (chain_id)
ORDER BY b.req_idx, b.pos
