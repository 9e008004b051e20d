"""The port-state poll: sysfs port states read every `interval`, diffed into link events.

sysfs has no change notification for port states, so they are polled; a netdev event
asks for an early poll (`reread`). The first successful poll is the baseline; a poll
that differs hands its events to the agent, which feeds the device plugin and publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from agent.errors import CollectionTimeout
from agent.links.portdiff import PortStates, diff_port_states
from proto.messages.events import LinkEvent
from proto.runtime.waits import either

log = logging.getLogger(__name__)


class StatesReader(Protocol):
    """agent.host.portstates.PortStateReader: one bounded read of every port's state."""

    def collect(self) -> PortStates: ...


class PortPoll:
    def __init__(
        self,
        reader: StatesReader,
        *,
        node: str,
        interval: float,
        clock: Callable[[], float],
        last_seq: Callable[[], int],
        on_events: Callable[[list[LinkEvent]], Awaitable[None]],
    ) -> None:
        self._reader = reader
        self._node = node
        self._interval = interval
        self._clock = clock
        self._last_seq = last_seq  # link events share one numbering with netlink's
        self._on_events = on_events
        self.states: PortStates | None = None  # None: no poll has succeeded yet
        self.reread = asyncio.Event()  # poll now

    async def baseline(self) -> None:
        """One poll before the loops start; a blocked one is left to `run` (it logs)."""
        with contextlib.suppress(CollectionTimeout):
            self.states = await asyncio.to_thread(self._reader.collect)

    async def run(self, stop: asyncio.Event) -> None:
        # Polled for every port, netdev or not: a netdev event wakes this loop at once,
        # but the RDMA port state in sysfs may follow the netdev a little later.
        stuck = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(either(stop, self.reread), timeout=self._interval)
            if stop.is_set():
                return
            self.reread.clear()
            try:
                current = await asyncio.to_thread(self._reader.collect)
            except CollectionTimeout as exc:
                if not stuck:
                    log.warning("port-state poll keeps blocking in the kernel (%s); retrying", exc)
                stuck = True
                continue
            if stuck:
                log.info("port-state poll works again")
            stuck = False
            if self.states is None:
                self.states = current  # the first successful poll is the baseline
                continue
            events = diff_port_states(
                self.states, current, node=self._node, now=self._clock(), seq=self._last_seq()
            )
            if events:
                self.states = current
                await self._on_events(events)
