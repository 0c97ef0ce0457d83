"""The schema strings of kvtrace's versioned JSON artifacts that more than one module writes or reads.

One home for each: the writer and every reader import the string from here (a light module, so readers
such as the report or the simulator need not import the writer's dependencies).
"""

COST_SCHEMA = "kvtrace.cost/2"  # replay's fitted TTFT cost model (replay/cost.py), read by `simulate --cost-from`
