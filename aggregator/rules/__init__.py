"""Rules: pure functions `(fleet, policies, cluster, now) -> list[Finding]`, one module per
family; `ALL_RULES` (in `aggregator.rules.engine.registry`) is the explicit tuple of them."""
