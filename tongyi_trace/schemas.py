"""The schema strings of kvtrace's versioned JSON artifacts, and the labels their tables share.

One home for each: the writer and every reader import the string from here (a light module with no
imports, so readers such as the report, the simulator or the vLLM plugin need not import the writer's
dependencies). docs/artifacts/ describes each document.
"""

RUN_SCHEMA = "kvtrace.run/1"  # RUN/provenance.json, written by `kvtrace ingest`, checked by run.open_run
ANALYSIS_SCHEMA = "kvtrace.analysis/1"  # RUN/analysis/NAME.json (analysis/common.py), read by the report
FIT_TABLE_SCHEMA = "kvtrace.fit-table/1"  # RUN/fit/train_test.json (fit/policy_fit.py), read by the report
POLICY_SCHEMA = "kvtrace.policy/2"  # the policy file (policy/file.py), read by the simulator and the plugin
POLICY_SCHEMA_V1 = "kvtrace.policy/1"  # the earlier policy file, still read
WORKLOAD_SCHEMA = "kvtrace.workload/2"  # RUN/fit/workload.json (fit/synth_like.py), read by `synth --like`
SIM_SCHEMA = "kvtrace.sim/1"  # RUN/sim/[NAME/]summary.json (sim/sweep.py), read by the report
SIM_PIN_SCHEMA = "kvtrace.sim-pin/1"  # RUN/sim/pinned.json: the sweep the report reads (sim/sweep.py)
SIZING_SCHEMA = "kvtrace.sizing/1"  # RUN/sizing.json: the model and GPU settings last sized with (models.py)
RECOMMENDATION_SCHEMA = "kvtrace.recommendation/1"  # a sweep's recommendation (sim/recommend.py)
FLEET_SCHEMA = "kvtrace.fleet/1"  # RUN/sim/fleet/summary.json (fleet/sweep.py), read by the report
REPLAY_SCHEMA = "kvtrace.replay/1"  # RUN/replay/NAME/summary.json (replay/runner.py), read by compare, report
SWEEP_SCHEMA = "kvtrace.sweep/1"  # RUN/replay/NAME/sweep.json (replay/sweep.py), a load sweep's table
COMPARE_SCHEMA = "kvtrace.compare/1"  # two replays compared (replay/compare.py), read by the report
COST_SCHEMA = "kvtrace.cost/2"  # replay's fitted TTFT cost model (replay/cost.py), read by `simulate --cost-from`
PLUGIN_STATS_SCHEMA = "kvtrace.plugin_stats/1"  # the vLLM plugin's counters (vllm_plugin/stats.py)
STUDY_SCHEMA = "kvtrace.study/1"  # a study's summary (study.py)
SET_SCHEMA = "kvtrace.set/1"  # a committed artifact set's manifest.json and the commit journal (artifact_set.py)

ALL_CATEGORIES = "(all)"  # the category label of the analysis tables' rows over all categories
