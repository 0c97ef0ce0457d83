"""The fleet: many serving instances behind a router, each with its own (tiered) prefix cache and queue
(docs/fleet.md). `simulate_fleet` runs one configuration; `fleet.sweep` runs routers x instances x
capacities for `kvtrace simulate --instances`."""
