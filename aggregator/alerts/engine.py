"""The alert engine: evaluates the rules when the fleet changes and on a periodic tick,
advances the lifecycle, persists the alert states and delivers the transitions.

Owns one TaskGroup (the evaluation loop, the Alertmanager sender, the Kubernetes Event
sender). Rules and lifecycle are pure; this module does the I/O around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from aggregator.alerts.alertmanager import AlertmanagerSink
from aggregator.alerts.delivery import Broker, publish_alert
from aggregator.alerts.lifecycle import (
    FLEET_NODE,
    OPEN,
    LifecycleSettings,
    RuleTiming,
    Step,
    Stepper,
    Tracked,
    holding,
)
from aggregator.alerts.metrics import AlertMetrics
from aggregator.alerts.store import AlertStore
from aggregator.cluster import ClusterView
from aggregator.errors import StoreError
from aggregator.fleet.changefeed import Subscription
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules.engine.registry import FLEET_RULES, cannot_judge
from aggregator.rules.finding import Finding
from proto.messages.alerts import Alert
from proto.policy import Policy

log = logging.getLogger(__name__)

# May be a coroutine function: a slow evaluation then awaits a worker thread, not the loop.
Evaluate = Callable[
    [Fleet, tuple[Policy, ...], ClusterView, float],
    Sequence[Finding] | Awaitable[Sequence[Finding]],
]
# Per-rule `for`/`clear` from the policies' `alerts` sections (absent rule: the default).
Timings = Callable[[tuple[Policy, ...]], Mapping[str, RuleTiming]]
# Node -> when this process could first have heard it, for the nodes it loaded from KV
# (aggregator.rules.descriptor.RuleInput.heard_since); replaced, never mutated.
HeardSince = Callable[[], Mapping[str, float]]
# (fleet view, rule, node, subject, evidence) -> why the rule cannot judge that open alert's
# subject now, or None (aggregator.rules.engine.registry.cannot_judge).
CannotJudge = Callable[[Mapping[str, NodeRecord], str, str, str, Mapping[str, str]], str | None]
EventType = Literal["Normal", "Warning"]


class EventSink(Protocol):
    """Creates a Kubernetes Event on a node (aggregator.kube.client implements it)."""

    async def create_event(
        self, *, node: str, reason: str, message: str, event_type: EventType
    ) -> None: ...


class NoClusterEvents:
    """The sink without a cluster: there is nowhere to put an Event."""

    async def create_event(
        self, *, node: str, reason: str, message: str, event_type: EventType
    ) -> None:
        return None


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    tick_s: float = 1.0  # re-evaluate at least this often (for durations, staleness)
    # A change re-evaluates at once, but no sooner than this after the previous cycle:
    # under load (thousands of messages/s) changes coalesce into at most 1/min_cycle_s
    # cycles/s instead of one per message, each paying its fixed O(fleet) costs. Adds at
    # most this to event→alert latency (target p99 < 1 s; a cycle itself takes well under
    # 0.1 s), nothing to an isolated change. 0: one cycle per wake-up.
    min_cycle_s: float = 0.1
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    event_queue: int = 256
    # After a start, alerts of nodes without a fresh snapshot are not resolved for this
    # long (the fleet rebuilt from KV may be older than what the alerts were raised on).
    # Those of a node loaded from KV and not heard from at all since are held longer:
    # until it is heard (`heard_since`). Fleet-level findings (peer rules: majorities,
    # versions seen) do not fire within it either: they are judged on the part of the
    # fleet heard so far, and a majority of the first nodes to report is no fact.
    startup_grace_s: float = 30.0


def _durable(state: Tracked | None) -> object:
    # Evidence and message change with every counter sample; persisting them each time
    # would turn KV into a counter log. They are refreshed by the first evaluation anyway.
    if state is None:
        return None
    a = state.alert
    return (state.phase, a.state, a.severity, a.starts_at, a.ends_at, state.pending_since,
            state.absent_since, state.fired_at, state.flapping)  # fmt: skip


class AlertEngine:
    def __init__(
        self,
        *,
        fleet: Fleet,
        changes: Subscription,
        evaluate: Evaluate,
        policies: Callable[[], tuple[Policy, ...]],
        cluster: Callable[[], ClusterView],
        settings: EngineSettings,
        metrics: AlertMetrics,
        broker: Broker,
        nc: NatsClient | None = None,
        store: AlertStore | None = None,
        alertmanager: AlertmanagerSink | None = None,
        events: EventSink | None = None,
        timings: Timings | None = None,
        clock: Callable[[], float] = time.time,
        is_leader: Callable[[], bool] = lambda: True,
        heard_since: HeardSince = dict,
        judge_gone: CannotJudge = cannot_judge,
    ) -> None:
        # Every replica evaluates and serves findings; only the leader runs the alert
        # lifecycle: notifies (NATS, SSE, Alertmanager, Events) and persists.
        self._is_leader = is_leader
        self.fleet = fleet
        self._changes = changes
        self._evaluate = evaluate
        self._policies = policies
        self._cluster = cluster
        self.settings = settings
        self.metrics = metrics
        self.broker = broker
        self._nc = nc
        self._store = store
        self.alertmanager = alertmanager
        self._events: EventSink = events if events is not None else NoClusterEvents()
        self._event_queue: asyncio.Queue[Alert] = asyncio.Queue(maxsize=settings.event_queue)
        self._timings = timings
        self._clock = clock
        self._heard_since = heard_since
        self._judge_gone = judge_gone
        # Nodes of `_heard_from` (that mapping) not heard from yet: only ever shrinks.
        self._heard_from: Mapping[str, float] | None = None
        self._unheard: set[str] = set()
        self.states: dict[str, Tracked] = {}
        self._stepper = Stepper()  # `step`, advancing only what changed or is due
        self.findings: tuple[Finding, ...] = ()
        self.evaluated_at: float | None = None
        self._started_at: float | None = None
        self._leading = False
        self._stop: asyncio.Event | None = None  # run()'s: abandons a long evaluation

    def load(self, states: dict[str, Tracked]) -> None:
        """Start from persisted states: firing alerts stay firing and are not re-sent."""
        self.states = dict(states)
        self.metrics.firing.set(sum(1 for s in states.values() if s.phase in OPEN))

    def firing(self) -> list[Alert]:
        """Open alerts: firing, and unknown (its rule cannot judge: not resolved either)."""
        return [s.alert for s in self.states.values() if s.phase in OPEN]

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._loop(stop))
                tasks.create_task(self._send_events(stop))
                if self.alertmanager is not None:
                    tasks.create_task(self.alertmanager.run(stop))
        finally:
            self._stop = None
            self.broker.close()

    async def _loop(self, stop: asyncio.Event) -> None:
        self._started_at = self._clock()
        last = time.monotonic()
        await self.cycle("start")
        next_tick = time.monotonic() + self.settings.tick_s
        while not stop.is_set():
            timeout = max(0.0, next_tick - time.monotonic())
            changed = await _first(stop, self._changes, timeout)
            if stop.is_set():
                break
            hold = last + self.settings.min_cycle_s - time.monotonic()
            if changed and hold > 0:
                # Coalesce: what changes meanwhile is evaluated by this very cycle (rules
                # read the live fleet), so its notifications are taken along.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), hold)
                if stop.is_set():
                    break
                await self._changes.wait(0)
            ticked = time.monotonic() >= next_tick
            if ticked:
                next_tick = time.monotonic() + self.settings.tick_s
            last = time.monotonic()
            await self.cycle("change" if changed else "tick")

    async def cycle(self, trigger: str) -> Step | None:
        """Evaluate, advance, deliver, persist. Never raises for a rule bug."""
        started = time.perf_counter()
        now = self._clock()
        policies = self._policies()
        try:
            evaluated = self._evaluate(self.fleet, policies, self._cluster(), now)
            if inspect.isawaitable(evaluated):
                done = await self._unless_stopped(evaluated)
                if done is None:
                    return None  # stopping: the evaluation was abandoned
                evaluated = done
            findings = tuple(evaluated)
        except Exception:
            # A rule bug must not stop alerting on everything else, nor resolve all alerts.
            log.exception("rule evaluation failed; keeping the previous findings")
            self.metrics.evaluate_errors.inc()
            return None
        self.findings = findings
        self.evaluated_at = now
        self.metrics.evaluations.labels(trigger).inc()
        self.metrics.findings.set(len(findings))
        leading = self._is_leader()
        if not leading:
            # A follower serves findings but leaves the alert lifecycle to the leader.
            self._leading = False
            return None
        if not self._leading and self._store is not None and self._started_at is not None:
            # Just took over: continue from what the previous leader persisted, so its
            # firing alerts are neither forgotten nor sent again.
            try:
                self.load(await self._store.load())
            except StoreError as exc:
                log.warning("cannot load alert states at takeover: %s; retrying", exc)
                self.metrics.store_errors.inc()
                return None  # still not leading: the next cycle retries the load
        self._leading = True
        lifecycle = self.settings.lifecycle
        if self._timings is not None:
            lifecycle = replace(lifecycle, timings=self._timings(policies))
        lifecycle = self._while_starting(lifecycle, now)
        view = self.fleet.view()

        def unjudged(alert: Alert) -> str | None:
            return self._judge_gone(view, alert.rule, alert.node, alert.subject, alert.evidence)

        result = self._stepper.step(
            self.states, findings, now, lifecycle, held=self._held(now), unjudged=unjudged
        )
        old = self.states
        self.states = result.states
        self.metrics.firing.set(sum(1 for s in result.states.values() if s.phase in OPEN))
        await self._deliver(result.transitions)
        self.metrics.evaluation_seconds.observe(time.perf_counter() - started)
        if self._store is not None:
            durable = {
                k for k in result.changed if _durable(old.get(k)) != _durable(result.states[k])
            }
            _, failures = await self._store.save(result.states, durable, result.removed)
            if failures:
                self.metrics.store_errors.inc(failures)
        return result

    async def _unless_stopped(
        self, evaluation: Awaitable[Sequence[Finding]]
    ) -> Sequence[Finding] | None:
        """The evaluation's findings, or None when the engine stops first (cancelled)."""
        task = asyncio.ensure_future(evaluation)
        if self._stop is None:
            return await task
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return None if task.cancelled() else task.result()

    def _while_starting(self, lifecycle: LifecycleSettings, now: float) -> LifecycleSettings:
        """Within the startup grace, fleet-level rules' `for` lasts at least until it
        ends: a finding that holds fires then, one of a partial fleet is never sent."""
        started = self._started_at
        if started is None or now - started >= self.settings.startup_grace_s:
            return lifecycle
        # `for` counts from when a finding appeared, never before the start.
        return holding(lifecycle, FLEET_RULES, self.settings.startup_grace_s)

    def _held(self, now: float) -> frozenset[str]:
        unheard = self._not_heard_yet()
        started = self._started_at
        if started is None or now - started >= self.settings.startup_grace_s:
            return unheard
        # Counter batches and events do not restate port states; only a snapshot does.
        return unheard | frozenset(
            name
            for name, record in self.fleet.view().items()
            if record.snapshot_received_at is None or record.snapshot_received_at < started
        )

    def _not_heard_yet(self) -> frozenset[str]:
        """Nodes loaded from KV that sent nothing since this process could hear them:
        what is known of them is an earlier process's, so none of their alerts resolves
        (agent-stale reports them once its limit has passed since `heard_since`)."""
        heard = self._heard_since()
        if heard is not self._heard_from:
            self._heard_from, self._unheard = heard, set(heard)
        if not self._unheard:
            return frozenset()
        view = self.fleet.view()
        self._unheard = {
            name
            for name in self._unheard
            if (record := view.get(name)) is not None and record.last_seen < heard[name]
        }
        return frozenset(self._unheard)

    async def _deliver(self, transitions: tuple[Alert, ...]) -> None:
        if not transitions:
            return
        for alert in transitions:
            self.metrics.transitions.labels(alert.state).inc()
            fields = {"rule": alert.rule, "node": alert.node, "severity": alert.severity}
            log.info("alert %s: %s %s", alert.state, alert.subject, alert.message, extra=fields)
            if self._nc is not None:
                try:
                    await publish_alert(self._nc, alert)
                except (NatsError, OSError, TimeoutError) as exc:
                    self.metrics.publish_errors.inc()
                    log.warning(
                        "publishing alert %s failed: %s", alert.fingerprint, exc, extra=fields
                    )
            if alert.severity == "critical" and alert.node != FLEET_NODE:
                try:
                    self._event_queue.put_nowait(alert)
                except asyncio.QueueFull:
                    self.metrics.events.labels("dropped").inc()
        self.broker.publish(transitions)
        if self.alertmanager is not None:
            self.alertmanager.submit(list(transitions))

    async def _send_events(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            getter = asyncio.ensure_future(self._event_queue.get())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                if not getter.done():
                    getter.cancel()
            if not getter.done() or getter.cancelled():
                continue
            alert = getter.result()
            firing = alert.state == "firing"
            try:
                await self._events.create_event(
                    node=alert.node,
                    reason="NicfleetAlertFiring" if firing else "NicfleetAlertResolved",
                    message=f"[{alert.rule}] {alert.subject}: {alert.message}",
                    event_type="Warning" if firing else "Normal",
                )
            except Exception as exc:
                self.metrics.events.labels("failed").inc()
                log.warning(
                    "Kubernetes Event for alert %s failed: %s",
                    alert.fingerprint,
                    exc,
                    extra={"rule": alert.rule, "node": alert.node},
                )
            else:
                self.metrics.events.labels("ok").inc()


async def _first(stop: asyncio.Event, changes: Subscription, timeout: float) -> bool:
    """Wait for a fleet change, stop or the timeout; True when nodes changed."""
    waiter = asyncio.ensure_future(changes.wait(timeout))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    if waiter.cancelled() or not waiter.done():
        return False
    nodes, _ = waiter.result()
    return bool(nodes)
