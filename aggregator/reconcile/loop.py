"""The reconcile loop: re-plans on fleet changes, policy changes and a periodic tick,
applies the plan when this replica leads, and keeps the latest report for the API.

`Reconciler.latest()` is what `/api/v1/policy` serves (shape in docs/reconcile.md).
Followers plan and compute statuses too (all replicas serve reads) but write nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.errors import StoreError
from aggregator.fleet.changefeed import Subscription
from aggregator.fleet.state import Fleet
from aggregator.reconcile.apply import ConfigStore, KubeApplier, KubeWriter
from aggregator.reconcile.plan import EMPTY_PLAN, Conflict, Plan, plan
from aggregator.reconcile.policies import PolicySet, PolicySource
from aggregator.reconcile.status import (
    NodeStatus,
    PolicyStatus,
    invalid_status,
    policy_status,
    status_changes,
)
from proto.messages.config import DesiredConfig
from proto.policy import Policy

log = logging.getLogger(__name__)
# Counter batches change nothing a plan or a status reads; every other kind may.
_QUIET_KINDS = frozenset({"counters"})


@dataclass(frozen=True, kw_only=True)
class ReconcileSettings:
    stale_after: float = 30.0
    tick: float = 5.0  # re-plan at least this often (staleness, missed changes)
    # Fleet changes re-plan at most this often; a policy change re-plans at once. 10,000
    # status messages after a fan-out otherwise re-planned 10,000 nodes back to back.
    settle: float = 0.5


class NodePlan(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    policy: str | None  # None: in conflict
    conflict: tuple[str, ...] = ()
    desired: DesiredConfig | None = None
    status: NodeStatus | None = None


class ReconcileReport(msgspec.Struct, frozen=True, kw_only=True):
    at: float  # unix seconds of this reconcile
    leader: bool
    policy_version: int
    policies: tuple[Policy, ...] = ()  # effective (the last good version)
    statuses: tuple[PolicyStatus, ...] = ()
    nodes: tuple[NodePlan, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    errors: tuple[str, ...] = ()  # policy-document errors, then failed writes


class RoundObserver(Protocol):
    def reconcile_round(self, seconds: float, kv_errors: int) -> None: ...


class Reconciler:
    def __init__(
        self,
        settings: ReconcileSettings,
        *,
        fleet: Fleet,
        changes: Subscription,
        policies: PolicySource,
        store: ConfigStore | None,
        kube: KubeWriter | None = None,
        cluster: Callable[[], ClusterView] = lambda: NO_CLUSTER,
        is_leader: Callable[[], bool] = lambda: True,
        observed_generation: Callable[[str], int | None] = lambda _name: None,
        clock: Callable[[], float] = time.time,
        observer: RoundObserver | None = None,  # round duration, failed KV writes (metrics)
    ) -> None:
        self.settings = settings
        self._observer = observer
        self._fleet = fleet
        self._changes = changes
        self._policies = policies
        self._store = store
        self._kube = KubeApplier(kube) if kube is not None else None
        self._cluster = cluster
        self._is_leader = is_leader
        self._observed_generation = observed_generation
        self._clock = clock
        self._plan: Plan = EMPTY_PLAN
        self._statuses: dict[str, PolicyStatus] = {}
        self._leading = False
        self._known: set[str] = set()
        changes.ignore(_QUIET_KINDS, self._known)  # counters of a known node change no plan
        self._latest = ReconcileReport(at=0.0, leader=False, policy_version=0)
        self.rounds = 0
        self._round_started = 0.0  # time.monotonic() of the last round's start
        self.updated = asyncio.Event()  # set after every reconcile (tests, benchmarks)

    def latest(self) -> ReconcileReport:
        return self._latest

    def plan(self) -> Plan:
        return self._plan

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.reconcile_once()
            await self._wait(stop)

    async def _wait(self, stop: asyncio.Event) -> None:
        deadline = time.monotonic() + self.settings.tick
        due = False  # a fleet change waits for `settle` to pass; the feed is not read meanwhile
        while not stop.is_set():
            waits: set[asyncio.Future[Any]] = {
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self._policies.changed.wait()),
            }
            feed = None if due else asyncio.ensure_future(self._changes.wait(self.settings.tick))
            if feed is not None:
                waits.add(feed)
            try:
                remaining = max(0.0, deadline - time.monotonic())
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            if self._policies.changed.is_set() or time.monotonic() >= deadline:
                return
            if feed is None or not feed.done() or feed.cancelled() or feed.exception():
                continue
            nodes, kinds = feed.result()
            if kinds - _QUIET_KINDS or nodes - self._known:
                due = True
                deadline = min(deadline, self._round_started + self.settings.settle)
                if time.monotonic() >= deadline:
                    return

    async def reconcile_once(self) -> ReconcileReport:
        started = time.perf_counter()
        self._round_started = time.monotonic()
        kv_errors = 0
        self._policies.refresh()
        self._policies.changed.clear()
        current = self._policies.current()
        cluster = self._cluster()
        leader = self._is_leader()
        errors = [*current.errors, *current.policy_errors.values()]
        if leader and self._store is not None and not self._leading:
            try:
                await self._store.load()  # what the previous leader left in force
            except StoreError as exc:
                # Not knowing what is in force, lead nothing this round; the next tick retries.
                log.warning("leader, but the stored configs are unreadable: %s", exc)
                leader = False
                kv_errors += 1
            else:
                self._plan = msgspec.structs.replace(self._plan, desired=dict(self._store.stored))
        self._leading = leader
        previous = self._plan
        if leader and self._store is not None:
            previous = msgspec.structs.replace(previous, desired=dict(self._store.stored))
        fleet = self._fleet.view()
        self._known = set(fleet)
        self._changes.ignore(_QUIET_KINDS, self._known)
        new = plan(current.policies, fleet, cluster, previous=previous)
        now = self._clock()
        statuses = {
            p.metadata.name: policy_status(
                p,
                new,
                fleet,
                cluster,
                now=now,
                stale_after=self.settings.stale_after,
                errors=_errors_of(p.metadata.name, current),
            )
            for p in current.policies
        }
        for name, error in current.policy_errors.items():
            statuses.setdefault(name, invalid_status(name, error))
        changes = [c for n, s in statuses.items() for c in status_changes(self._statuses.get(n), s)]
        if leader:
            if self._store is not None and new.actions:
                failed = await self._store.apply(new.actions)
                kv_errors, errors = len(failed), errors + failed
                log.info("reconcile: %d config actions", len(new.actions))
            if self._kube is not None:
                stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                errors += await self._kube.apply(
                    list(statuses.values()),
                    changes,
                    fleet,
                    cluster,
                    now=stamp,
                    observed_generation=self._observed_generation,
                )
        self._plan, self._statuses = new, statuses
        self._latest = _report(
            new, statuses, current.policies, current.version, leader, now, errors
        )
        self.rounds += 1
        if self._observer is not None:
            self._observer.reconcile_round(time.perf_counter() - started, kv_errors)
        self.updated.set()
        return self._latest


def _errors_of(name: str, current: PolicySet) -> tuple[str, ...]:
    own = current.policy_errors.get(name)
    return (*current.errors, own) if own is not None else current.errors


def _report(
    new: Plan,
    statuses: dict[str, PolicyStatus],
    policies: tuple[Policy, ...],
    version: int,
    leader: bool,
    now: float,
    errors: list[str],
) -> ReconcileReport:
    node_status = {s.node: s for st in statuses.values() for s in st.nodes}
    conflicted = {c.node: c.policies for c in new.conflicts}
    nodes = sorted(new.assignments.keys() | conflicted.keys())
    return ReconcileReport(
        at=now,
        leader=leader,
        policy_version=version,
        policies=policies,
        statuses=tuple(statuses.values()),
        nodes=tuple(
            NodePlan(
                node=n,
                policy=new.assignments.get(n),
                conflict=conflicted.get(n, ()),
                desired=new.desired.get(n),
                status=node_status.get(n),
            )
            for n in nodes
        ),
        conflicts=new.conflicts,
        errors=tuple(errors),
    )
