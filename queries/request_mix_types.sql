-- Request mix (paper Fig 5): requests per type and how many are follow-up turns (turn >= 2).
SELECT type,
       count(*) AS num_requests,
       count(*) FILTER (WHERE turn >= 2) AS num_multi_turn_requests
FROM requests
GROUP BY type
ORDER BY num_requests DESC, type;
