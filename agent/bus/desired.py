"""The aggregator's desired device-plugin config for this node, over core NATS only.

The aggregator announces a `DesiredUpdate` on `nicfleet.v1.desired.<node>` after each write
to KV `nicfleet-config`, and answers `nicfleet.v1.desired.<node>.get` from the KV. This
watcher owns its NATS connection: it subscribes to its node's subject and asks at start,
after every reconnect and every `rewatch_interval` (a missed announcement heals), retrying
with backoff while no aggregator answers. Agents hold no JetStream permission
(docs/security.md). Each valid config newer than the last goes to `on_config`; a removal
hands `None`. An invalid one is logged and counted, never applied (one whose errors are
all in single entries is handed on: LiveConfig leaves those out and reports them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from agent.bus.desiredorder import RevisionGate, Via
from proto import subjects
from proto.codec import CodecError, decode
from proto.dpconfig import ConfigError, check_device_plugin_resources
from proto.messages.config import DesiredConfig, DesiredUpdate
from proto.runtime.natsconnect import (
    NO_SECURITY,
    NatsClientSecurity,
    agent_inbox_prefix,
    connect_options,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DesiredSettings:
    retry_initial: float = 0.2  # first wait before asking again when nobody answered
    retry_max: float = 5.0
    # Asked again this often even when nothing seems wrong: an announcement lost while the
    # connection was down (or published by a replica that then died) heals here.
    rewatch_interval: float = 300.0
    request_timeout: float = 2.0  # for one answer


class DesiredConfigWatcher:
    """Follows one node's desired config; `run` until `stop`. Not thread-safe; one per agent."""

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
        self._gate = RevisionGate()
        self._holding = False  # the last value handed on was a config (not None)
        self._quiet_logged = False
        self.rejected = 0  # updates or configs that did not decode or validate
        self.unanswered = 0  # requests no aggregator answered (none running, or refused)
        # Set once subscribed and answered by an aggregator; cleared while disconnected.
        self.watching = asyncio.Event()

    @property
    def last_revision(self) -> int | None:
        return self._gate.applied

    async def run(self, stop: asyncio.Event) -> None:
        try:
            if not await self._connect(stop):
                return
            assert self._nc is not None
            sub = await self._nc.subscribe(subjects.desired_subject(self.node))
            async with asyncio.TaskGroup() as tasks:
                reader = tasks.create_task(self._read(sub.messages))
                asker = tasks.create_task(self._ask_until(stop))
                await asyncio.wait({reader, asker}, return_when=asyncio.FIRST_COMPLETED)
                reader.cancel()
                asker.cancel()
        finally:
            self.watching.clear()
            if self._nc is not None and not self._nc.is_closed:
                with contextlib.suppress(TimeoutError, NatsError, OSError):
                    await self._nc.close()
            self._nc = None

    async def _connect(self, stop: asyncio.Event) -> bool:
        async def reconnected() -> None:
            self._reconnected.set()

        async def disconnected() -> None:
            self.watching.clear()

        wait = self.settings.retry_initial
        while not stop.is_set():
            try:
                self._nc = await nats.connect(
                    self.url,
                    name=f"nicfleet-agent/{self.node}/desired",
                    reconnect_time_wait=0.25,
                    max_reconnect_attempts=-1,
                    reconnected_cb=reconnected,
                    disconnected_cb=disconnected,
                    **self._connect_options,
                )
                return True
            except (TimeoutError, OSError, NatsError) as exc:
                log.warning("desired config: cannot connect to NATS: %s; retrying", exc)
            await _pause(stop, wait)
            wait = min(wait * 2, self.settings.retry_max)
        return False

    async def _ask_until(self, stop: asyncio.Event) -> None:
        """Ask, then wait for the next reason to ask: the interval, a reconnect, or (while
        no aggregator answers) a backoff step."""
        backoff = self.settings.retry_initial
        while not stop.is_set():
            self._reconnected.clear()
            if await self._ask():
                self.watching.set()
                backoff, wait = self.settings.retry_initial, self.settings.rewatch_interval
            else:
                wait, backoff = backoff, min(backoff * 2, self.settings.retry_max)
            await _either(stop, self._reconnected, timeout=wait)

    async def _ask(self) -> bool:
        """One request for this node's entry; True when an answer came (applied or not)."""
        assert self._nc is not None
        subject = subjects.desired_get_subject(self.node)
        try:
            msg = await self._nc.request(subject, b"", timeout=self.settings.request_timeout)
        except NoRespondersError:
            self.unanswered += 1
            if not self._quiet_logged:
                log.info("desired config: no aggregator answers %s yet; asking again", subject)
                self._quiet_logged = True
            return False
        except (TimeoutError, NatsError, OSError) as exc:
            self.unanswered += 1
            log.debug("desired config: request on %s failed: %r", subject, exc)
            return False
        self._quiet_logged = False
        self._receive(msg.data, Via.ANSWERED)
        return True

    async def _read(self, messages: AsyncIterator[Msg]) -> None:
        async for msg in messages:
            self._receive(msg.data, Via.ANNOUNCED)

    def _receive(self, data: bytes, via: Via) -> None:
        """One `DesiredUpdate`: decoded, checked for this node, applied when newer."""
        try:
            update = decode(data, DesiredUpdate)
            if update.node != self.node:
                source = subjects.desired_subject(self.node)
                raise ConfigError(source, "$.node", f"is {update.node!r}, not this node")
        except (CodecError, ConfigError) as exc:
            self.rejected += 1
            log.error("desired config update not applied, the last good one stays: %s", exc)
            return
        if not self._gate.admit(update.revision, via):
            return  # older than, or the same as, what was applied
        if update.config is None:
            if self._holding:
                log.info("desired config for %s removed", self.node)
                self._holding = False
                self._on_config(None)
            return
        config = self._decode(update.config)
        if config is not None:
            self._holding = True
            self._on_config(config)

    def _decode(self, data: bytes) -> DesiredConfig | None:
        source = f"{subjects.KV_CONFIG}/{self.key}"
        try:
            config = decode(data, DesiredConfig)
            if config.node != self.node:
                raise ConfigError(source, "$.node", f"is {config.node!r}, not this node")
            # Whole-config errors only: LiveConfig serves the valid entries of the rest.
            check_device_plugin_resources(config.device_plugin, source=source)
        except (CodecError, ConfigError) as exc:
            self.rejected += 1
            log.error("desired config not applied, the last good one stays: %s", exc)
            return None
        return config


async def _either(first: asyncio.Event, second: asyncio.Event, *, timeout: float) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in (first, second)]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
