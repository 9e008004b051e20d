"""The ResourceSlice publisher (`--dra-publish`): keeps every node's rdma.nicfleet.io
slices in the API equal to what publishplan plans from the fleet, on the leader only.

Woken by the fleet's change feed (a port event, a snapshot or a status names its node;
a counter batch only a node published stale), it re-plans just the named pools; every
`resync_s` (and after gaining leadership or an API error) it lists the slices again and
re-plans all, which also re-creates slices someone else deleted (the kubelet drops a
driver's slices when its plugin goes away). Each pool is built with the sharing and rails
its agent reported (nodedevices.node_slice_settings) and owned by its Node. The API, the
feed and the fleet come in as protocols: this package imports nothing above it. Counts
its writes and the change-to-write latency (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from aggregator.dra import publishplan
from aggregator.dra.nodedevices import node_slice_settings
from aggregator.dra.publishplan import Create, Delete, PoolSource, Update
from aggregator.errors import KubeError
from proto.draslices import SliceSettings
from proto.inventory import NodeSnapshot
from proto.messages.status import DevicePluginStatus

log = logging.getLogger(__name__)
# Counter batches change no slice (thousands a second at scale): ignored for the nodes last
# published as heard from; a stale-published node's counters wake it, as it is back.
_QUIET_KINDS = frozenset({"counters"})


class SliceApi(Protocol):
    """aggregator.kube.client.KubeClient's ResourceSlice calls."""

    async def list_resource_slices(self) -> list[dict[str, Any]]: ...
    async def create_resource_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def replace_resource_slice(
        self, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]: ...
    async def delete_resource_slice(self, name: str, resource_version: str | None) -> bool: ...


class Changes(Protocol):
    """aggregator.fleet.changefeed.Subscription."""

    async def wait(self, timeout: float | None = None) -> tuple[set[str], set[str]]: ...
    def ignore(self, kinds: Container[str], of_nodes: Container[str]) -> None: ...


class NodeLike(Protocol):
    """What is read of aggregator.fleet.state.NodeRecord."""

    @property
    def snapshot(self) -> NodeSnapshot | None: ...
    @property
    def last_seen(self) -> float: ...
    @property
    def device_plugin(self) -> DevicePluginStatus | None: ...


@dataclass(frozen=True, kw_only=True)
class PublishSettings:
    stale_after: float = 30.0  # the policy's staleAfter: devices then read unhealthy
    resync_s: float = 30.0  # list again and re-plan every pool at least this often
    retry_s: float = 1.0  # first pause after an API error; doubles up to resync_s
    slices: SliceSettings = field(default_factory=SliceSettings)


def pool_sources(
    records: Mapping[str, NodeLike],
    now: float,
    stale_after: float,
    *,
    base: SliceSettings | None = None,
    node_uids: Mapping[str, str | None] | None = None,
    only: Collection[str] | None = None,
) -> dict[str, PoolSource]:
    """The fleet's nodes with a snapshot (just `only`'s, when given), each stale when
    unheard for `stale_after`, built with its agent's slice settings over `base` and
    owned by its Node's uid where `node_uids` knows one."""
    base = base or SliceSettings()
    uids = node_uids or {}
    names = records.keys() if only is None else [n for n in only if n in records]
    sources = {}
    for name in names:
        record = records[name]
        if record.snapshot is None:
            continue
        sources[name] = PoolSource(
            snapshot=record.snapshot,
            stale=now - record.last_seen > stale_after,
            settings=node_slice_settings(record.device_plugin, base),
            node_uid=uids.get(name),
        )
    return sources


