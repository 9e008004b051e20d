"""The whole fleet as the sharded leader plans it (docs/scaling.md, "Writes"): its own
nodes as ingested; every other node from KV `nicfleet-nodes` (each replica persists its
own nodes' snapshots there) and a KV watch while this replica leads, plus every
partition's device-plugin status messages, which every replica follows all the time so
that a new leader knows each node's applied config at once. The reconciler may write once
it is `synced`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.fleet.store import StoredNode
from aggregator.kv import bucket_keys
from aggregator.metrics import Metrics
from aggregator.replicas.owner import node_subject_of
from proto import subjects
from proto.codec import CodecError, decode
from proto.runtime.waits import either
from proto.subjects import STATUS, partition_subject

log = logging.getLogger(__name__)


class WholeFleet(Fleet):
    """A `Fleet` whose `view()` is the whole fleet. Nodes held elsewhere count as seen
    now unless their holder lists them stale in its summary (`stale_elsewhere`): the
    holders judge staleness, the KV copy is refreshed only when a snapshot changes. A
    node listed stale keeps the last time this replica heard of it (its KV entry or
    status), which is no later than its holder's last message, so it is judged stale here
    too."""

    def __init__(
        self,
        own: Fleet,
        clock: Callable[[], float],
        bucket: str = subjects.KV_NODES,
        stale_elsewhere: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        super().__init__()
        self._own, self._clock, self._bucket = own, clock, bucket
        self._stale_elsewhere = stale_elsewhere
        self.synced = False  # the KV pass reached the bucket's last sequence
        # Device-plugin status of every partition's nodes (KV does not keep it; agents send
        # it on change, on resync and every inventory interval), followed by every replica.
        self.statuses = Fleet()
        self._status_ingest = Ingest(fleet=self.statuses, metrics=Metrics.create(),
                                     clock=clock, on_snapshot=lambda _snap, _at: None)  # fmt: skip
        self._following = False  # self holds the other shards' nodes (leading)
        self.following_statuses = False  # subscribed (queued on the connection)

    def view(self) -> Mapping[str, NodeRecord]:
        if not len(self):
            return self._own.view()
        now, stale = self._clock(), self._stale_elsewhere()
        merged = {
            name: record
            if name in stale
            else msgspec.structs.replace(record, last_seen=max(record.last_seen, now))
            for name, record in super().view().items()
        }
        merged.update(self._own.view())
        return MappingProxyType(merged)

    def clear(self) -> None:
        for name in self.names():
            self.forget(name)
        self.synced = False

    async def run(
        self, stop: asyncio.Event, leading: asyncio.Event, kv: KeyValue, nc: NatsClient
    ) -> None:
        """Follow every partition's device-plugin status; while `leading` is set, also the
        nodes bucket (merged with those statuses); when it clears, forget the nodes."""
        status = await nc.subscribe(partition_subject("*", "*", STATUS), cb=self._on_status)
        self.following_statuses = True
        try:
            await self._lead_when_leading(stop, leading, kv, nc)
        finally:
            self.following_statuses = False
            with contextlib.suppress(TimeoutError, NatsError, OSError):
                await status.unsubscribe()

    async def _on_status(self, msg: Msg) -> None:
        subject = node_subject_of(msg.subject)
        if not self._status_ingest.handle(subject, msg.data) or not self._following:
            return
        node, _ = subjects.parse_node_subject(subject)  # valid: the ingest accepted it
        self._adopt_status(node)

    def _adopt_status(self, node: str) -> None:
        record = self.statuses.get(node)
        if record is None or record.device_plugin is None:
            return
        received_at = record.device_plugin_received_at
        self.apply_status(record.device_plugin, received_at or record.last_seen)

    async def _lead_when_leading(
        self, stop: asyncio.Event, leading: asyncio.Event, kv: KeyValue, nc: NatsClient
    ) -> None:
        while not stop.is_set():
            await either(stop, leading)
            if stop.is_set():
                return
            try:
                await self._follow(stop, leading, kv, nc)
            except (TimeoutError, NatsError, JetStreamError, OSError) as exc:
                log.warning("following KV nodes for the leader failed: %s; retrying", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
            finally:
                self._following = False
                self.clear()

    async def _follow(
        self, stop: asyncio.Event, leading: asyncio.Event, kv: KeyValue, nc: NatsClient
    ) -> None:
        # Policy status needs each node's device-plugin status: what was followed so far
        # first, then each one as it comes (`_on_status`).
        for node in self.statuses.names():
            self._adopt_status(node)
        self._following = True
        await self._watch(stop, leading, kv, nc.jetstream())

    async def _watch(
        self, stop: asyncio.Event, leading: asyncio.Event, kv: KeyValue, js: JetStreamContext
    ) -> None:
        pending = await bucket_keys(js, self._bucket)  # synced once each was delivered
        watcher = await kv.watchall()
        self.synced = not pending
        try:
            while leading.is_set() and not stop.is_set():
                try:
                    entry = await watcher.updates(timeout=1.0)  # type: ignore[no-untyped-call]
                except (TimeoutError, NatsError):
                    continue
                if entry is None:
                    continue  # end of initial values: the keys decide (aggregator.kv)
                self._apply(entry.key, entry.value, entry.operation)
                pending.discard(entry.key)
                if not self.synced and not pending:
                    self.synced = True
                    log.info("leader holds the whole fleet from KV (%d nodes)", len(self))
        finally:
            with contextlib.suppress(TimeoutError, JetStreamError, NatsError, OSError):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _apply(self, key: str, value: bytes | None, operation: str | None) -> None:
        if operation in (KV_DEL, KV_PURGE) or not value:
            try:
                node = subjects.node_from_token(key)  # keys are tokens: '.' stored as '_'
            except subjects.InvalidNodeName as exc:
                log.warning("skipping KV node key %s: %s", key, exc)
                return
            self.forget(node)
            self.statuses.forget(node)  # a node removed from the fleet
            return
        try:
            stored = decode(value, StoredNode)
        except CodecError as exc:
            log.warning("skipping undecodable KV node %s: %s", key, exc)
            return
        self.apply_snapshot(stored.snapshot, stored.received_at)  # keeps the status
