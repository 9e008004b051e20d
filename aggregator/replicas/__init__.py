"""Every multi-replica behaviour: leader election (`leader`), which replica holds which
partition of the node subjects (`partitions`), one replica's share (`owner`), the whole fleet
the sharded leader plans with (`wholefleet`), sharded alerts (`alerts`) and the summaries
replicas exchange (`summaries`).

May import: `aggregator.reconcile`, `alerts`, `fleet`, `rules`, `trace`, `kube`, `kv`, `bus`,
`proto`.
"""
