"""What the aggregator's per-node request answerers (desired configs, DRA claims) share:
the reply check, the bounded serving loop and the once-a-minute refusal log.

An answer goes only to a literal reply subject inside the asking node's inbox
(`_INBOX.<token>.`), the prefix only that node's agent may subscribe to: the server would
deliver an answer to whatever subject the asker wrote there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from proto.runtime.natsconnect import agent_inbox_prefix

LOG_EVERY_S: Final = 60.0


def reply_in_inbox(node: str, reply: str | None) -> bool:
    """Pure: `reply` is a literal subject under `node`'s agent inbox."""
    reply = reply or ""
    prefix = f"{agent_inbox_prefix(node)}."
    rest = reply[len(prefix) :]
    return reply.startswith(prefix) and bool(rest) and all(_literal(t) for t in rest.split("."))


def _literal(token: str) -> bool:
    return bool(token) and token not in ("*", ">") and not any(c.isspace() for c in token)


async def serve(
    sub: Subscription, answer: Callable[[Msg], Awaitable[None]], concurrency: int,
    stop: asyncio.Event,
) -> None:  # fmt: skip
    """Answer `sub`'s requests, at most `concurrency` at a time, until `stop` is set."""
    limit = asyncio.Semaphore(concurrency)

    async def one(msg: Msg) -> None:
        try:
            await answer(msg)
        finally:
            limit.release()

    async def loop() -> None:
        async with asyncio.TaskGroup() as tasks:
            async for msg in sub.messages:
                await limit.acquire()
                tasks.create_task(one(msg))

    async with asyncio.TaskGroup() as tasks:
        server = tasks.create_task(loop())
        await stop.wait()
        server.cancel()


class RefusalLog:
    """Logs a refused request at most once a minute per reason (every refusal is counted
    by the caller's metric; the log only says that it happens)."""

    def __init__(self, log: logging.Logger, what: str, clock: Callable[[], float]) -> None:
        self._log, self._what, self._clock = log, what, clock
        self._logged_at: dict[str, float] = {}

    def refused(self, reason: str, msg: Msg) -> None:
        now = self._clock()
        last = self._logged_at.get(reason)
        if last is not None and now - last < LOG_EVERY_S:
            return
        self._logged_at[reason] = now
        self._log.warning(
            "%s refused (%s): subject %r, reply %r "
            "(further refusals for this reason are counted, logged once a minute)",
            self._what, reason, msg.subject[:200], (msg.reply or "")[:200],
        )  # fmt: skip
