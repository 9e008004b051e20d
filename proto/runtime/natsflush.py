"""A NATS flush whose PONG covers the commands queued before it.

nats-py 2.16 queues SUB and PUB for its flusher task but writes `flush()`'s PING straight
to the socket, so right after `subscribe()` or `publish()` the PING can reach the server
first and its PONG proves nothing about them: a message another connection publishes next
may find no subscriber and be dropped (8 of 150 fresh connections in a loop here), and a
"confirmed" publish may not have left yet. By the time the first PONG is back the flusher
has written what was queued before that PING (it was woken before the PING left), so the
second PING follows those commands on the wire and its PONG means the server has them.
"""

from __future__ import annotations

import math
import time

from nats.aio.client import Client


def _whole_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))  # nats-py refuses a timeout <= 0


async def flush_in_order(nc: Client, timeout: float = 5.0) -> None:
    """Raise nats' FlushTimeoutError when the server does not answer within `timeout` s
    (both round trips together, at least a second each)."""
    deadline = time.monotonic() + timeout
    await nc.flush(timeout=_whole_seconds(timeout))
    await nc.flush(timeout=_whole_seconds(deadline - time.monotonic()))
