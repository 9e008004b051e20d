"""ResourceClaim allocations to the DRA kubelet plugins over core NATS (docs/wire.md, "DRA
claims"): answers each agent's `nicfleet.v1.draclaims.<node>.get` from the claim index
(aggregator.dra.claims), with that node's devices of the claim only.

Every replica answers, in one queue group. As desired-config answers, an answer goes only
to a literal reply subject inside the asking node's inbox (`_INBOX.<token>.`); anything
else is refused, counted and logged at most once a minute per reason. Decides nothing:
the scheduler allocated the claim, the index only says to whom.
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
from prometheus_client import CollectorRegistry, Counter

from aggregator.bus import nodeanswers
from aggregator.bus.nodeanswers import reply_in_inbox
from aggregator.dra.claims import ClaimIndex
from proto import subjects
from proto.codec import CodecError, decode, encode
from proto.messages.draclaims import ClaimStatus, DraClaimRequest

log = logging.getLogger(__name__)

QUEUE = "nicfleet-draclaims"  # every replica in one group: one answer per request
MAX_REQUEST_BYTES = 4096  # namespace (63) + name (253) + uid (36) and framing


class Refusal(StrEnum):
    SUBJECT = "subject"  # not nicfleet.v1.draclaims.<valid node token>.get
    REPLY = "reply"  # no reply, or one outside the asking node's inbox
    REQUEST = "request"  # the body is no DraClaimRequest


def check_request(subject: str, reply: str | None) -> str | Refusal:
    """Pure: the node a claim request may be answered for, or why not (the reply must be a
    literal subject under that node's `_INBOX.<token>.`: the server delivers an answer to
    whatever subject the asker wrote there)."""
    try:
        node = subjects.parse_draclaims_get_subject(subject)
    except ValueError:
        return Refusal.SUBJECT
    if not reply_in_inbox(node, reply):
        return Refusal.REPLY
    return node


@dataclass(frozen=True, kw_only=True)
class ClaimFeedSettings:
    concurrency: int = 64  # answers in flight


class ClaimFeed:
    """Subscribed by `open`; `run` answers until `stop`."""

    def __init__(
        self,
        nc: NatsClient,
        index: ClaimIndex,
        *,
        registry: CollectorRegistry,
        settings: ClaimFeedSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._index = index
        self._settings = settings or ClaimFeedSettings()
        self._sub: Subscription | None = None
        self._refusals = nodeanswers.RefusalLog(log, "DRA claim request", clock)
        self._answered = Counter(
            "nicfleet_draclaims_requests_answered",
            "DRA plugins' claim requests answered, by status (allocated, unknown, "
            "other-node, mismatch).",
            ["status"],
            registry=registry,
        )
        self._refused = Counter(
            "nicfleet_draclaims_requests_refused",
            "DRA claim requests not answered, by reason (subject, reply, request).",
            ["reason"],
            registry=registry,
        )
        for status in ClaimStatus:
            self._answered.labels(status.value)
        for reason in Refusal:
            self._refused.labels(reason.value)

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(subjects.DRACLAIMS_GET_WILDCARD, queue=QUEUE)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(NatsError, OSError):
                await self._sub.unsubscribe()
            self._sub = None

    async def run(self, stop: asyncio.Event) -> None:
        if self._sub is None:
            raise RuntimeError("ClaimFeed.run before open")
        await nodeanswers.serve(self._sub, self.answer, self._settings.concurrency, stop)

    async def answer(self, msg: Msg) -> None:
        """One request: refused, or the claim's allocation on the asking node answered."""
        checked = check_request(msg.subject, msg.reply)
        if isinstance(checked, Refusal):
            self._refuse(checked, msg)
            return
        try:
            if len(msg.data) > MAX_REQUEST_BYTES:
                raise CodecError(DraClaimRequest.__name__, "$", "request too large")
            request = decode(msg.data, DraClaimRequest)
        except CodecError:
            self._refuse(Refusal.REQUEST, msg)
            return
        reply = self._index.answer(request, checked)
        try:
            await self._nc.publish(msg.reply, encode(reply))
        except (NatsError, OSError) as exc:
            log.debug("claim answer for %s not sent: %r", checked, exc)
            return
        self._answered.labels(reply.status.value).inc()

    def _refuse(self, reason: Refusal, msg: Msg) -> None:
        self._refused.labels(reason.value).inc()
        self._refusals.refused(reason.value, msg)
