"""A policy that never stays wrong: the shadow-LRU guard and the online refit of WA, one implementation
for the simulator (tongyi_trace.guard.simulate) and the vLLM plugin (tongyi_trace.vllm_plugin).

- sampling.py: SHARDS-style spatial sampling of blocks by a hash of their identity (rate R);
- decide.py:   the guard's switch rule over the hit ratios of two shadow caches (LRU and the policy)
               that run on the sampled blocks with R x the capacity;
- refit.py:    the sliding window of sampled reuse observations and the refit with `kvtrace fit`'s
               estimator, and the per-category metrics (observed reuse vs predicted, KS).

Standard library and numpy at import, so the vLLM engine can import it; the refit imports the fit's
estimator (scipy) when it first runs.
"""
