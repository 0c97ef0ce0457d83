-- Turns per user, or per session when $use_users is false (paper Fig 10): histogram of the number of
-- requests each key sent (num_requests -> num_keys).
WITH per_key AS (
    SELECT CASE WHEN $use_users THEN user_id ELSE CAST(session_id AS VARCHAR) END AS key,
           count(*) AS num_requests
    FROM requests
    GROUP BY 1
)
SELECT num_requests, count(*) AS num_keys
FROM per_key
GROUP BY num_requests
ORDER BY num_requests;
