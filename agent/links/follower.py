"""Following netdev changes over netlink for as long as the agent runs.

The first dump is the baseline; later changes (and, after a lost socket, the difference
to a fresh dump) become `NetdevChanges` handed to the agent, which publishes them. A lost
socket is re-opened with a doubling wait; no netlink at start leaves the agent polling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from agent.links.netdevs import (
    NetdevChanges,
    NetdevPorts,
    Netdevs,
    diff_netdevs,
    netdevs_from_dump,
    update_netdevs,
)
from agent.links.netlink import NetlinkUnavailable, NetlinkWatcher

log = logging.getLogger(__name__)

MAX_RETRY = 30.0  # seconds between two attempts to re-open a lost netlink socket


class NetdevFollower:
    def __init__(
        self,
        *,
        node: str,
        netns: str | None,
        retry: float,
        clock: Callable[[], float],
        ports: Callable[[], NetdevPorts],
        last_seq: Callable[[], int],
        on_changes: Callable[[NetdevChanges], Awaitable[None]],
    ) -> None:
        self._node = node
        self._netns = netns
        self._retry = retry
        self._clock = clock
        self._ports = ports  # netdev -> RDMA port, from the latest snapshot
        self._last_seq = last_seq  # link events share one numbering with the port poll
        self._on_changes = on_changes
        self._netdevs: Netdevs = {}
        self.watching = asyncio.Event()  # set once the first link dump is known

    async def run(self, stop: asyncio.Event, ready: asyncio.Event) -> None:
        """Follow netlink once `ready` is set (the first snapshot) until `stop` is."""
        # Reading a netlink socket blocks until the kernel says something, so the
        # follower is cancelled when the agent stops rather than checking `stop`.
        async with asyncio.TaskGroup() as tasks:
            follower = tasks.create_task(self._follow(ready))
            await stop.wait()
            follower.cancel()

    async def _follow(self, ready: asyncio.Event) -> None:
        await ready.wait()  # netdev -> RDMA port mapping comes from the first snapshot
        watched = False
        retry = self._retry
        while True:
            try:
                async with NetlinkWatcher(netns=self._netns) as watcher:
                    dump = netdevs_from_dump(await watcher.dump())
                    if watched:
                        log.info("netlink watch re-established")
                        await self._apply(dump)  # publishes what we missed
                    else:
                        self._netdevs = dump
                        log.info("watching %d netdevs via netlink", len(dump))
                    watched, retry = True, self._retry
                    self.watching.set()
                    while True:
                        table = self._netdevs
                        for observation in await watcher.changes():
                            table = update_netdevs(table, observation)
                        await self._apply(table)
            except NetlinkUnavailable as exc:
                if not watched:
                    log.warning("netlink unavailable (%s); port state is polled only", exc)
                    return
                if self.watching.is_set():
                    log.warning("netlink watch lost (%s); re-opening", exc)
                else:
                    log.debug("netlink still unavailable: %s", exc)
                self.watching.clear()
            await asyncio.sleep(retry)
            retry = min(retry * 2, MAX_RETRY)

    async def _apply(self, table: Netdevs) -> None:
        changes = diff_netdevs(
            self._netdevs,
            table,
            ports=self._ports(),
            node=self._node,
            now=self._clock(),
            seq=self._last_seq(),
        )
        self._netdevs = table
        await self._on_changes(changes)
