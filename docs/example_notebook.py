# %% [markdown]
# # kvtrace in a notebook
# A capacity-planning session with the Python API (docs/api.md): ingest a trace, look at its reuse, fit
# the workload-aware policy, simulate it against LRU at byte capacities, and read the recommendation.
# Run it as a script (`python docs/example_notebook.py TRACE`) or cell by cell in Jupyter (`# %%` cells).

# %%
import sys
from pathlib import Path

import tongyi_trace as kv

trace = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("../shared/traces/mooncake_conversation.jsonl")
run = kv.ingest(trace, Path("runs") / trace.stem, overwrite=True)
print(run.provenance["num_requests"], "requests")

# %% Reuse: the ideal hit ratio and the exact LRU curve
print(run.analyze(only=["hit_ratio"])["hit_ratio"])
curve = run.lru_curve()
print(curve.tail(5))

# %% Fit, then simulate LRU, S3-FIFO and WA at cache sizes in GiB of the model's KV
policy = run.fit(capacities="5%,25%")
df = run.simulate(["lru", "s3fifo", "wa"], "10GiB,100GiB,1x", model="qwen2-7b", params=policy)
print(df.select("policy", "capacity", "capacity_blocks", "hit_ratio", "qttft_mean_s", "utilization",
                "instances_needed"))

# %% The answer: how much cache for 80/90/95% of the ideal, which policy, how many instances
rec = run.recommend()
assert rec is not None
for t in rec["targets"]:
    sizes = t["lru"]["size"] or {}
    print(f"{t['target']:.0%} of ideal: LRU needs", {m: round(s["gib"], 1) for m, s in sizes.items()}, "GiB")
print("fitted policy loses to LRU at:", rec["fitted_loses_at"] or "nowhere")
print("report:", run.report())
