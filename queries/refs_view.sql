-- refs: one row per block reference with the attributes of its request (base view of the analyses).
CREATE OR REPLACE TEMP VIEW refs AS
SELECT b.req_idx, b.pos, b.block_id, b.chain_idx, b.num_tokens,
       r.arrival_s, r.type, r.turn, r.category, r.user_id, r.session_id
FROM blocks AS b
JOIN requests AS r ON r.req_idx = b.req_idx;
