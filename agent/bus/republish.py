"""The agent's republish: its answer to the resync requests on `nicfleet.v1.control.resync`.

`handle` is the subscription callback (the publisher owns the connection) that decodes a
request; `run` waits until the pending republish is due (agent.bus.republishpacing decides
when) and calls `republish`, which re-publishes the snapshot, a full counter batch and the
device-plugin status. Vocabulary: docs/wire.md, "Resync".
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.bus.republishpacing import RepublishPolicy, RepublishSchedule
from proto.codec import CodecError, decode
from proto.messages.control import ResyncRequest
from proto.subjects import node_token, partition_of

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RepublishStats:
    requests: int = 0  # decoded requests received
    coalesced: int = 0  # requests that found an answer already pending
    rejected: int = 0  # payloads that did not decode (ignored)
    other_partitions: int = 0  # scoped requests for partitions this node is not in
    answered: int = 0  # republishes done


class RepublishControl:
    def __init__(
        self,
        policy: RepublishPolicy,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
        node: str | None = None,  # scoped requests (docs/scaling.md) name its partition
    ) -> None:
        self._token = node_token(node) if node is not None else None
        self._schedule = RepublishSchedule(policy)
        self._monotonic = monotonic
        self._draw = draw
        self._wake = asyncio.Event()
        self.stats = RepublishStats()
        self._logged_bad = False

    @property
    def pending(self) -> bool:
        return self._schedule.due is not None

    def handle(self, data: bytes) -> None:
        """One message on the control subject; never raises."""
        try:
            request = decode(data, ResyncRequest)
        except CodecError as exc:
            self.stats.rejected += 1
            if not self._logged_bad:  # a bad publisher must not fill the log
                self._logged_bad = True
                log.warning("ignored a resync request: %s", exc)
            return
        self.stats.requests += 1
        if request.partition_count and self._token is not None:
            mine = partition_of(self._token, request.partition_count)
            if mine not in request.partitions:  # a takeover of partitions not ours
                self.stats.other_partitions += 1
                return
        due = self._schedule.request(self._monotonic(), self._draw(), request.spread_s)
        if due is None:
            self.stats.coalesced += 1
            return
        log.info(
            "aggregator asked for a resync (%s); answering in %.1f s",
            request.reason,
            due - self._monotonic(),
        )
        self._wake.set()

    async def run(self, stop: asyncio.Event, republish: Callable[[], Awaitable[None]]) -> None:
        while not stop.is_set():
            due = self._schedule.due
            timeout = None if due is None else max(0.0, due - self._monotonic())
            self._wake.clear()
            if timeout is None or timeout > 0:
                await _wait_either(stop, self._wake, timeout=timeout)
                continue
            if self._schedule.take(self._monotonic()):
                self.stats.answered += 1
                await republish()


async def _wait_either(stop: asyncio.Event, wake: asyncio.Event, *, timeout: float | None) -> None:
    """Wait until `stop` or `wake` is set, or `timeout` passes (None: no timeout)."""
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
