"""What a running aggregator is made of: its opened parts (`parts`: the frozen `Runtime`,
each resource opened into the run's AsyncExitStack) and the single-replica or sharded
strategy (`strategy`). The shell `aggregator.service` orders the start and owns the tasks.

May import: `aggregator.api`, `replicas`, `reconcile`, `validations`, `alerts`, `rules`,
`fleet`, `kube`, `kv`, `bus`, `cluster`, `metrics`, `errors`, `proto` (never `service`).
"""
