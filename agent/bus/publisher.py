"""Publish the agent's messages on NATS: subjects, encoding and delivery counting.

Owns the NATS connection of one agent: connects (retrying until told to stop),
reconnects forever, and tells the service when a reconnect happened so it re-publishes
its full snapshot. Stamps every message with the process's `epoch` (docs/wire.md,
"Ordering"). Knows nothing about sysfs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import msgspec.structs
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from proto import subjects
from proto.codec import encode
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus
from proto.runtime.natsconnect import (
    NO_SECURITY,
    NatsClientSecurity,
    agent_inbox_prefix,
    connect_options,
)
from proto.runtime.natsflush import flush_in_order

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class PublishStats:
    published: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0


class Publisher:
    """One NATS connection for one node; `publish` never raises on transport trouble."""

    def __init__(
        self,
        *,
        node: str,
        url: str,
        on_reconnect: Callable[[], Awaitable[None]],
        connect_timeout: float = 2.0,
        security: NatsClientSecurity = NO_SECURITY,
        on_control: Callable[[bytes], None] | None = None,
        epoch: int | None = None,
    ) -> None:
        self.node = subjects.validate_node_name(node)
        # This process's start (unix ns, by the agent's clock): what lets the aggregator
        # tell a restart (seq back to 1) from a late message of the process before.
        self.epoch = time.time_ns() if epoch is None else epoch
        # Checked here, so a bad credential file fails the agent at start.
        self._connect_options = connect_options(security, inbox_prefix=agent_inbox_prefix(node))
        self.url = url
        self._on_reconnect = on_reconnect
        self._on_control = on_control  # resync requests (agent.bus.republish), if wanted
        self._connect_timeout = connect_timeout
        self._nc: NatsClient | None = None
        self.stats = PublishStats()

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def client(self) -> NatsClient | None:
        """The connection, for requests under this node's inbox (the DRA plugin's claims)."""
        return self._nc

    async def connect(self, stop: asyncio.Event, *, retry_wait: float = 0.5) -> bool:
        """Connect, retrying until connected (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                self._nc = await nats.connect(
                    self.url,
                    name=f"nicfleet-agent/{self.node}",
                    connect_timeout=int(max(1, self._connect_timeout)),
                    reconnect_time_wait=0.25,
                    max_reconnect_attempts=-1,
                    allow_reconnect=True,
                    reconnected_cb=self._reconnected,
                    disconnected_cb=self._disconnected,
                    error_cb=self._error,
                    **self._connect_options,
                )
                log.info("connected to NATS at %s", self.url)
                if self._on_control is not None:
                    # nats-py re-subscribes by itself after every reconnect.
                    await self._nc.subscribe(subjects.CONTROL_RESYNC, cb=self._control)
                return True
            except (TimeoutError, OSError, NatsError) as exc:
                log.warning("cannot connect to NATS at %s: %s; retrying", self.url, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=retry_wait)
        return False

    async def _reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("reconnected to NATS at %s", self.url)
        await self._on_reconnect()

    async def _control(self, msg: Msg) -> None:
        if self._on_control is not None:
            self._on_control(msg.data)

    async def _disconnected(self) -> None:
        log.warning("disconnected from NATS at %s", self.url)

    async def _error(self, exc: Exception) -> None:
        log.warning("NATS error: %s", exc)

    async def publish(
        self, message: NodeSnapshot | CounterBatch | LinkEvent | DevicePluginStatus
    ) -> bool:
        kind = _KINDS[type(message)]
        subject = subjects.node_subject(self.node, kind)
        if message.epoch != self.epoch:  # the builders know nothing of the process
            message = msgspec.structs.replace(message, epoch=self.epoch)
        headers = None
        if kind != subjects.COUNTERS:
            # Lets a JetStream stream drop duplicates of a re-sent message.
            seq = message.seq if not isinstance(message, DevicePluginStatus) else 0
            headers = {"Nats-Msg-Id": f"{self.node}:{kind}:{seq}:{_stamp(message)}"}
        nc = self._nc
        if nc is None or not nc.is_connected:
            self._count(self.stats.failed, kind)
            return False
        try:
            await nc.publish(subject, encode(message), headers=headers)
        except (NatsError, OSError) as exc:
            log.debug("publish on %s failed: %s", subject, exc)
            self._count(self.stats.failed, kind)
            return False
        self._count(self.stats.published, kind)
        return True

    async def flush(self, timeout: float = 2.0) -> None:
        if self._nc is not None and self._nc.is_connected:
            try:
                await flush_in_order(self._nc, timeout=timeout)
            except (TimeoutError, NatsError, OSError) as exc:
                log.debug("flush failed: %s", exc)

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is None or nc.is_closed:
            return
        try:
            await nc.drain()
        except (TimeoutError, NatsError, OSError):
            await nc.close()

    @staticmethod
    def _count(table: dict[str, int], kind: str) -> None:
        table[kind] = table.get(kind, 0) + 1


_KINDS: dict[type[msgspec.Struct], str] = {
    NodeSnapshot: subjects.SNAPSHOT,
    CounterBatch: subjects.COUNTERS,
    LinkEvent: subjects.EVENT,
    DevicePluginStatus: subjects.STATUS,
}


def _stamp(message: NodeSnapshot | CounterBatch | LinkEvent | DevicePluginStatus) -> str:
    if isinstance(message, LinkEvent | DevicePluginStatus):
        return f"{message.observed_at:.6f}"
    return f"{message.collected_at:.6f}"
