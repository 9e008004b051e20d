"""One sharded aggregator replica's share of the fleet (docs/scaling.md): heartbeats in KV
`nicfleet-shards`, the plan of `aggregator.replicas.partitions` over the live replicas, one NATS
subscription per partition held, nodes loaded from KV `nicfleet-nodes` (and a resync
asked) when a partition is taken over, and per-shard vote summaries sent and merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from aggregator.alerts.engine import HeardSince
from aggregator.alerts.wiring import AllRules
from aggregator.cluster import ClusterView
from aggregator.errors import AggregatorError, StoreError
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import StoredNode, load_nodes
from aggregator.fleet.views import node_state
from aggregator.replicas.partitions import ShardSettings, live_replicas, partition_of, plan
from aggregator.replicas.summaries import ShardRules, merge_remote
from aggregator.rules.descriptor import NOT_LOADED
from aggregator.rules.finding import Finding
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.messages.shards import MAX_STALE_NAMES, ShardSummary
from proto.policy import Policy

log = logging.getLogger(__name__)

KV_SHARDS: Final = "nicfleet-shards"
_START_ATTEMPTS: Final = 60
_START_RETRY_S: Final = 0.5  # a retry pause (not a wait for a condition: nothing to wait on)
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def replica_id(identity: str) -> str:
    """The identity as one subject token and KV key."""
    return _NOT_TOKEN.sub("_", identity) or "replica"


def node_subject_of(partitioned: str) -> str:
    """`nicfleet.v1.part.<p>.node.<t>.<k>` -> `nicfleet.v1.node.<t>.<k>` (else unchanged)."""
    head = f"{subjects.PREFIX}.part."
    if not partitioned.startswith(head):
        return partitioned
    _, _, rest = partitioned[len(head) :].partition(".")
    return f"{subjects.PREFIX}.{rest}"


class ShardedAllRules(AllRules):
    """`AllRules` with the peer rules judged against merged per-shard facts."""

    def __init__(
        self,
        rules: ShardRules,
        extra: Callable[[], Sequence[Finding]] | None = None,
        *,
        heard_since: HeardSince = lambda: NOT_LOADED,
    ):
        super().__init__(extra, heard_since=heard_since)
        self.shard_rules = rules

    def evaluate(
        self, fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        thresholds, problems = self._parsed(policies)
        found = self.shard_rules.evaluate(
            fleet.view(), policies, cluster, now, thresholds=thresholds,
            heard_since=self._heard_since(),
        )  # fmt: skip
        extra = self._extra() if self._extra is not None else ()
        return [*problems, *found, *extra]


class ShardOwner:
    def __init__(
        self,
        nc: NatsClient,
        settings: ShardSettings,
        *,
        identity: str,
        fleet: Fleet,
        nodes_kv: KeyValue,
        handle: Callable[[str, bytes], bool],  # Ingest.handle on node subjects
        on_change: Callable[[str, str], None],
        resync: Callable[[frozenset[int]], None],  # ask these partitions' agents to resend
        clock: Callable[[], float],
        extra: Callable[[], Sequence[Finding]] | None = None,
        api_url: Callable[[], str | None] = lambda: None,  # put in the heartbeat
        stale_after: float = 30.0,  # own nodes silent this long are listed in the summary
    ) -> None:
        self._stale_after = stale_after
        self._api_url = api_url
        self.api_urls: dict[str, str] = {}  # replica -> its API, from the heartbeats
        self.me = replica_id(identity)
        self._nc, self._settings, self._fleet, self._nodes_kv = nc, settings, fleet, nodes_kv
        self._handle, self._on_change, self._resync, self._clock = handle, on_change, resync, clock
        self.shard_rules = ShardRules(settings.partitions)
        # Each node loaded from KV at a takeover -> when its partition's subscription went
        # up (RuleInput.heard_since); replaced, never mutated (rules read it in a thread).
        self.heard_since: Mapping[str, float] = NOT_LOADED
        self.rules = ShardedAllRules(self.shard_rules, extra, heard_since=lambda: self.heard_since)
        self._kv: KeyValue | None = None
        self._subs: dict[int, Subscription] = {}
        self._seen: dict[str, tuple[int, float]] = {}  # replica -> (revision, first seen at)
        self._summaries: dict[str, ShardSummary] = {}
        self.live: frozenset[str] = frozenset()
        self.owners: dict[int, str] = {}
        self.takeovers = 0  # partitions taken over after the first plan
        self.rejected = 0  # undecodable summaries
        self.misrouted = 0  # node messages on a partition subject their node is not in

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._subs)

    def view(self) -> dict[str, object]:
        """For `/api/v1/shards`: who holds what, as this replica sees it."""
        return {
            "replica": self.me,
            "partitions": self._settings.partitions,
            "held": sorted(self._subs),
            "nodes": len(self._fleet),
            "live": sorted(self.live),
            "owners": {str(p): r for p, r in sorted(self.owners.items())},
            "summaries": {r: s.nodes for r, s in sorted(self._summaries.items())},
            "takeovers": self.takeovers,
            "api_urls": dict(sorted(self.api_urls.items())),
        }

    def holder_of(self, name: str) -> tuple[str | None, str | None]:
        """(replica, its API URL) holding node `name` in the current plan."""
        replica = self.owners.get(self.partition(name))
        return replica, self.api_urls.get(replica) if replica is not None else None

    def node_names(self) -> list[str]:
        return self._fleet.names()

    async def start(self) -> None:
        js = self._nc.jetstream()
        try:
            self._kv = await js.key_value(KV_SHARDS)
        except JetStreamError:
            self._kv = await js.create_key_value(
                bucket=KV_SHARDS,
                history=1,
                ttl=self._settings.ttl_s * 5,
                description="nicfleet",
                replicas=self._settings.replicas,
            )
        await self._nc.subscribe(subjects.SHARD_SUMMARY_WILDCARD, cb=self._on_summary)
        # A JetStream cluster that is still forming answers the first puts with no response
        # (measured: a replica exited at start); retry for a while, then give up loudly.
        for attempt in range(_START_ATTEMPTS):
            try:
                await self.tick(first=True)
                return
            except (TimeoutError, NatsError, JetStreamError) as exc:
                if attempt == _START_ATTEMPTS - 1:
                    raise
                log.info("shard heartbeat at start: %r; retrying", exc)
                await asyncio.sleep(_START_RETRY_S)

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat and re-plan every `heartbeat_s`, in two loops: a takeover's KV load
        must not delay the heartbeat (peers would take this replica for dead)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._every(stop, self.beat))
            tasks.create_task(self._every(stop, self.replan))
        if self._kv is not None:  # leave at once instead of after ttl
            with contextlib.suppress(TimeoutError, NatsError, JetStreamError, OSError):
                await self._kv.delete(self.me)

    async def _every(self, stop: asyncio.Event, step: Callable[[], Awaitable[None]]) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._settings.heartbeat_s)
            if stop.is_set():
                break
            try:
                await step()
            except (TimeoutError, NatsError, JetStreamError, OSError, AggregatorError) as exc:
                log.warning("shard heartbeat/plan failed: %s; retrying", exc)

    async def tick(self, *, first: bool = False) -> None:
        await self.beat()
        await self.replan(first=first)

    async def beat(self) -> None:
        """Put this replica's heartbeat (the votes go on the summary subject)."""
        assert self._kv is not None
        beat = ShardSummary(replica=self.me, partitions=tuple(sorted(self.held)),
                            nodes=len(self._fleet), sent_at=self._clock(),
                            api_url=self._api_url() or "")  # fmt: skip
        await self._kv.put(self.me, encode(beat))

    async def replan(self, *, first: bool = False) -> None:
        """Read the heartbeats, hold what the plan gives this replica, send the summary."""
        now = self._clock()
        self.live = live_replicas(await self._heartbeats(now), now, self._settings.ttl_s)
        mine = plan(self._settings.partitions, self.live | {self.me})
        self.owners = {p: r for r, parts in mine.items() for p in parts}
        await self._hold(mine[self.me], first=first)
        await self._publish_summary(now)
        self._merge()

    async def _heartbeats(self, now: float) -> Mapping[str, float]:
        """Replica -> when (by our clock) its heartbeat entry last changed.

        nats-py's key listing can miss keys under load (measured: survivors of a SIGKILL
        took each other for dead and took each other's partitions, one tick at a time), so
        a known replica missing from a listing is read by key: only a deleted entry (a
        clean leave) drops it at once, else its TTL decides."""
        assert self._kv is not None
        try:
            listed = set(await self._kv.keys())
        except NoKeysError:
            listed = set()
        for key in sorted(listed | self._seen.keys()):
            try:
                entry = await self._kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                self._seen.pop(key, None)
                self.api_urls.pop(key, None)
                continue
            revision = entry.revision or 0
            with contextlib.suppress(CodecError):
                url = decode(entry.value or b"", ShardSummary).api_url
                if url:
                    self.api_urls[key] = url
            seen = self._seen.get(key)
            if seen is None or seen[0] != revision:
                self._seen[key] = (revision, now)
        return {replica: at for replica, (_, at) in self._seen.items()}

    async def _hold(self, wanted: frozenset[int], *, first: bool) -> None:
        gone, new = self.held - wanted, wanted - self.held
        for partition in sorted(gone):
            await self._subs.pop(partition).unsubscribe()
        if gone:
            released = [n for n in self._fleet.names() if self.partition(n) in gone]
            for name in released:
                self._fleet.forget(name)
                self._on_change(name, "released")
            if not self.heard_since.keys().isdisjoint(released):
                kept = {n: t for n, t in self.heard_since.items() if n not in set(released)}
                self.heard_since = MappingProxyType(kept)
            log.info("released partitions %s", sorted(gone))
        if not new:
            return
        for partition in sorted(new):
            self._subs[partition] = await self._nc.subscribe(
                subjects.partition_subject(partition), cb=self._on_node,
                pending_msgs_limit=200_000,
            )  # fmt: skip
        subscribed = self._clock()  # the SUBs are sent; the server has them a round trip later
        found: list[StoredNode] = []
        try:
            async for stored in load_nodes(self._nodes_kv):
                if self.partition(stored.snapshot.node) in new:
                    found.append(stored)
        except StoreError as exc:  # the agents' answers to the resync fill the fleet
            log.warning("cannot load partitions %s from KV: %s", sorted(new), exc)
        finally:
            self._resync(new)  # what was published before we subscribed is re-sent
        # Installed without an await between: no evaluation sees a loaded record before
        # its heard_since.
        loaded = {s.snapshot.node: subscribed for s in found if s.snapshot.node not in self._fleet}
        if loaded:
            self.heard_since = MappingProxyType({**self.heard_since, **loaded})
        for stored in found:
            if stored.snapshot.node in loaded:
                self._fleet.apply_snapshot(stored.snapshot, stored.received_at)
                self._on_change(stored.snapshot.node, "taken-over")
        if not first:
            self.takeovers += len(new)
        log.info("holding partitions %s (+%d nodes from KV)", sorted(new), len(loaded))

    def partition(self, name: str) -> int:
        return partition_of(subjects.node_token(name), self._settings.partitions)

    async def _on_node(self, msg: Msg) -> None:
        subject = node_subject_of(msg.subject)
        parts = msg.subject.split(".")
        # An agent may publish its own partition subjects directly (permissions are
        # checked after mapping): one naming a partition its node is not in is dropped.
        if len(parts) != 7 or parts[3] != str(partition_of(parts[5], self._settings.partitions)):
            self.misrouted += 1
            return
        self._handle(subject, msg.data)

    async def _on_summary(self, msg: Msg) -> None:
        try:
            summary = decode(msg.data, ShardSummary)
        except CodecError as exc:
            self.rejected += 1
            log.warning("dropped shard summary on %s: %s", msg.subject, exc)
            return
        if summary.replica == self.me:
            return
        old = self._summaries.get(summary.replica)
        self._summaries[summary.replica] = summary
        if old is None or old.votes != summary.votes or old.partitions != summary.partitions:
            self._merge()

    async def _publish_summary(self, now: float) -> None:
        summary = self.shard_rules.summary(self.me, self.held, now)
        summary = msgspec.structs.replace(summary, stale=self._stale_names(now))
        await self._nc.publish(subjects.shard_summary_subject(self.me), encode(summary))

    def _stale_names(self, now: float) -> tuple[str, ...]:
        stale = sorted(
            name
            for name, record in self._fleet.view().items()
            if node_state(record, now, self._stale_after) == "stale"
        )
        if len(stale) > MAX_STALE_NAMES:
            log.warning("%d stale nodes; the summary lists the first %d",
                        len(stale), MAX_STALE_NAMES)  # fmt: skip
        return tuple(stale[:MAX_STALE_NAMES])

    def stale_elsewhere(self) -> frozenset[str]:
        """Nodes the live replicas holding them judge stale, from their latest summaries
        (for the leader's policy status; a replica's own nodes are judged where ingested)."""
        stale: set[str] = set()
        for summary in self._summaries.values():
            if summary.replica not in self.live:
                continue
            for name in summary.stale:
                try:
                    partition = self.partition(name)
                except subjects.InvalidNodeName:
                    continue  # a peer's bad entry names no node of ours to judge
                if self.owners.get(partition) == summary.replica:
                    stale.add(name)
        return frozenset(stale)

    def _merge(self) -> None:
        """Remote counts from the live replicas' latest summaries; re-evaluate on change."""
        for replica in self._summaries.keys() - self.live:
            del self._summaries[replica]
        remote = merge_remote(self._summaries.values(), self.owners, self.me)
        if remote != self.shard_rules.remote:
            self.shard_rules.remote = remote
            self._on_change("_fleet", "shard-summary")
