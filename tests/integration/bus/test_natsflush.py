"""`flush_in_order` on a real nats-server: after it, a subscription made just before is in
place for a message another connection publishes (a plain `flush()` of nats-py 2.16 may
return before the server has seen the SUB)."""

from __future__ import annotations

import nats
import pytest

from aggregator.bus.natsserver import NatsServer
from proto.runtime.natsflush import flush_in_order

pytestmark = pytest.mark.integration

TRIES = 60  # a plain flush() lost the first message in ~5 % of fresh connections


async def test_a_subscription_is_in_place_after_flush_in_order(own_nats: NatsServer) -> None:
    publisher = await nats.connect(own_nats.url)
    try:
        for n in range(TRIES):
            subscriber = await nats.connect(own_nats.url)  # fresh: the race is at its widest
            try:
                sub = await subscriber.subscribe(f"order.{n}")
                await flush_in_order(subscriber)
                await publisher.publish(f"order.{n}", b"first")
                await publisher.flush(timeout=5)
                msg = await sub.next_msg(timeout=30)
                assert (msg.subject, msg.data) == (f"order.{n}", b"first"), n
            finally:
                await subscriber.close()
    finally:
        await publisher.close()


async def test_flush_in_order_on_a_closed_connection_raises(own_nats: NatsServer) -> None:
    nc = await nats.connect(own_nats.url)
    await nc.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await flush_in_order(nc, timeout=0)  # a timeout <= 0 still means one second each


async def test_flush_in_order_times_out_when_the_server_is_stopped(
    own_nats: NatsServer,
) -> None:
    nc = await nats.connect(own_nats.url, max_reconnect_attempts=1, reconnect_time_wait=0.1)
    try:
        own_nats.stop(kill=True)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.ConnectionClosedError)):
            await flush_in_order(nc, timeout=1)
    finally:
        await nc.close()
