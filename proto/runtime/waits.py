"""Waits shared by the processes' loops: return when either of two events is set."""

from __future__ import annotations

import asyncio


async def either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Return once `first` or `second` is set; the other waiter is cancelled and reaped."""
    waiters = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
