"""Rules: pure checks `check(RuleInput) -> list[Finding]`, one module per family, each
ending in the explicit tuple of its rules' descriptors (`descriptor.Rule`); `catalog`
concatenates them, and `engine` derives its tables from them.

May import: `aggregator.fleet` (the records they judge), `aggregator.cluster`,
`aggregator.dra.nodedevices` (a DRA device's health), `proto`.
No I/O, no clock, no logging (a contract in pyproject.toml)."""
