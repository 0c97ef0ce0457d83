-- live_deltas: per request, how the oracle's live set changes at it (live_set.sql sums them up): +1 for
-- each reused chain it first computes (first_req), -1 for each chain whose last reuse it is (last_req).
-- A sum over whole chains: the rows of disjoint partitions of the chains add up to those of the run.
WITH ev AS (
    SELECT first_req AS req_idx, 1 AS delta FROM chains WHERE last_req > first_req
    UNION ALL
    SELECT last_req AS req_idx, -1 AS delta FROM chains WHERE last_req > first_req
)
SELECT req_idx, CAST(sum(delta) AS BIGINT) AS delta
FROM ev
GROUP BY req_idx
