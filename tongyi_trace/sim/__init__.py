"""The embedded replay engine (`kvtrace simulate`): a numba-compiled prefix-cache simulator.

    stream.py        a run folder as dense integer arrays (optionally regrouped to an engine block size)
    kernel.py        the prefix-cache core (vLLM semantics), specialised per policy
    policies/*.py    one eviction policy per file (LRU, FIFO, LFU, S3-FIFO, GDSF, WA, ORACLE)
    registry.py      the policies keyed by the Policy enum; policy_base.py their typed parameters
    simulate.py      simulate_policy(): one policy at one capacity -> PolicyResult
    lru_curve.py     the exact LRU curve for every capacity in one pass
    capacity.py      capacities (blocks, %, x HBM, x peak live set); cost_model.py QTTFT
    engine_model.py  predict_request_hits(): what a real vLLM engine's prefix cache will report
    sweep.py         policies x capacities in parallel, artifacts in RUN_DIR/sim/
    bootstrap.py     the paired block bootstrap (sessions resampled): intervals of gains and sizes
    intervals.py     a sweep's intervals: gains and QTTFT changes against LRU, sizes reaching the targets
"""
