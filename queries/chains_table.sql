-- chains: one row per distinct prefix-chained block (chain_idx): the request that first computed it
-- (first_req) and the tokens it held there (first_num_tokens), the last request that used it
-- (last_req), how many references it has, the arrival times of the first and last request and the
-- category of the first one. Shared by hit ratio, skew, heatmap, lifespan and live set.
CREATE OR REPLACE TEMP TABLE chains AS
WITH c AS (
    SELECT chain_idx,
           min(req_idx) AS first_req,
           max(req_idx) AS last_req,
           count(*) AS num_accesses,
           arg_min(num_tokens, req_idx) AS first_num_tokens
    FROM blocks
    GROUP BY chain_idx
)
SELECT c.chain_idx, c.first_req, c.last_req, c.num_accesses, c.first_num_tokens,
       f.arrival_s AS first_arrival_s,
       l.arrival_s AS last_arrival_s,
       f.category AS first_category
FROM c
JOIN requests AS f ON f.req_idx = c.first_req
JOIN requests AS l ON l.req_idx = c.last_req;
