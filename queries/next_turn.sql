-- Next-turn probability (paper Fig 11): per window of $window_s seconds (by arrival, counted from the
-- first request) and category,
-- how many requests are followed by a next turn (a later request naming them as parent), at all and
-- within $window_s seconds of their arrival.
WITH child AS (
    SELECT parent_chat_id AS chat_id, min(arrival_s) AS next_arrival_s
    FROM requests
    WHERE parent_chat_id >= 0
    GROUP BY parent_chat_id
)
SELECT CAST(floor((r.arrival_s - (SELECT min(arrival_s) FROM requests)) / $window_s) AS BIGINT) AS window_idx,
       r.category,
       CASE WHEN r.turn IS NULL THEN NULL WHEN r.turn = 1 THEN 'single' ELSE 'multi' END AS turn_kind,
       count(*) AS num_requests,
       count(c.chat_id) AS num_with_next,
       count(*) FILTER (WHERE c.next_arrival_s - r.arrival_s <= $window_s) AS num_with_next_in_window
FROM requests AS r
LEFT JOIN child AS c ON c.chat_id = r.chat_id
GROUP BY ALL
ORDER BY window_idx, r.category;
