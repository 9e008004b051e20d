"""The alert lifecycle of a sharded replica (docs/scaling.md, "Writes"): run for the nodes
of the held partitions, and by the leader for fleet-level findings; a key is persisted only
by its owner. On a scope change the engine pauses a cycle and reloads the scope from KV, so
taken-over firing alerts continue (not re-sent), kept until the node is heard from again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from prometheus_client import CollectorRegistry

from aggregator.alerts.alertmanager import AlertmanagerSink
from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EventSink, HeardSince, Timings
from aggregator.alerts.lifecycle import FLEET_NODE, Tracked
from aggregator.alerts.metrics import AlertMetrics
from aggregator.alerts.store import AlertStore
from aggregator.alerts.wiring import AlertWiring
from aggregator.cluster import ClusterView
from aggregator.errors import StoreError
from aggregator.fleet.changefeed import Subscription
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import open_bucket
from aggregator.kv import bucket_keys
from aggregator.rules.finding import Finding
from proto import subjects
from proto.codec import CodecError, decode
from proto.messages.alerts import Alert
from proto.policy import Policy

log = logging.getLogger(__name__)

Scope = tuple[frozenset[int], bool]  # (partitions held, leading)
States = dict[str, Tracked]
SyncEvaluate = Callable[[Fleet, tuple[Policy, ...], ClusterView, float], Sequence[Finding]]
AsyncEvaluate = Callable[
    [Fleet, tuple[Policy, ...], ClusterView, float], Awaitable[Sequence[Finding]]
]


class AlertScope:
    """Which alert keys this replica owns: nodes of the held partitions, plus fleet-level
    ones (`_fleet`) while it leads. One scope is read per engine cycle (at evaluation) and
    used for the filter, the pause decision and the reload alike."""

    def __init__(
        self,
        partitions: int,
        held: Callable[[], frozenset[int]],
        leading: Callable[[], bool],
        *,
        clock: Callable[[], float],
        grace_s: float = 30.0,
    ) -> None:
        self._count, self._held, self._leading = partitions, held, leading
        self._clock, self._grace_s = clock, grace_s
        self._cycle: Scope | None = None  # read by this cycle's evaluation
        self._loaded: Scope | None = None  # the scope the engine's states are (to be) for
        self._reload_due = False  # the engine reloads its states in the next stepping cycle
        self._prefetched: States | None = None  # what that reload returns
        self._taken_at: dict[int | None, float] = {}  # partition (None: leadership) -> since
        self.states: Callable[[], Mapping[str, Tracked]] = dict  # the engine's, once wired
        self.loader: Callable[[Scope], Awaitable[States]] | None = None  # the store's
        # Everything the last evaluation found, owned or not (`/api/v1/shards`): fleet-level
        # findings are computed by every replica alike, only the leader alerts on them.
        self.computed: tuple[Finding, ...] = ()
        self.reloads = 0

    def current(self) -> Scope:
        return self._held(), self._leading()

    @property
    def loaded(self) -> Scope:
        return self._loaded if self._loaded is not None else self.current()

    def owns(self, node: str | None, scope: Scope | None = None) -> bool:
        held, leading = scope if scope is not None else self.current()
        if node is None or node == FLEET_NODE:
            return leading
        try:
            token = subjects.node_token(node)
        except ValueError:
            return leading  # not a node name: fleet-level
        return subjects.partition_of(token, self._count) in held

    def engine_may_step(self) -> bool:
        """The engine's `is_leader`: False for one cycle after the scope changed, so the
        next cycle reloads the states of the new scope (AlertEngine does it on takeover)."""
        scope = self._cycle if self._cycle is not None else self.current()
        if scope == self._loaded:
            return True
        before = self._loaded or (frozenset(), False)
        at = self._clock()
        for partition in scope[0] - before[0]:
            self._taken_at[partition] = at
        if scope[1] and not before[1]:
            self._taken_at[None] = at
        self._loaded, self._reload_due, self._prefetched = scope, True, None
        self.reloads += 1
        return False

    def take_prefetched(self) -> States | None:
        """The states of the reload in progress (once), when the evaluation fetched them."""
        prefetched, self._prefetched = self._prefetched, None
        return prefetched

    def reloaded(self) -> None:
        self._reload_due = False

    def _in_grace(self, node: str, fleet: Fleet, now: float) -> bool:
        """A taken-over node not heard from since (snapshot and counters), within grace."""
        if node == FLEET_NODE:
            taken = self._taken_at.get(None)
            return taken is not None and now - taken < self._grace_s
        taken = self._taken_at.get(subjects.partition_of(subjects.node_token(node), self._count))
        if taken is None or now - taken >= self._grace_s:
            return False
        record = fleet.get(node)
        fresh = (
            record is not None
            and (record.snapshot_received_at or 0.0) >= taken
            and (record.counters_received_at or 0.0) >= taken
        )
        return not fresh

    def evaluate(self, inner: SyncEvaluate) -> AsyncEvaluate:
        """`inner` with the findings this replica does not own left out, and the firing
        alerts of taken-over nodes kept while they are in grace."""

        async def evaluate(
            fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
        ) -> Sequence[Finding]:
            scope = self._cycle = self.current()
            states: Mapping[str, Tracked] = self.states()
            if scope == self._loaded and self._reload_due and self.loader is not None:
                # The engine loads these states after this evaluation: judge grace on them.
                try:
                    self._prefetched = await self.loader(scope)
                    states = self._prefetched
                except StoreError as exc:
                    log.warning("cannot prefetch alert states: %s (the engine retries)", exc)
            self.computed = tuple(inner(fleet, policies, cluster, now))
            found = [f for f in self.computed if self.owns(f.node, scope)]
            seen = {(f.rule, f.node or FLEET_NODE, f.subject) for f in found}
            for state in states.values():
                a = state.alert
                if state.phase != "firing" or (a.rule, a.node, a.subject) in seen:
                    continue
                if self.owns(a.node, scope) and self._in_grace(a.node, fleet, now):
                    found.append(_kept(a))  # not heard from since the takeover: keep firing
            return found

        return evaluate


def _kept(alert: Alert) -> Finding:
    node = None if alert.node == FLEET_NODE else alert.node
    return Finding(
        rule=alert.rule,
        severity=alert.severity,
        node=node,
        subject=alert.subject,
        message=alert.message,
        evidence=dict(alert.evidence),
    )


async def read_states(
    js: JetStreamContext, kv: KeyValue, bucket: str = subjects.KV_ALERTS, *, timeout: float = 30.0
) -> States:
    """Every decodable state in the bucket, read whole while other replicas write to it
    (aggregator.kv; `load_states` lists keys, which misses some: a missed firing alert
    would fire again)."""
    pending = await bucket_keys(js, bucket)
    if not pending:
        return {}
    try:
        watcher = await kv.watchall()
    except (TimeoutError, NatsError, JetStreamError) as exc:
        raise StoreError(f"cannot read the alerts bucket: {exc}") from exc
    states: States = {}
    try:
        while pending:
            try:
                entry = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
            except (TimeoutError, NatsError) as exc:
                raise StoreError(f"alerts bucket read stalled ({len(pending)} keys left)") from exc
            if entry is None:
                continue  # nats-py's end-of-initial-values marker: the keys decide
            pending.discard(entry.key)
            if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                states.pop(entry.key, None)
                continue
            try:
                state = decode(entry.value, Tracked)
            except CodecError as exc:
                log.warning("skipping undecodable alert state %s: %s", entry.key, exc)
                continue
            if state.alert.fingerprint == entry.key:
                states[entry.key] = state
        return states
    finally:
        with contextlib.suppress(TimeoutError, NatsError, JetStreamError, OSError):
            await watcher.stop()  # type: ignore[no-untyped-call]


class ScopedAlertStore(AlertStore):
    """`AlertStore` whose `load` returns only the states of the scope being loaded."""

    def __init__(
        self,
        js: JetStreamContext,
        kv: KeyValue,
        scope: AlertScope,
        bucket: str = subjects.KV_ALERTS,
    ) -> None:
        super().__init__(kv)
        self._js, self._bucket, self._name, self._scope = js, kv, bucket, scope
        scope.loader = self.load_for

    async def load_for(self, scope: Scope) -> States:
        states = await read_states(self._js, self._bucket, self._name)
        return {k: s for k, s in states.items() if self._scope.owns(s.alert.node, scope)}

    async def load(self) -> States:
        states = self._scope.take_prefetched()
        if states is None:
            states = await self.load_for(self._scope.loaded)
        self._scope.reloaded()
        return states


async def open_sharded_alert_engine(
    *,
    nc: NatsClient,
    fleet: Fleet,
    changes: Subscription,
    policies: Callable[[], tuple[Policy, ...]],
    cluster: Callable[[], ClusterView],
    registry: CollectorRegistry,
    clock: Callable[[], float],
    wiring: AlertWiring,
    evaluate: SyncEvaluate,
    timings: Timings | None,
    scope: AlertScope,
    events: EventSink | None = None,
    heard_since: HeardSince = dict,
) -> AlertEngine:
    """`open_alert_engine`'s wiring with the scoped store and evaluation (no state is
    loaded here: the first cycle pauses, the second loads the scope)."""
    kv = await open_bucket(nc.jetstream(), subjects.KV_ALERTS)
    metrics = AlertMetrics.create(registry)
    broker = Broker(first_id=int(clock() * 1000), on_drop=metrics.stream_dropped.inc)
    engine: AlertEngine
    sink = None
    if wiring.alertmanager is not None:  # re-sends this replica's firing alerts only
        sink = AlertmanagerSink(
            wiring.alertmanager, firing=lambda: engine.firing(), metrics=metrics, clock=clock
        )
    engine = AlertEngine(
        fleet=fleet,
        changes=changes,
        evaluate=scope.evaluate(evaluate),
        policies=policies,
        cluster=cluster,
        is_leader=scope.engine_may_step,
        settings=wiring.engine,
        metrics=metrics,
        broker=broker,
        nc=nc,
        store=ScopedAlertStore(nc.jetstream(), kv, scope),
        alertmanager=sink,
        events=events,
        timings=timings,
        clock=clock,
        heard_since=heard_since,
    )
    scope.states = lambda: engine.states
    return engine