# Change -> write done: a PUT takes milliseconds; retries after errors take seconds.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class PublishMetrics:
    """The publisher's series, registered on the aggregator's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.writes = Counter(
            "nicfleet_dra_slice_writes",
            "ResourceSlice writes by the --dra-publish publisher, by action (create, "
            "update, delete) and result (ok; conflict: 409, re-listed and retried; error).",
            ["action", "result"],
            registry=registry,
        )
        self.seconds = Histogram(
            "nicfleet_dra_slice_publish_seconds",
            "From a node's change reaching the publisher (or the round that found a "
            "difference) to its ResourceSlice write done, retries included.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.pools = Gauge(
            "nicfleet_dra_published_pools",
            "rdma.nicfleet.io pools (nodes) with ResourceSlices in the API as this "
            "replica last listed or wrote them; 0 while not the leader.",
            registry=registry,
        )
        for action in ("create", "update", "delete"):
            for result in ("ok", "conflict", "error"):
                self.writes.labels(action, result)


class SlicePublisher:
    def __init__(
        self,
        settings: PublishSettings,
        *,
        api: SliceApi,
        changes: Changes,
        records: Callable[[], Mapping[str, NodeLike]],
        cluster_nodes: Callable[[], Mapping[str, str | None] | None],
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`cluster_nodes`: the Node objects the API holds, name -> uid (None where the
        object had none), or None while the Node list is not in."""
        self.settings = settings
        self._api = api
        self._changes = changes
        self._records = records
        self._cluster_nodes = cluster_nodes
        self._is_leader = is_leader
        self._clock = clock
        # name -> the slice as last listed or written; None: list before planning.
        self._observed: dict[str, dict[str, Any]] | None = None
        # Pool -> when (monotonic) a change to it was first seen and not yet written.
        self._pending: dict[str, float] = {}
        self.metrics = PublishMetrics(registry or CollectorRegistry())
        self._fresh: set[str] = set()  # planned as not stale: their counters are quiet
        changes.ignore(_QUIET_KINDS, self._fresh)
        self.rounds = 0  # finished rounds (tests wait on it)
        self.errors = 0  # API errors so far

    async def run(self, stop: asyncio.Event) -> None:
        dirty: set[str] | None = None  # pools to re-plan; None: all of them
        last_full = -float("inf")
        pause = self.settings.retry_s
        while not stop.is_set():
            timeout = self.settings.resync_s
            if self._is_leader():
                full = dirty is None or time.monotonic() - last_full >= self.settings.resync_s
                try:
                    await self.sync(None if full else dirty)
                except KubeError as exc:
                    # Keep `dirty`: the failed pools are planned again, from a fresh list.
                    self.errors += 1
                    self._observed = None
                    log.warning("ResourceSlices not published (retry in %.1fs): %s", pause, exc)
                    timeout, pause = pause, min(pause * 2, self.settings.resync_s)
                else:
                    self.rounds += 1
                    pause = self.settings.retry_s
                    last_full = time.monotonic() if full else last_full
                    dirty = set()
            else:
                self._observed, dirty, last_full = None, None, -float("inf")
                self._pending.clear()
                self.metrics.pools.set(0)
            nodes = await self._next(stop, timeout)
            if dirty is not None:  # leading: the next round plans these
                dirty |= nodes
                seen = time.monotonic()
                for node in nodes:
                    self._pending.setdefault(node, seen)

    async def sync(self, only: Collection[str] | None) -> int:
        """One round: list when needed, plan, write; the number of API writes."""
        started = time.monotonic()
        if self._observed is None:
            listed = await self._api.list_resource_slices()
            owned = (o for o in listed if publishplan.owned(o, self.settings.slices.driver))
            self._observed = {str(o["metadata"]["name"]): o for o in owned}
        nodes = self._cluster_nodes()
        sources = pool_sources(
            self._records(),
            self._clock(),
            self.settings.stale_after,
            base=self.settings.slices,
            node_uids=nodes,
            only=only,
        )
        stale = {name for name, source in sources.items() if source.stale}
        self._fresh.difference_update(stale)
        self._fresh.update(sources.keys() - stale)
        actions = publishplan.plan(
            sources,
            list(self._observed.values()),
            cluster_nodes=nodes,
            settings=self.settings.slices,
            only=only,
        )
        for action in actions:
            await self._write(action, started)
        self._settled(only)
        return len(actions)

    def _settled(self, only: Collection[str] | None) -> None:
        """After a round without errors: the planned pools are written."""
        if only is None:
            self._pending.clear()
        else:
            for node in only:
                self._pending.pop(node, None)
        assert self._observed is not None
        pools = {publishplan.pool_of(o) for o in self._observed.values()}
        self.metrics.pools.set(len(pools - {None}))

    async def _write(self, action: publishplan.Action, started: float) -> None:
        observed = self._observed
        assert observed is not None
        kind = type(action).__name__.lower()
        pool = publishplan.pool_of(
            action.body if isinstance(action, Create | Update) else observed.get(action.name, {})
        )
        try:
            match action:
                case Create(body=body):
                    observed[action.name] = await self._api.create_resource_slice(body) or body
                case Update(name=name, body=body):
                    observed[name] = await self._api.replace_resource_slice(name, body) or body
                case Delete(name=name, resource_version=version):
                    await self._api.delete_resource_slice(name, version)
                    observed.pop(name, None)
        except KubeError as exc:
            result = "conflict" if exc.status == 409 else "error"
            self.metrics.writes.labels(kind, result).inc()
            raise
        self.metrics.writes.labels(kind, "ok").inc()
        # A write no change asked for (a full round's repair) counts from the round's start.
        since = self._pending.get(pool, started) if pool is not None else started
        self.metrics.seconds.observe(max(0.0, time.monotonic() - since))

    async def _next(self, stop: asyncio.Event, timeout: float) -> set[str]:
        """The nodes changed by then; empty on stop or after `timeout`."""
        stopped = asyncio.ensure_future(stop.wait())
        changed = asyncio.ensure_future(self._changes.wait(timeout))
        try:
            await asyncio.wait({stopped, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not changed.done():
                changed.cancel()
        if changed.done() and not changed.cancelled():
            return changed.result()[0]
        return set()
