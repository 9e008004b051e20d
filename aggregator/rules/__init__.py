"""Rules: pure checks `check(RuleInput) -> list[Finding]`, one module per family, each
ending in the explicit tuple of its rules' descriptors (`descriptor.Rule`); `catalog`
concatenates them, and `engine` derives its tables from them."""
