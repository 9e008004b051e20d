"""The ResourceSlice publisher (`--dra-publish`): keeps every node's rdma.nicfleet.io
slices in the API equal to what publishplan plans from the fleet, on the leader only.

Woken by the fleet's change feed (a port event or a snapshot names its node), it
re-plans just the named pools; every `resync_s` (and after gaining leadership or an API
error) it lists the slices again and re-plans all, which also re-creates slices someone
else deleted (the kubelet drops a driver's slices when its plugin goes away). The API,
the feed and the fleet come in as protocols: this package imports nothing above it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aggregator.dra import publishplan
from aggregator.dra.publishplan import Create, Delete, PoolSource, Update
from aggregator.errors import KubeError
from proto.draslices import SliceSettings
from proto.inventory import NodeSnapshot

log = logging.getLogger(__name__)


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


class NodeLike(Protocol):
    """What is read of aggregator.fleet.state.NodeRecord."""

    @property
    def snapshot(self) -> NodeSnapshot | None: ...
    @property
    def last_seen(self) -> float: ...


@dataclass(frozen=True, kw_only=True)
class PublishSettings:
    stale_after: float = 30.0  # the policy's staleAfter: devices then read unhealthy
    resync_s: float = 30.0  # list again and re-plan every pool at least this often
    retry_s: float = 1.0  # first pause after an API error; doubles up to resync_s
    slices: SliceSettings = field(default_factory=SliceSettings)


def pool_sources(
    records: Mapping[str, NodeLike], now: float, stale_after: float
) -> dict[str, PoolSource]:
    """The fleet's nodes with a snapshot, each stale when unheard for `stale_after`."""
    return {
        name: PoolSource(snapshot=r.snapshot, stale=now - r.last_seen > stale_after)
        for name, r in records.items()
        if r.snapshot is not None
    }


class SlicePublisher:
    def __init__(
        self,
        settings: PublishSettings,
        *,
        api: SliceApi,
        changes: Changes,
        records: Callable[[], Mapping[str, NodeLike]],
        cluster_nodes: Callable[[], Collection[str] | None],
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._api = api
        self._changes = changes
        self._records = records
        self._cluster_nodes = cluster_nodes
        self._is_leader = is_leader
        self._clock = clock
        # name -> the slice as last listed or written; None: list before planning.
        self._observed: dict[str, dict[str, Any]] | None = None
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
            nodes = await self._next(stop, timeout)
            if dirty is not None:
                dirty |= nodes

    async def sync(self, only: Collection[str] | None) -> int:
        """One round: list when needed, plan, write; the number of API writes."""
        if self._observed is None:
            listed = await self._api.list_resource_slices()
            owned = (o for o in listed if publishplan.owned(o, self.settings.slices.driver))
            self._observed = {str(o["metadata"]["name"]): o for o in owned}
        sources = pool_sources(self._records(), self._clock(), self.settings.stale_after)
        actions = publishplan.plan(
            sources,
            list(self._observed.values()),
            cluster_nodes=self._cluster_nodes(),
            settings=self.settings.slices,
            only=only,
        )
        for action in actions:
            await self._write(action)
        return len(actions)

    async def _write(self, action: publishplan.Action) -> None:
        observed = self._observed
        assert observed is not None
        match action:
            case Create(body=body):
                observed[action.name] = await self._api.create_resource_slice(body) or body
            case Update(name=name, body=body):
                observed[name] = await self._api.replace_resource_slice(name, body) or body
            case Delete(name=name, resource_version=version):
                await self._api.delete_resource_slice(name, version)
                observed.pop(name, None)

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
