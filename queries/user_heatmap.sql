-- Producer x consumer ideal hits (paper Fig 6). Every prefix hit of a consumer request is credited to
-- the producer: the request that first computed the block. Keys are users, or sessions (conversation
-- roots) when $use_users is false. One row per (producer, consumer) pair with hits.
WITH k AS (
    SELECT req_idx,
           CASE WHEN $use_users THEN user_id ELSE CAST(session_id AS VARCHAR) END AS key
    FROM requests
),
pairs AS (
    SELECT c.first_req AS producer_req, b.req_idx AS consumer_req, count(*) AS num_hits
    FROM blocks AS b
    JOIN chains AS c ON c.chain_idx = b.chain_idx
    WHERE b.req_idx > c.first_req
    GROUP BY ALL
)
SELECT pk.key AS producer, ck.key AS consumer, sum(p.num_hits) AS num_hits
FROM pairs AS p
JOIN k AS pk ON pk.req_idx = p.producer_req
JOIN k AS ck ON ck.req_idx = p.consumer_req
GROUP BY ALL;
