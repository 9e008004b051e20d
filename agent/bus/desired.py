"""The aggregator's desired device-plugin config for this node: KV `nicfleet-config`,
key = the node's token, watched live.

Owns its own NATS connection and the watch: waits (with backoff) for the bucket to exist,
re-opens the watch after a reconnect or an error. Each valid config is handed to
`on_config`; a deleted key hands `None`. An invalid one is logged and counted, never applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE, KeyValue

from proto import subjects
from proto.codec import CodecError, decode
from proto.dpconfig import ConfigError, validate_device_plugin_config
from proto.messages.config import DesiredConfig
from proto.runtime.natsconnect import (
    NO_SECURITY,
    NatsClientSecurity,
    agent_inbox_prefix,
    connect_options,
)

log = logging.getLogger(__name__)

CONFIG_STREAM = f"KV_{subjects.KV_CONFIG}"


@dataclass(frozen=True, kw_only=True)
class DesiredSettings:
    retry_initial: float = 0.2  # first wait before looking for the bucket again
    retry_max: float = 5.0
    # A watch is re-opened this often even when nothing seems wrong: an ordered consumer
    # lost with a restarted server would otherwise go quiet without an error.
    rewatch_interval: float = 300.0
    # The server drops a watch's consumer this long after its subscriber went away, so
    # re-watches and reconnects do not pile up consumers on the bucket's stream.
    inactive_threshold: float = 30.0


class DesiredConfigWatcher:
    """Watches one node's key; `run` until `stop`. Not thread-safe; one per agent."""

    def __init__(
        self,
        *,
        node: str,
        url: str,
        on_config: Callable[[DesiredConfig | None], None],
        settings: DesiredSettings | None = None,
        security: NatsClientSecurity = NO_SECURITY,
    ) -> None:
        self.key = subjects.node_token(node)
        # Checked here, so a bad credential file fails the agent at start.
        self._connect_options = connect_options(security, inbox_prefix=agent_inbox_prefix(node))
        self.node = node
        self.url = url
        self._on_config = on_config
        self.settings = settings or DesiredSettings()
        self._nc: NatsClient | None = None
        self._reconnected = asyncio.Event()
        self.last_revision: int | None = None
        self.rejected = 0  # entries that did not decode or validate
        self.watching = asyncio.Event()  # set while a watch is open

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                closed = self._nc is None or self._nc.is_closed
                if closed and not await self._connect(stop):
                    return
                await self._watch_once(stop)
        finally:
            if self._nc is not None and not self._nc.is_closed:
                with contextlib.suppress(TimeoutError, NatsError, OSError):
                    await self._nc.close()

    async def _connect(self, stop: asyncio.Event) -> bool:
        async def reconnected() -> None:
            self._reconnected.set()

        wait = self.settings.retry_initial
        while not stop.is_set():
            try:
                self._nc = await nats.connect(
                    self.url,
                    name=f"nicfleet-agent/{self.node}/desired",
                    reconnect_time_wait=0.25,
                    max_reconnect_attempts=-1,
                    reconnected_cb=reconnected,
                    **self._connect_options,
                )
                return True
            except (TimeoutError, OSError, NatsError) as exc:
                log.warning("desired config: cannot connect to NATS: %s; retrying", exc)
            await _pause(stop, wait)
            wait = min(wait * 2, self.settings.retry_max)
        return False

    async def _bucket(self, stop: asyncio.Event) -> KeyValue | None:
        assert self._nc is not None
        wait = self.settings.retry_initial
        logged = False
        while not stop.is_set():
            try:
                return await self._nc.jetstream().key_value(subjects.KV_CONFIG)
            except BucketNotFoundError:
                if not logged:
                    log.info("desired config: bucket %s not there yet; waiting", subjects.KV_CONFIG)
                    logged = True
            except (TimeoutError, JetStreamError, NatsError, OSError) as exc:
                log.debug("desired config: bucket lookup failed: %s", exc)
            await _pause(stop, wait)
            wait = min(wait * 2, self.settings.retry_max)
        return None

    async def _watch_once(self, stop: asyncio.Event) -> None:
        kv = await self._bucket(stop)
        if kv is None:
            return
        self._reconnected.clear()
        try:
            sub = await self._subscribe()
        except (TimeoutError, JetStreamError, NatsError, OSError) as exc:
            log.warning("desired config: cannot watch %s: %s; retrying", self.key, exc)
            await _pause(stop, self.settings.retry_initial)
            return
        self.watching.set()
        try:
            async with asyncio.TaskGroup() as tasks:
                reader = tasks.create_task(self._read(_entries(sub)))
                ender = tasks.create_task(self._until_rewatch(stop))
                await asyncio.wait({reader, ender}, return_when=asyncio.FIRST_COMPLETED)
                reader.cancel()
                ender.cancel()
        finally:
            self.watching.clear()
            with contextlib.suppress(TimeoutError, NatsError, JetStreamError, OSError):
                await sub.unsubscribe()

    async def _subscribe(self) -> JetStreamContext.PushSubscription:
        """A named consumer filtered on this node's key, last value first, then updates.

        Named, because only then does the create request's subject carry the filter
        (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`) and the server can allow an
        agent its own key alone; `kv.watch()` creates an unnamed one, which would need a
        permission that reads every node's key. Not ordered: no acks, no flow control.
        """
        assert self._nc is not None
        name = f"desired-{self.key[:180]}-{secrets.token_hex(4)}"
        config = ConsumerConfig(
            name=name,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=self.settings.inactive_threshold,
            mem_storage=True,
            num_replicas=1,
        )
        subject = f"$KV.{subjects.KV_CONFIG}.{self.key}"
        return await self._nc.jetstream().subscribe(subject, stream=CONFIG_STREAM, config=config)

    async def _until_rewatch(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in (stop, self._reconnected)]
        try:
            await asyncio.wait(
                waits, timeout=self.settings.rewatch_interval, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _read(self, watcher: AsyncIterator[KeyValue.Entry | None]) -> None:
        async for entry in watcher:
            if entry is None:
                continue  # end of the initial values
            if entry.revision == self.last_revision:
                continue  # the same entry again after a re-watch
            self.last_revision = entry.revision
            if entry.operation in (KV_DEL, KV_PURGE):
                log.info("desired config for %s removed", self.node)
                self._on_config(None)
                continue
            config = self._decode(entry.value or b"")
            if config is not None:
                self._on_config(config)

    def _decode(self, data: bytes) -> DesiredConfig | None:
        source = f"{subjects.KV_CONFIG}/{self.key}"
        try:
            config = decode(data, DesiredConfig)
            if config.node != self.node:
                raise ConfigError(source, "$.node", f"is {config.node!r}, not this node")
            validate_device_plugin_config(config.device_plugin, source=source)
        except (CodecError, ConfigError) as exc:
            self.rejected += 1
            log.error("desired config not applied, the last good one stays: %s", exc)
            return None
        return config


async def _entries(sub: JetStreamContext.PushSubscription) -> AsyncIterator[KeyValue.Entry]:
    async for msg in sub.messages:
        headers = msg.headers or {}
        op = headers.get(KV_OP)
        if op is None and headers.get(KV_MARKER_REASON) is not None:
            # nats-server 2.11+ marks server-side removals with a reason, not an operation.
            reason = headers[KV_MARKER_REASON]
            op = KV_DEL if reason == "Remove" else KV_PURGE
        yield KeyValue.Entry(
            bucket=subjects.KV_CONFIG,
            key=msg.subject.rsplit(".", 1)[-1],
            value=msg.data,
            revision=msg.metadata.sequence.stream,
            delta=msg.metadata.num_pending,
            created=None,
            operation=op,
        )


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
