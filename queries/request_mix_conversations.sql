-- Turn counts of conversations (paper Fig 9, "turn-count distribution"): how many conversations (the
-- requests sharing one root, session_id) reach each deepest turn number.
WITH per_conversation AS (
    SELECT session_id, max(turn) AS turns
    FROM requests
    WHERE turn IS NOT NULL
    GROUP BY session_id
)
SELECT turns, count(*) AS num_conversations
FROM per_conversation
GROUP BY turns
ORDER BY turns;
