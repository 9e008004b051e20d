"""Desired device-plugin config to the agents over core NATS (docs/wire.md, "Desired
config"): answers each agent's `nicfleet.v1.desired.<node>.get` from KV `nicfleet-config`,
and announces a node's entry on `nicfleet.v1.desired.<node>` once written.

Every replica answers, in one queue group, so a request gets one answer. An answer goes
only to a reply subject inside the asking node's inbox (`_INBOX.<token>.`): a request whose
reply names another node's inbox, an alert, the resync subject or anything else is refused,
counted and logged (at most once a minute per reason). Decides no config: reconcile does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter

from aggregator.bus import nodeanswers
from aggregator.bus.nodeanswers import reply_in_inbox
from proto import subjects
from proto.codec import encode
from proto.messages.config import DesiredUpdate

log = logging.getLogger(__name__)

QUEUE = "nicfleet-desired"  # every replica in one group: one answer per request


class Refusal(StrEnum):
    SUBJECT = "subject"  # not nicfleet.v1.desired.<valid node token>.get
    REPLY = "reply"  # no reply, or one outside the asking node's inbox
    STORE = "store"  # the KV could not be read (not an attack; the agent asks again)


def check_request(subject: str, reply: str) -> str | Refusal:
    """Pure: the node a request may be answered for, or why not.

    The reply must lie under `_INBOX.<token>.` of the node the subject names — the prefix
    only that node's agent may subscribe to — and be a literal subject: the server would
    deliver an answer to whatever subject the asker wrote there.
    """
    try:
        node = subjects.parse_desired_get_subject(subject)
    except ValueError:
        return Refusal.SUBJECT
    if not reply_in_inbox(node, reply):
        return Refusal.REPLY
    return node


@dataclass(frozen=True, kw_only=True)
class DesiredFeedSettings:
    concurrency: int = 64  # answers in flight (a fleet asks at once after a NATS restart)
    kv_timeout: float = 2.0


class DesiredFeed:
    """Subscribed by `open`; `run` answers until `stop`; `announce` is reconcile's hook."""

    def __init__(
        self,
        nc: NatsClient,
        kv: KeyValue,
        *,
        registry: CollectorRegistry,
        settings: DesiredFeedSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._kv = kv
        self._settings = settings or DesiredFeedSettings()
        self._sub: Subscription | None = None
        self._refusals = nodeanswers.RefusalLog(log, "desired config request", clock)
        self._answered = Counter(
            "nicfleet_desired_requests_answered",
            "Agents' desired-config requests answered from KV nicfleet-config.",
            registry=registry,
        )
        self._refused = Counter(
            "nicfleet_desired_requests_refused",
            "Desired-config requests not answered, by reason (subject, reply, store).",
            ["reason"],
            registry=registry,
        )
        self._announced = Counter(
            "nicfleet_desired_announced",
            "Desired-config entries announced to their node after a KV write.",
            registry=registry,
        )
        for reason in Refusal:
            self._refused.labels(reason.value)

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(subjects.DESIRED_GET_WILDCARD, queue=QUEUE)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(NatsError, OSError):
                await self._sub.unsubscribe()
            self._sub = None

    async def run(self, stop: asyncio.Event) -> None:
        if self._sub is None:
            raise RuntimeError("DesiredFeed.run before open")
        await nodeanswers.serve(self._sub, self.answer, self._settings.concurrency, stop)

    async def answer(self, msg: Msg) -> None:
        """One request: refused, or the node's entry sent to its reply subject."""
        checked = check_request(msg.subject, msg.reply)
        if isinstance(checked, Refusal):
            self._refuse(checked, msg)
            return
        update = await self._read(checked)
        if update is None:
            self._refuse(Refusal.STORE, msg)
            return
        try:
            await self._nc.publish(msg.reply, encode(update))
        except (NatsError, OSError) as exc:
            log.debug("desired config answer for %s not sent: %r", checked, exc)
            return
        self._answered.inc()

    async def announce(self, node: str, revision: int, value: bytes | None) -> None:
        """After a write to the node's key was acknowledged: tell its agent. A lost
        announcement is healed by the agent's periodic request."""
        update = DesiredUpdate(node=node, revision=revision, config=value)
        try:
            await self._nc.publish(subjects.desired_subject(node), encode(update))
        except (NatsError, OSError) as exc:
            log.debug("desired config for %s not announced: %r", node, exc)
            return
        self._announced.inc()

    async def _read(self, node: str) -> DesiredUpdate | None:
        key = subjects.node_token(node)
        try:
            entry = await asyncio.wait_for(self._kv.get(key), timeout=self._settings.kv_timeout)
        except KeyNotFoundError as exc:  # deleted (a marker with its revision) or never set
            marker = exc.entry
            return DesiredUpdate(node=node, revision=marker.revision if marker else 0)
        except (TimeoutError, JetStreamError, NatsError, OSError) as exc:
            log.warning("desired config for %s not read: %r", node, exc)
            return None
        return DesiredUpdate(node=node, revision=entry.revision or 0, config=entry.value or b"")

    def _refuse(self, reason: Refusal, msg: Msg) -> None:
        self._refused.labels(reason.value).inc()
        if reason is not Refusal.STORE:  # a KV hiccup is no attack: the agent asks again
            self._refusals.refused(reason.value, msg)
