-- Turn distribution (paper Fig 9): how many requests carry each turn number.
SELECT turn, count(*) AS num_requests
FROM requests
WHERE turn IS NOT NULL
GROUP BY turn
ORDER BY turn;
