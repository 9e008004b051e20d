"""Alerts: the lifecycle of findings (`lifecycle`, pure: fire/resolve, dedupe, `for`
durations), the engine that evaluates the rules on changes and ticks (`engine`), persisted
states in KV `nicfleet-alerts` (`store`), delivery on NATS subjects and SSE (`delivery`) and
to Alertmanager (`alertmanager`), the engine's metrics, and the process wiring (`wiring`).

May import: `aggregator.rules`, `fleet`, `kube` (Events on nodes), `kv`, `cluster`,
`metrics`, `errors`, `proto`.
"""
