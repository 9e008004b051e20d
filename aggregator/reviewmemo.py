"""Answers about tokens, remembered: by the token's SHA-256 (the token itself is never kept)
until each answer's own deadline, the oldest dropped when full, and one question per token
at a time — concurrent askers wait for the answer in flight. Used for API bearer tokens
(api/tokenreview.py) and NATS join tokens (bus/calloutservice.py).

No I/O: the caller passes the clock and the question (`ask`), and says per answer how long
it may be trusted (`until`; None: not at all, e.g. the review could not be made).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

D = TypeVar("D")


def token_key(token: str) -> bytes:
    """The cache key of a token: its SHA-256, so the cache never holds the token itself."""
    return hashlib.sha256(token.encode()).digest()


@dataclass
class DecisionCache(Generic[D]):
    """Decisions by token key until they expire; the oldest entries go first when full."""

    max_entries: int
    _entries: OrderedDict[bytes, tuple[float, D]] = field(default_factory=OrderedDict, repr=False)

    def get(self, key: bytes, now: float) -> D | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, decision = found
        if now >= expires:
            del self._entries[key]
            return None
        return decision

    def put(self, key: bytes, decision: D, expires: float) -> None:
        self._entries[key] = (expires, decision)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class ReviewMemo(Generic[D]):
    """`decide(token, ask, until, interrupted)`: the cached answer, the one in flight, or
    `ask()`'s (`interrupted` if the asker is cancelled while others wait)."""

    def __init__(self, max_entries: int, *, clock: Callable[[], float]) -> None:
        self.cache: DecisionCache[D] = DecisionCache(max_entries)
        self._clock = clock
        self._inflight: dict[bytes, asyncio.Future[D]] = {}

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def decide(
        self,
        token: str,
        ask: Callable[[], Awaitable[D]],
        until: Callable[[D, float], float | None],  # (answer, now) → trusted until, or None
        interrupted: D,
    ) -> D:
        key = token_key(token)
        cached = self.cache.get(key, self._clock())
        if cached is not None:
            return cached
        pending = self._inflight.get(key)
        if pending is not None:  # someone is already asking about this token: wait for it
            return await asyncio.shield(pending)
        future: asyncio.Future[D] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        decision = interrupted
        try:
            decision = await ask()
        finally:
            del self._inflight[key]
            future.set_result(decision)
        expires = until(decision, self._clock())
        if expires is not None:
            self.cache.put(key, decision, expires)
        return decision
