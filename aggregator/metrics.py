"""The aggregator's own Prometheus metrics, created on an explicit registry.

No module-level collectors: every process (and every test) builds its own `Metrics`
on its own `CollectorRegistry` and passes it down.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    messages: Counter
    rejected: Counter
    kv_writes: Counter
    kv_write_errors: Counter
    nodes: Gauge
    nats_connected: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        reg = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=reg,
            messages=Counter(
                "nicfleet_ingest_messages",
                "Node messages accepted, by kind.",
                ["kind"],
                registry=reg,
            ),
            rejected=Counter(
                "nicfleet_ingest_rejected",
                "Node messages dropped, by kind and reason (subject, decode, node-mismatch).",
                ["kind", "reason"],
                registry=reg,
            ),
            kv_writes=Counter(
                "nicfleet_kv_writes", "Successful KV writes, by bucket.", ["bucket"], registry=reg
            ),
            kv_write_errors=Counter(
                "nicfleet_kv_write_errors", "Failed KV writes, by bucket.", ["bucket"], registry=reg
            ),
            nodes=Gauge("nicfleet_nodes", "Nodes known to the aggregator.", registry=reg),
            nats_connected=Gauge(
                "nicfleet_nats_connected", "1 while connected to NATS.", registry=reg
            ),
        )
