"""The aggregator's own Prometheus metrics, created on an explicit registry.

No module-level collectors: every process (and every test) builds its own `Metrics`
on its own `CollectorRegistry` and passes it down. `FleetCollector` reads the fleet and
the alert engine at scrape time (nodes by state, findings and firing alerts by rule).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proto import subjects

RECONCILE_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class IngestCounts(Collector):
    """Node messages applied to the fleet, by kind, and ignored by it, by kind and reason:
    plain ints the ingest bumps (`by_kind[kind] += 1`; at 10,000 messages a second a
    prometheus Counter's lock cost ~2.5 µs each), exported at scrape time as the counters
    `nicfleet_ingest_messages{kind}` and `nicfleet_ingest_ignored{kind,reason}`."""

    def __init__(self) -> None:
        self.by_kind: dict[str, int] = dict.fromkeys(subjects.NODE_KINDS, 0)
        self.ignored: dict[tuple[str, str], int] = {}  # (kind, reason) -> count

    @classmethod
    def registered(cls, registry: CollectorRegistry) -> IngestCounts:
        counts = cls()
        registry.register(counts)
        return counts

    def ignore(self, kind: str, reason: str) -> None:
        key = (kind, reason)
        self.ignored[key] = self.ignored.get(key, 0) + 1

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "nicfleet_ingest_messages",
            "Node messages applied to the fleet view, by kind (ignored and rejected ones"
            " are counted apart).",
            labels=["kind"],
        )
        for kind, count in self.by_kind.items():
            family.add_metric([kind], count)
        yield family
        ignored = CounterMetricFamily(
            "nicfleet_ingest_ignored",
            "Node messages decoded but not applied, by kind and reason (older, duplicate,"
            " unmatched-delta).",
            labels=["kind", "reason"],
        )
        for (kind, reason), count in sorted(self.ignored.items()):
            ignored.add_metric([kind, reason], count)
        yield ignored


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    messages: IngestCounts
    rejected: Counter
    kv_writes: Counter
    kv_write_errors: Counter
    nats_connected: Gauge
    reconcile_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        reg = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=reg,
            messages=IngestCounts.registered(reg),
            rejected=Counter(
                "nicfleet_ingest_rejected",
                "Node messages dropped before reaching the fleet view, by kind and reason"
                " (subject, decode, node-mismatch).",
                ["kind", "reason"],
                registry=reg,
            ),
            kv_writes=Counter(
                "nicfleet_kv_writes", "Successful KV writes, by bucket.", ["bucket"], registry=reg
            ),
            kv_write_errors=Counter(
                "nicfleet_kv_write_errors",
                "Failed KV writes, by bucket (nicfleet-nodes, nicfleet-config).",
                ["bucket"],
                registry=reg,
            ),
            nats_connected=Gauge(
                "nicfleet_nats_connected", "1 while connected to NATS.", registry=reg
            ),
            reconcile_seconds=Histogram(
                "nicfleet_reconcile_duration_seconds",
                "Time of one reconcile round (plan, statuses and, when leading, the writes).",
                buckets=RECONCILE_BUCKETS,
                registry=reg,
            ),
        )

    def reconcile_round(self, seconds: float, kv_errors: int) -> None:
        """One reconcile round took `seconds`; `kv_errors` config writes failed in it."""
        self.reconcile_seconds.observe(seconds)
        if kv_errors:
            self.kv_write_errors.labels(subjects.KV_CONFIG).inc(kv_errors)

    def watch_fleet(
        self,
        nodes: Callable[[], Mapping[str, int]],
        *,
        alerts: Callable[[], Iterable[Ruled]],
        findings: Callable[[], Iterable[Ruled]],
    ) -> None:
        """Export the scrape-time families of `FleetCollector` on this registry: `nodes`
        counts the nodes by state (every state present, zero when empty)."""
        self.registry.register(FleetCollector(nodes, alerts, findings))


@dataclass(frozen=True)
class HttpMetrics:
    """The HTTP server's bounds at work (aggregator.api.limits, aggregator.api.connections):
    open connections and requests in flight, and what each bound refused or closed."""

    connections: Gauge
    connections_closed: Counter
    in_flight: Gauge
    refused: Counter
    accept_errors: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> HttpMetrics:
        return cls(
            connections=Gauge(
                "nicfleet_api_connections",
                "Open HTTP API connections (bounded by --http-max-connections).",
                registry=registry,
            ),
            connections_closed=Counter(
                "nicfleet_api_connections_closed",
                "API connections the server closed itself, by reason (header-timeout: no"
                " complete request head in time; evicted: the oldest idle one, for a new"
                " connection over the bound; refused: over the bound with none idle).",
                ["reason"],
                registry=registry,
            ),
            in_flight=Gauge(
                "nicfleet_api_requests_in_flight",
                "API requests being handled now, SSE streams included.",
                registry=registry,
            ),
            refused=Counter(
                "nicfleet_api_requests_refused",
                "API requests answered 503 by a bound, by bound (in-flight, stream-clients).",
                ["bound"],
                registry=registry,
            ),
            accept_errors=Counter(
                "nicfleet_api_accept_errors",
                "accept() failures of the API listener, by errno (EMFILE: out of file"
                " descriptors); logged at most once per interval.",
                ["errno"],
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class JoinMetrics:
    """Agents joining NATS by ServiceAccount token through the auth callout
    (aggregator.bus.calloutservice): admissions, and refusals by reason."""

    joins: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> JoinMetrics:
        return cls(
            joins=Counter(
                "nicfleet_nats_joins",
                "Auth-callout answers to agents joining NATS, by outcome (admitted, refused)"
                " and reason (expired, wrong_audience, unauthenticated, not_agent, no_node,"
                " no_token, malformed, unavailable; empty when admitted).",
                ["outcome", "reason"],
                registry=registry,
            )
        )

    def record(self, outcome: str, reason: str) -> None:
        self.joins.labels(outcome, reason).inc()


class Ruled(Protocol):
    """A finding or an alert, as far as the by-rule gauges care."""

    @property
    def rule(self) -> str: ...

    @property
    def severity(self) -> str: ...


class FleetCollector(Collector):
    """Nodes by state, findings and firing alerts by rule and severity, at scrape time."""

    def __init__(
        self,
        nodes: Callable[[], Mapping[str, int]],
        alerts: Callable[[], Iterable[Ruled]],
        findings: Callable[[], Iterable[Ruled]],
    ) -> None:
        self._nodes, self._alerts, self._findings = nodes, alerts, findings

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are known only by collecting; nothing to check at register

    def collect(self) -> Iterator[Metric]:
        nodes = GaugeMetricFamily(
            "nicfleet_nodes",
            "Nodes known to the aggregator, by state (ready, stale, no-snapshot).",
            labels=["state"],
        )
        for state, count in sorted(self._nodes().items()):
            nodes.add_metric([state], count)
        yield nodes
        yield _by_rule(
            "nicfleet_alerts_firing",
            "Alerts firing now (leader only), by rule and severity.",
            ((a.rule, a.severity) for a in self._alerts()),
        )
        yield _by_rule(
            "nicfleet_findings",
            "Findings of the last rule evaluation, by rule and severity.",
            ((f.rule, f.severity) for f in self._findings()),
        )


def _by_rule(name: str, documentation: str, keys: Iterable[tuple[str, str]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["rule", "severity"])
    for (rule, severity), count in sorted(Tally(keys).items()):
        family.add_metric([rule, severity], count)
    return family
