"""Assemble the alert engine for the aggregator process: KV bucket, persisted states,
broker, optional Alertmanager sender, and the rule evaluation it runs.

Only wiring; the parts live in their own modules. `AllRules` runs every rule of
`aggregator.rules.engine.registry` (incrementally) with the policies' `alerts` thresholds/timings;
a full recomputation runs in a worker thread so that ingest and the API keep going.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from aggregator.alerts.alertmanager import AlertmanagerSettings, AlertmanagerSink
from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import (
    AlertEngine,
    EngineSettings,
    Evaluate,
    EventSink,
    EventType,
    HeardSince,
    Timings,
)
from aggregator.alerts.lifecycle import RuleTiming
from aggregator.alerts.metrics import AlertMetrics
from aggregator.alerts.store import AlertStore, load_states
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.changefeed import Subscription
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.fleet.store import open_bucket
from aggregator.kube.client import KubeClient
from aggregator.rules.descriptor import NOT_LOADED
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.finding import Finding
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, Thresholds, thresholds_for
from proto import subjects
from proto.policy import Policy


class NodeEvents:
    """The EventSink of a cluster: alert Events on the Node object (aggregator.kube.client)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def create_event(
        self, *, node: str, reason: str, message: str, event_type: EventType
    ) -> None:
        await self._client.create_event(
            kind="Node", name=node, reason=reason, message=message, type=event_type
        )


# Changed nodes an evaluation may recompute on the event loop (well under 1 ms each); more
# (after a burst, or agents' 1 s counter batches at thousands of nodes) go to a thread.
MAX_ON_LOOP: Final = 100


