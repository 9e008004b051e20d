"""Leader election among aggregator replicas (one writes, all serve reads): one algorithm
over two lease stores, a Kubernetes Lease (via aggregator.kube.client) or a NATS KV key. As in
client-go, a follower judges expiry by its own monotonic clock (the record unchanged for a
whole TTL), so no synchronized clocks are needed; a leader that cannot renew steps down
before anyone may take over, and a clean stop releases the lease at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

import msgspec
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import (
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from aggregator.errors import AggregatorError, StoreError
from aggregator.fleet.store import open_bucket
from aggregator.kube.client import KubeClient
from aggregator.kube.objects import LeaseRecord

log = logging.getLogger(__name__)

LEADER_BUCKET: Final = "nicfleet-leader"
LEADER_KEY: Final = "leader"
LEASE_NAME: Final = "nicfleet-aggregator"

Decision = Literal["create", "renew", "take", "wait"]


@dataclass(frozen=True, kw_only=True)
class LeaderSettings:
    identity: str  # unique per replica: pod name, or host:pid
    ttl_s: float = 10.0  # a lease unchanged this long is free
    renew_every_s: float = 3.0
    retry_every_s: float = 1.0  # how often a follower looks; fail-over <= ttl + 2 x this


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    """The lease as last read: who holds it, a stamp that changes on every renew, and the
    store's revision for the conditional write."""

    holder: str  # "" when released
    stamp: str
    revision: object = None


class LeaseStore(Protocol):
    async def read(self) -> Observed | None: ...
    async def create(self, holder: str) -> bool: ...
    async def write(self, holder: str, observed: Observed) -> bool: ...


def decide(observed: Observed | None, me: str, unchanged_for: float | None, ttl: float) -> Decision:
    """What to do with the lease as read (pure). `unchanged_for`: seconds this replica has
    seen the same stamp (None: first sight)."""
    if observed is None:
        return "create"
    if observed.holder == me:
        return "renew"
    if not observed.holder:
        return "take"
    if unchanged_for is not None and unchanged_for >= ttl:
        return "take"
    return "wait"


