"""Resync requests: ask agents to republish their state when the aggregator may have missed
messages (vocabulary: docs/wire.md, "Resync").

After start (fleet loaded from KV, node subscription in place), after each reconnect
(nats-server may have cut us as a slow consumer) and when nats-py dropped node messages
itself, one `ResyncRequest` goes out on `nicfleet.v1.control.resync` — coalesced, and at
most one per `min_gap_s`. The agents' answers are spread over `spread_s` (fleet size).
A sharded takeover asks only the taken-over partitions' agents (`request_partitions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from proto import subjects
from proto.codec import encode
from proto.messages.control import MAX_RESYNC_SPREAD_S, ResyncReason, ResyncRequest
from proto.runtime.natsflush import flush_in_order
from proto.runtime.waits import either

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ResyncRequestSettings:
    # Nodes per second the aggregator asks to hear from during a resync (each answers
    # with a snapshot, a full counter batch and its status): the fleet's answers are
    # spread over nodes / rate seconds (agents add at least their own jitter).
    rate_nodes_per_s: float = 200.0
    min_gap_s: float = 1.0  # between two requests; requests in between are merged


def request_spread(nodes: int, rate_nodes_per_s: float) -> float:
    """Pure: the window over which `nodes` agents should answer, capped for the wire."""
    if rate_nodes_per_s <= 0:
        return MAX_RESYNC_SPREAD_S
    return min(MAX_RESYNC_SPREAD_S, nodes / rate_nodes_per_s)


class ResyncRequester:
    def __init__(
        self,
        nc: NatsClient,
        settings: ResyncRequestSettings,
        *,
        nodes: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self._nc = nc
        self._settings = settings
        self._nodes = nodes
        self._clock = clock
        self._wanted = asyncio.Event()
        self._reason: ResyncReason = "start"
        self._count = 0  # partition count of a scoped request; 0: ask every agent
        self._partitions: set[int] = set()
        self.sent: dict[str, int] = {}  # requests published, by reason

    def request(self, reason: ResyncReason) -> None:
        """Ask every agent for a resync soon; safe to call from NATS callbacks, never blocks."""
        if not self._wanted.is_set():
            self._reason = reason
            self._wanted.set()
        self._count, self._partitions = 0, set()  # a broadcast covers any scoped request

    def request_partitions(self, partitions: Iterable[int], count: int) -> None:
        """Ask only the agents of `partitions` (of `count`); merged into a pending request
        (a pending broadcast stays a broadcast)."""
        if not self._wanted.is_set():
            self._reason, self._count, self._partitions = "shard-takeover", count, set()
            self._wanted.set()
        if self._count:
            self._partitions.update(partitions)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await either(stop, self._wanted)
            if stop.is_set():
                return
            self._wanted.clear()
            scope, self._count, self._partitions = (self._count, self._partitions), 0, set()
            await self._publish(self._reason, *scope)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._settings.min_gap_s)

    async def _publish(self, reason: ResyncReason, count: int, partitions: set[int]) -> None:
        spread = request_spread(self._nodes(), self._settings.rate_nodes_per_s)
        message = ResyncRequest(
            reason=reason,
            spread_s=spread,
            requested_at=self._clock(),
            partition_count=count,
            partitions=tuple(sorted(partitions)),
        )
        try:
            await self._nc.publish(subjects.CONTROL_RESYNC, encode(message))
            await flush_in_order(self._nc, timeout=2)
        except (TimeoutError, NatsError, OSError) as exc:
            # The next reconnect asks again; nats-py also re-sends a buffered publish.
            log.warning("resync request (%s) not confirmed: %s", reason, exc)
        self.sent[reason] = self.sent.get(reason, 0) + 1
        scope = f"partitions {sorted(partitions)} of {count}" if count else "every agent"
        log.info("asked agents to resync (%s, %s), answers spread over %.1f s",
                 reason, scope, spread)  # fmt: skip
