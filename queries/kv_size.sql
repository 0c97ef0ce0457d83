-- Per-request KV footprint (paper Fig 21): quantiles (quantile_disc at $qs) of the tokens a request
-- keeps in the KV cache: its prompt (input) and prompt + output. Bytes = tokens x bytes per token.
SELECT count(*) AS num_requests,
       quantile_disc(input_tokens, $qs) AS input_tokens_q,
       quantile_disc(input_tokens + output_tokens, $qs) AS total_tokens_q,
       max(input_tokens + output_tokens) AS max_total_tokens
FROM requests;