class LeaderElector:
    """`run(stop)` campaigns until stop; `is_leader`, `leading` and `on_change` report it."""

    def __init__(
        self,
        store: LeaseStore,
        settings: LeaderSettings,
        *,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._on_change = on_change
        self.leading = asyncio.Event()  # set while this replica leads
        self._seen: tuple[str, float] | None = None  # (stamp, monotonic time first seen)
        self._renewed_at: float | None = None

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    @property
    def identity(self) -> str:
        return self._settings.identity

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and renew until `stop`; then release if leading. Cancelling the task
        instead is a crash: nothing is released and the lease expires after the TTL."""
        loop = asyncio.get_running_loop()
        settings = self._settings
        while not stop.is_set():
            try:
                # Bounded: a store that hangs must not keep a leader past its deadline.
                async with asyncio.timeout(settings.renew_every_s):
                    observed = await self._store.read()
                    now = loop.time()
                    if observed is not None and (
                        self._seen is None or self._seen[0] != observed.stamp
                    ):
                        self._seen = (observed.stamp, now)
                    unchanged = None if self._seen is None else now - self._seen[1]
                    decision = decide(observed, settings.identity, unchanged, settings.ttl_s)
                    won = await self._act(decision, observed)
                if won:
                    self._renewed_at = loop.time()
                self._set(won)
            except (AggregatorError, TimeoutError) as exc:
                log.warning("leader election (%s): %s", settings.identity, exc or "timed out")
            # Step down before a follower may take over: it waits a whole TTL.
            deadline = settings.ttl_s - settings.renew_every_s
            renewed_at = self._renewed_at
            if self.is_leader and renewed_at is not None and loop.time() - renewed_at > deadline:
                log.warning("%s could not renew the lease; stepping down", settings.identity)
                self._set(False)
            pause = settings.renew_every_s if self.is_leader else settings.retry_every_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
        await self._release()

    async def _act(self, decision: Decision, observed: Observed | None) -> bool:
        me = self._settings.identity
        if decision == "create":
            return await self._store.create(me)
        if decision in ("renew", "take") and observed is not None:
            if decision == "take":
                log.info("%s takes the lease from %r", me, observed.holder)
            return await self._store.write(me, observed)
        return False

    async def _release(self) -> None:
        if not self.is_leader:
            return
        self._set(False)
        try:
            async with asyncio.timeout(self._settings.renew_every_s):
                observed = await self._store.read()
                if observed is not None and observed.holder == self._settings.identity:
                    await self._store.write("", observed)
        except (AggregatorError, TimeoutError) as exc:
            log.warning("releasing the lease: %s (it expires after the TTL)", exc)

    def _set(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        if leading:
            self.leading.set()
        else:
            self.leading.clear()
        log.info("%s is %s", self._settings.identity, "the leader" if leading else "a follower")
        if self._on_change is not None:
            self._on_change(leading)


class NatsLease:
    """The lease as one key of a JetStream KV bucket: create when absent, update at the
    revision read (compare-and-set). Value: JSON {holder, renewedAt, expiresAt} — the times
    are for humans (`nats kv get`); decisions use the revision and the local clock."""

    def __init__(self, kv: KeyValue, ttl_s: float, key: str = LEADER_KEY) -> None:
        self._kv = kv
        self._ttl_s = ttl_s
        self._key = key

    @classmethod
    async def open(
        cls, js: JetStreamContext, ttl_s: float, bucket: str = LEADER_BUCKET
    ) -> NatsLease:
        """Bind to (or create) the lease bucket; a cluster without a JetStream leader yet
        is waited for as `open_bucket` does (a replica started beside a NATS cluster
        that is still electing used to exit here)."""
        try:
            kv = await open_bucket(js, bucket)
        except NatsError as exc:
            raise StoreError(f"cannot open KV bucket {bucket}: {exc}") from exc
        return cls(kv, ttl_s)

    async def read(self) -> Observed | None:
        try:
            entry = await self._kv.get(self._key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        except NatsError as exc:
            raise StoreError(f"reading the leader lease: {exc}") from exc
        try:
            holder = str(json.loads(entry.value or b"{}").get("holder") or "")
        except (ValueError, AttributeError):
            holder = "?"  # unreadable: someone else's, expires like any other
        return Observed(holder=holder, stamp=str(entry.revision), revision=entry.revision)

    async def create(self, holder: str) -> bool:
        try:
            await self._kv.create(self._key, self._value(holder))
        except KeyWrongLastSequenceError:
            return False
        except NatsError as exc:
            raise StoreError(f"creating the leader lease: {exc}") from exc
        return True

    async def write(self, holder: str, observed: Observed) -> bool:
        assert isinstance(observed.revision, int)
        try:
            await self._kv.update(self._key, self._value(holder), last=observed.revision)
        except KeyWrongLastSequenceError:
            return False
        except NatsError as exc:
            raise StoreError(f"renewing the leader lease: {exc}") from exc
        return True

    def _value(self, holder: str) -> bytes:
        now = dt.datetime.now(dt.UTC)
        expires = now + dt.timedelta(seconds=self._ttl_s if holder else 0)
        return json.dumps(
            {"holder": holder, "renewedAt": now.isoformat(), "expiresAt": expires.isoformat()}
        ).encode()


class KubeLease:
    """The lease as a coordination.k8s.io/v1 Lease (what `kubectl get lease` shows)."""

    def __init__(self, kube: KubeClient, ttl_s: float, name: str = LEASE_NAME) -> None:
        self._kube = kube
        self._ttl_s = ttl_s
        self._name = name

    async def read(self) -> Observed | None:
        record = await self._kube.read_lease(self._name)
        if record is None:
            return None
        stamp = f"{record.holder}@{record.renew_time}#{record.resource_version}"
        return Observed(holder=record.holder or "", stamp=stamp, revision=record)

    async def create(self, holder: str) -> bool:
        return await self._kube.write_lease(self._name, self._record(holder, None), create=True)

    async def write(self, holder: str, observed: Observed) -> bool:
        previous = observed.revision
        assert isinstance(previous, LeaseRecord)
        record = self._record(holder, previous)
        return await self._kube.write_lease(self._name, record, create=False)

    def _record(self, holder: str, previous: LeaseRecord | None) -> LeaseRecord:
        transitions = (previous.transitions or 0) if previous is not None else 0
        if previous is not None and previous.holder != holder and holder:
            transitions += 1
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime
        return LeaseRecord(
            holder=holder,
            duration_s=max(1, round(self._ttl_s)),
            renew_time=now,
            transitions=transitions,
            resource_version=previous.resource_version if previous is not None else None,
        )
