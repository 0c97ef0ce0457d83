#!/usr/bin/env bash
# `make install`'s last step: compile the simulator's numba kernels once and leave them in numba's cache
# (beside the package's sources), so the first real run and the tests do not stall on compilation.
# It runs a small pipeline through every compiled path: ingest, the analyses, the fit's tuning, every
# policy with the engine model, the guard, and the fleet with HBM + DRAM tiers and a remote pool.
# Each simulate runs its tasks in its own process (-j 1): a pool's workers would compile the same kernels
# side by side (they read the same specializations from the cache later: sim/stream.py, executor.py).
# bench/bench_compile.py runs this script against an empty private cache and prints the seconds per kernel.
set -euo pipefail
K=${KVTRACE:-.venv/bin/kvtrace}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
start=$(date +%s)
PY=${PYTHON:-$(dirname "${K%% *}")/python}
notice=$($PY -c "from tongyi_trace.compile_notice import NOTICE; print(NOTICE)" 2>/dev/null \
         || echo "compiling the simulator (first run only)")
echo "make install: $notice; later runs read numba's cache"
export KVTRACE_NO_COMPILE_NOTICE=1  # said once here, not once per command
$K synth --profile to-c --seed 1 --requests 3000 --duration 1800 -o "$D/t.jsonl" -q
$K ingest "$D/t.jsonl" -o "$D/run" -q
$K ingest "$D/t.jsonl" -o "$D/fleet" -q  # a run folder has one writer at a time
# with KVTRACE_COMPILE_LOG (bench/bench_compile.py): a step's CPU seconds (user, sys of its commands: bash's
# `times`) and when it ended (s since the start), one JSON line in the log
step_cpu() {
  [ -n "${KVTRACE_COMPILE_LOG:-}" ] || return 0
  times > "$D/times-$1"  # not in $(...): a subshell's `times` counts none of this shell's commands
  echo "{\"branch\": \"$1\", \"times\": \"$(tail -1 "$D/times-$1")\", \"end_s\": $(( $(date +%s) - start ))}" \
    >> "$KVTRACE_COMPILE_LOG"
}
step_cpu setup
# two processes, one per core, each compiling its own share of the policies' loops (one loop per policy
# serves one cache and both tiers, sim/kernel.py): the fit's candidates (lru, fifo, s3fifo, wa), then the
# oracle, in the first, lfu and gdsf, then the fleet's kernels over them, in the second (bench/bench_compile.py:
# about 40 CPU s each); each later step finds the other's loops in the cache (a loop both compiled at once
# would cost its seconds twice)
( $K analyze "$D/run" -q
  $K fit "$D/run" --capacity 0.5L -o "$D/policy.json" -q -j 1
  $K simulate "$D/run" -p all,fitted,oracle-dead --policy-file "$D/policy.json" -c 0.5L --ablation -q --name warm -j 1
  $K simulate "$D/run" -p lru,wa -c 0.5L --engine-block-size 32 -q --name warm-engine -j 1
  step_cpu first ) &
a=$!
( $K simulate "$D/fleet" -p lfu,gdsf -c 0.5L -q --name warm-own -j 1
  $K fit "$D/fleet" --capacity none -o "$D/fleet-policy.json" -q
  $K simulate "$D/fleet" -p lfu,gdsf -c 5% --policy-file "$D/fleet-policy.json" --hbm-capacity 1% --hbm-policy lfu \
      --remote-capacity 20% --instances 2 --router all -q --name warm-fleet -j 1
  step_cpu second ) &
b=$!
wait $a
wait $b
echo "the simulator's kernels are compiled and cached ($(( $(date +%s) - start )) s)"
