"""Prometheus metrics of the alert engine and its deliveries, on an explicit registry.

Firing alerts and findings by rule are exported by aggregator.metrics.FleetCollector.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class AlertMetrics:
    evaluations: Counter
    evaluation_seconds: Histogram
    transitions: Counter
    firing: Gauge
    findings: Gauge
    publish_errors: Counter
    store_errors: Counter
    stream_clients: Gauge
    stream_dropped: Counter
    alertmanager_posts: Counter
    events: Counter
    evaluate_errors: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> AlertMetrics:
        reg = registry
        return cls(
            evaluations=Counter(
                "nicfleet_rule_evaluations",
                "Rule engine runs, by trigger.",
                ["trigger"],
                registry=reg,
            ),
            evaluation_seconds=Histogram(
                "nicfleet_rule_evaluation_seconds",
                "Time to evaluate all rules and advance the alert lifecycle.",
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                registry=reg,
            ),
            transitions=Counter(
                "nicfleet_alert_transitions",
                "Alert transitions, by state.",
                ["state"],
                registry=reg,
            ),
            # Totals the engine keeps; not exported: aggregator.metrics.FleetCollector
            # exports both by rule and severity under these names at scrape time.
            firing=Gauge("nicfleet_alerts_firing", "Alerts firing now.", registry=None),
            findings=Gauge("nicfleet_findings", "Findings of the last evaluation.", registry=None),
            publish_errors=Counter(
                "nicfleet_alert_publish_errors",
                "Alert publishes to NATS that failed.",
                registry=reg,
            ),
            store_errors=Counter(
                "nicfleet_alert_store_errors",
                "Alert state writes to KV nicfleet-alerts that failed (retried).",
                registry=reg,
            ),
            stream_clients=Gauge(
                "nicfleet_alert_stream_clients", "Connected SSE alert stream clients.", registry=reg
            ),
            stream_dropped=Counter(
                "nicfleet_alert_stream_dropped",
                "SSE clients dropped because their queue was full.",
                registry=reg,
            ),
            alertmanager_posts=Counter(
                "nicfleet_alertmanager_posts",
                "Alertmanager POST attempts, by result (ok, retry, failed).",
                ["result"],
                registry=reg,
            ),
            events=Counter(
                "nicfleet_alert_kube_events",
                "Kubernetes Events for critical alerts, by result (ok, failed).",
                ["result"],
                registry=reg,
            ),
            evaluate_errors=Counter(
                "nicfleet_rule_evaluation_errors",
                "Rule engine runs that raised (the previous findings are kept).",
                registry=reg,
            ),
        )
