"""`asyncrl-bench`: throughput of the env backend, the sampler, the trainer and a naive synchronous baseline.

One module per job: `settings` (what one measurement runs), `env_only`, `trainer` and `naive` (the
measurements), `windows` (turning timed windows into a record), `machine`, `suite` (the full/quick plan and
its ratios) and `report` (the markdown table).
"""
