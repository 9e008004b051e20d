"""The agent process: owns its tasks, the stop event and the order of things.

Publishes a full snapshot on start, after every NATS reconnect, after every observed
change and periodically (anti-entropy); counter batches at a fixed interval; a link
event the moment a port's state changes. Reading is delegated to `inventory`, sending
to `publisher`; this module only schedules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent import __version__
from agent.changes import PortStates, diff_port_states
from agent.inventory import CounterReader, collect_port_states, collect_snapshot
from agent.publisher import Publisher
from agent.sysfs import Sysfs

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    node_name: str
    sysfs_root: Path
    nats_url: str
    counter_interval: float = 1.0
    state_poll_interval: float = 0.1
    snapshot_interval: float = 300.0


class AgentService:
    def __init__(self, settings: AgentSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._sysfs = Sysfs(settings.sysfs_root)
        self._counters = CounterReader(self._sysfs)
        self._resync = asyncio.Event()
        self._publisher = Publisher(
            node=settings.node_name, url=settings.nats_url, on_reconnect=self._request_resync
        )
        self._snapshot_seq = 0
        self._counter_seq = 0
        self._event_seq = 0
        self._states: PortStates = {}

    async def _request_resync(self) -> None:
        self._resync.set()

    async def run(self, stop: asyncio.Event) -> None:
        self._states = await asyncio.to_thread(collect_port_states, self._sysfs)
        if not await self._publisher.connect(stop):
            return
        self._resync.set()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._snapshot_loop(stop))
                tasks.create_task(self._counter_loop(stop))
                tasks.create_task(self._state_loop(stop))
        finally:
            await self._publisher.close()

    async def _snapshot_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _wait_any(stop, self._resync, timeout=self.settings.snapshot_interval)
            if stop.is_set():
                return
            self._resync.clear()
            self._snapshot_seq += 1
            snapshot = await asyncio.to_thread(
                collect_snapshot,
                self._sysfs,
                node=self.settings.node_name,
                seq=self._snapshot_seq,
                now=self._clock(),
                agent_version=__version__,
            )
            await self._publisher.publish(snapshot)

    async def _counter_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._counter_seq += 1
            batch = await asyncio.to_thread(
                self._counters.collect,
                node=self.settings.node_name,
                seq=self._counter_seq,
                now=self._clock(),
            )
            await self._publisher.publish(batch)
            await _wait_any(stop, timeout=self.settings.counter_interval)

    async def _state_loop(self, stop: asyncio.Event) -> None:
        # sysfs port state emits no events the agent can wait on, so it is polled at a
        # short interval; only differences are published.
        while not stop.is_set():
            await _wait_any(stop, timeout=self.settings.state_poll_interval)
            if stop.is_set():
                return
            current = await asyncio.to_thread(collect_port_states, self._sysfs)
            now = self._clock()
            events = diff_port_states(
                self._states, current, node=self.settings.node_name, now=now, seq=self._event_seq
            )
            if not events:
                continue
            self._states = current
            for event in events:
                self._event_seq = event.seq
                log.info(
                    "%s %s/%s: %s -> %s",
                    event.kind,
                    event.adapter,
                    event.port,
                    event.old_state,
                    event.new_state,
                )
                await self._publisher.publish(event)
            if any(e.kind != "port-state" for e in events):
                self._counters.rediscover()
            self._resync.set()


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    """Wait until any event is set or `timeout` passes (an interruptible sleep)."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