class AllRules:
    """The real rule set; thresholds and timings parsed once per policy tuple.
    `heard_since`: the rules' `RuleInput.heard_since` now (replaced, never mutated: a
    worker thread may read it)."""

    def __init__(
        self,
        extra: Callable[[], Sequence[Finding]] | None = None,
        *,
        heard_since: HeardSince = lambda: NOT_LOADED,
    ) -> None:
        self._extra = extra  # findings computed elsewhere (e.g. the NicClusterPolicy audit)
        self._heard_since = heard_since
        self._policies: tuple[Policy, ...] | None = None
        self._thresholds: tuple[Thresholds, tuple[Finding, ...]] = (DEFAULT_THRESHOLDS, ())
        # Same findings as registry.evaluate, re-run only for nodes changed since the last
        # call (and time rules on every tick); policies/cluster/thresholds changing: all.
        self._incremental = IncrementalRules()
        self._worker: asyncio.Future[list[Finding]] | None = None  # a full evaluation in a thread

    def _parsed(self, policies: tuple[Policy, ...]) -> tuple[Thresholds, tuple[Finding, ...]]:
        if policies is not self._policies:
            self._policies = policies
            self._thresholds = thresholds_for(policies)
        return self._thresholds

    def evaluate(
        self, fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        thresholds, problems = self._parsed(policies)
        found = self._incremental.evaluate(
            fleet.view(), policies, cluster, now, thresholds=thresholds,
            heard_since=self._heard_since(),
        )  # fmt: skip
        extra = self._extra() if self._extra is not None else ()
        return [*problems, *found, *extra]

    @property
    def full_evaluation_running(self) -> bool:
        """Whether an evaluation runs in the worker thread right now."""
        return self._worker is not None and not self._worker.done()

    async def evaluate_async(
        self, fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        """`evaluate`, except that a full recomputation (first call, new policies, cluster
        labels or thresholds) or one of more than MAX_ON_LOOP changed nodes runs in a
        worker thread, over a copy of the fleet's (immutable) records, while the event loop
        keeps ingesting: its findings are exactly those of the fleet when the copy was
        taken; the next call catches up with what changed meanwhile. (A subclass that
        overrides `evaluate` must override this too.)"""
        if self._worker is not None:  # an abandoned one still finishing its current rule
            with contextlib.suppress(Exception):
                await asyncio.shield(self._worker)
            self._worker = None
        thresholds, problems = self._parsed(policies)
        incremental = self._incremental
        # A cheap copy: ingest replaces records, never mutates them. A proxy's own copy is
        # the dict's C copy (30 µs at 10,000 nodes; dict(proxy) goes key by key: 1 ms).
        view = fleet.view()
        records = view.copy() if isinstance(view, MappingProxyType) else dict(view)
        if (
            not incremental.starts_over(policies, cluster, thresholds)
            and incremental.pending(records) <= MAX_ON_LOOP
        ):
            return self.evaluate(fleet, policies, cluster, now)
        found = await self._in_thread(records, policies, cluster, now, thresholds)
        extra = self._extra() if self._extra is not None else ()
        return [*problems, *found, *extra]

    async def _in_thread(
        self,
        records: Mapping[str, NodeRecord],
        policies: tuple[Policy, ...],
        cluster: ClusterView,
        now: float,
        thresholds: Thresholds,
    ) -> list[Finding]:
        abandon = threading.Event()
        worker: asyncio.Future[list[Finding]] = asyncio.ensure_future(
            asyncio.to_thread(
                self._incremental.evaluate,
                records,
                policies,
                cluster,
                now,
                thresholds=thresholds,
                heard_since=self._heard_since(),
                abandon=abandon.is_set,
            )
        )
        worker.add_done_callback(_retrieve)
        self._worker = worker
        try:
            found = await asyncio.shield(worker)
        except asyncio.CancelledError:
            abandon.set()  # the thread stops at its next rule; the next call waits
            raise
        self._worker = None
        return found

    def timings(self, policies: tuple[Policy, ...]) -> Mapping[str, RuleTiming]:
        thresholds, _ = self._parsed(policies)
        return {
            rule: RuleTiming(for_s=s.for_s, clear_s=s.resolve_s)
            for rule, s in thresholds.rules.items()
        }


def _retrieve(done: asyncio.Future[list[Finding]]) -> None:
    """Mark an abandoned worker's outcome as seen (its exception is expected)."""
    if not done.cancelled():
        done.exception()


@dataclass(frozen=True, kw_only=True)
class AlertWiring:
    engine: EngineSettings = field(default_factory=EngineSettings)
    alertmanager: AlertmanagerSettings | None = None


async def open_alert_engine(
    *,
    nc: NatsClient,
    fleet: Fleet,
    changes: Subscription,
    policies: Callable[[], tuple[Policy, ...]],
    cluster: Callable[[], ClusterView] = lambda: NO_CLUSTER,
    registry: CollectorRegistry,
    clock: Callable[[], float],
    wiring: AlertWiring,
    evaluate: Evaluate | None = None,
    timings: Timings | None = None,
    events: EventSink | None = None,
    extra_findings: Callable[[], Sequence[Finding]] | None = None,
    is_leader: Callable[[], bool] = lambda: True,
    heard_since: HeardSince = lambda: NOT_LOADED,
) -> AlertEngine:
    """The engine with its persisted states loaded (firing alerts are not re-sent).

    Without `evaluate`, every rule runs with the policies' thresholds and timings.
    `heard_since`: when this process could first hear each node it loaded from KV (the
    rules' input, and the engine holds those nodes' alerts until they are heard).
    """
    if evaluate is None:
        rules = AllRules(extra_findings, heard_since=heard_since)
        evaluate, timings = rules.evaluate_async, timings or rules.timings
    kv = await open_bucket(nc.jetstream(), subjects.KV_ALERTS)
    metrics = AlertMetrics.create(registry)
    # Event ids start at the wall clock in ms so that they keep increasing across restarts
    # (a resumed id from an earlier process is then older than the ring: full resync).
    broker = Broker(first_id=int(clock() * 1000), on_drop=metrics.stream_dropped.inc)
    engine: AlertEngine
    sink = None
    if wiring.alertmanager is not None:
        sink = AlertmanagerSink(
            wiring.alertmanager,
            firing=lambda: engine.firing() if is_leader() else [],
            metrics=metrics,
            clock=clock,
        )
    engine = AlertEngine(
        fleet=fleet,
        changes=changes,
        evaluate=evaluate,
        policies=policies,
        cluster=cluster,
        is_leader=is_leader,
        settings=wiring.engine,
        metrics=metrics,
        broker=broker,
        nc=nc,
        store=AlertStore(kv),
        alertmanager=sink,
        events=events,
        timings=timings,
        clock=clock,
        heard_since=heard_since,
    )
    engine.load(await load_states(kv))
    return engine
