#!/usr/bin/env bash
# `make demo`: the whole kvtrace pipeline on the embedded default, a synthetic to-C trace calibrated to
# the paper's Trace A, with the CPU vLLM engine (no GPU, no download). Usage: scripts/demo.sh [OUT_DIR]
set -euo pipefail
OUT=${1:-demo-run}
K=${KVTRACE:-.venv/bin/kvtrace}
REPLAY_REQUESTS=${REPLAY_REQUESTS:-1600}
ENGINE_BLOCKS=${ENGINE_BLOCKS:-4096}  # x 32 tokens: evictions bind on the replayed slice, and the fitted choice wins there in simulation
ENGINE_CAP=$(( (ENGINE_BLOCKS - 1) * 2 ))  # the engine's cache in 16-token trace blocks (one is vLLM's null block)
SPEEDUP=${SPEEDUP:-2}  # twice real time: the tiny CPU engine keeps up one request at a time
mkdir -p "$OUT"
cleanup() { $K engine stop --name demo-lru >/dev/null 2>&1 || true; $K engine stop --name demo-wa >/dev/null 2>&1 || true; }
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/9 synth: a Trace-A-like to-C trace (~43k requests, ~2 h)"
$K synth --profile to-c --seed 1 -o "$OUT/to-c.jsonl"
step "2/9 ingest: normalized tables with prefix-chained block ids"
$K ingest "$OUT/to-c.jsonl" -o "$OUT/run" --overwrite
step "3/9 analyze: the paper's characterization (Fig 4-22)"
$K analyze "$OUT/run"
step "4/9 fit: per-category reuse models, hour 1 -> hour 2, and the setting to run at each cache size"
$K fit "$OUT/run" --train 0:3600 --test 3600: --capacity "0.125L,0.25L,0.5L,1L,2L,4L,$ENGINE_CAP" \
    -o "$OUT/policy.json"
step "5/9 simulate: every policy, the fitted choice, the oracle and oracle-dead over capacities (x the oracle's peak live set)"
$K simulate "$OUT/run" --policies all,fitted,oracle-dead --capacity 0.125L,0.25L,0.5L,1L,2L,4L --policy-file "$OUT/policy.json" \
    --ablation
step "6/9 replay on the CPU vLLM engine with its own LRU ($REPLAY_REQUESTS requests)"
URL=$($K engine start --num-blocks "$ENGINE_BLOCKS" --name demo-lru --quiet)
$K replay "$OUT/run" --server "$URL" --name lru --max-requests "$REPLAY_REQUESTS" --max-in-flight 1 \
    --max-output 4 --speedup "$SPEEDUP" --overwrite
$K engine stop --name demo-lru
step "7/9 replay the same slice with the fitted policy inside vLLM (kvtrace plugin: the file's choice for this cache)"
URL=$($K engine start --num-blocks "$ENGINE_BLOCKS" --name demo-wa --policy-file "$OUT/policy.json" \
    --time-scale "$SPEEDUP" --quiet)
$K replay "$OUT/run" --server "$URL" --name fitted --policy-file "$OUT/policy.json" --max-requests "$REPLAY_REQUESTS" --max-in-flight 1 \
    --max-output 4 --speedup "$SPEEDUP" --overwrite
$K engine stop --name demo-wa
step "8/9 compare: engine vs simulator, LRU vs the fitted policy"
$K compare "$OUT/run/replay/lru" "$OUT/run/replay/fitted" --policy-file "$OUT/policy.json"
step "9/9 report: one self-contained HTML file, and a screenshot from headless Chromium"
$K report "$OUT/run" --screenshot "$OUT/report.png"  # prints "report: PATH" and "screenshot: PATH" (absolute)
