-- Spatial locality (paper Fig 16-18): per request, in req_idx order, its number of blocks (to place a
-- block at relative position pos / num_blocks) and its type; the per-window hit counting runs in
-- tongyi_trace/analysis/spatial.py over blocks.parquet.
SELECT req_idx, num_blocks, type
FROM requests
ORDER BY req_idx;
