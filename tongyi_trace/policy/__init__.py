"""The policy core: what the simulator, the fit, the vLLM plugin and the CLI share about a policy.
Standard library and numpy at import (the vLLM plugin imports it inside the engine, without numba);
the reuse-model fit imports scipy when it first runs.

- names.py:       the one enum of policy names and the plugin's eviction modes;
- file.py:        the versioned policy file (`kvtrace.policy/2`) that `kvtrace fit` writes;
- settings.py:    one settings type per policy (WA with its guard settings, S3-FIFO's constants);
- wa_priority.py: WA's eviction priority and the one total eviction order;
- reuse_model.py: the censored reuse-time fit (exponential MLE, Kaplan-Meier, KS);
- guard.py:       the shadow-LRU guard's switch rule over two shadow caches' hit ratios;
- sampling.py:    SHARDS-style spatial sampling of blocks by a hash of their identity;
- refit.py:       the sliding window of sampled reuses and the online refit of WA's categories.
"""
