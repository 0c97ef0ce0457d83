-- User skew (paper Fig 8): histogram of ideal prefix hits per consumer key (user, or session when
-- $use_users is false), num_hits -> num_keys, keys with no hit included.
WITH per_key AS (
    SELECT CASE WHEN $use_users THEN r.user_id ELSE CAST(r.session_id AS VARCHAR) END AS key,
           coalesce(sum(h.num_hit_blocks), 0) AS num_hits
    FROM requests AS r
    LEFT JOIN req_hits AS h ON h.req_idx = r.req_idx
    GROUP BY 1
)
SELECT num_hits, count(*) AS num_keys
FROM per_key
GROUP BY num_hits
ORDER BY num_hits DESC;
