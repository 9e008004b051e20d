"""Where alert transitions go: NATS alert subjects and the SSE fan-out broker.

The broker keeps a bounded ring of recent transitions with increasing event ids (for
`Last-Event-ID` resume) and one bounded queue per stream client; a client whose queue
fills up is dropped, so a slow reader never delays the engine or other readers.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from nats.aio.client import Client as NatsClient

from aggregator.alerts.lifecycle import FLEET_NODE
from proto import subjects
from proto.codec import encode
from proto.messages.alerts import Alert

_TOKEN_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
RING_SIZE: Final = 1024
CLIENT_QUEUE: Final = 256


def alert_subject(alert: Alert) -> str:
    """`nicfleet.v1.alert.<severity>.<rule>.<node-token>`; fleet-wide alerts use `_fleet`.

    `_fleet` can never be a node token (DNS-1123 names have no '_' at the start).
    """
    node = FLEET_NODE if alert.node == FLEET_NODE else subjects.node_token(alert.node)
    rule = _TOKEN_UNSAFE.sub("_", alert.rule) or "_"
    return f"{subjects.PREFIX}.alert.{alert.severity}.{rule}.{node}"


def message_id(alert: Alert) -> str:
    """One id per transition, so a JetStream stream on the alert subjects dedupes resends."""
    at = alert.ends_at if alert.state == "resolved" else alert.starts_at
    return f"{alert.fingerprint}-{alert.state}-{alert.severity}-{at:.6f}"


async def publish_alert(nc: NatsClient, alert: Alert) -> None:
    await nc.publish(
        alert_subject(alert), encode(alert), headers={"Nats-Msg-Id": message_id(alert)}
    )


@dataclass(frozen=True)
class Event:
    id: int
    alert: Alert


class StreamClient:
    """One SSE reader: its queue and whether the broker gave up on it."""

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=size)
        self.dropped = False
        self.wake = asyncio.Event()

    def offer(self, event: Event) -> bool:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped = True
            self.wake.set()
            return False
        self.wake.set()
        return True


class Broker:
    """Fan-out of transitions to stream clients, with a resume window."""

    def __init__(
        self,
        *,
        first_id: int,
        ring_size: int = RING_SIZE,
        client_queue: int = CLIENT_QUEUE,
        on_drop: Callable[[], None] = lambda: None,
    ) -> None:
        self._next_id = first_id
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._clients: set[StreamClient] = set()
        self._client_queue = client_queue
        self._on_drop = on_drop
        self.closed = asyncio.Event()

    @property
    def last_id(self) -> int:
        return self._next_id - 1

    @property
    def clients(self) -> int:
        return len(self._clients)

    def publish(self, alerts: Iterable[Alert]) -> None:
        for alert in alerts:
            event = Event(self._next_id, alert)
            self._next_id += 1
            self._ring.append(event)
            for client in list(self._clients):
                if not client.offer(event):
                    self._clients.discard(client)
                    self._on_drop()

    def subscribe(self, last_event_id: int | None) -> tuple[StreamClient, list[Event] | None]:
        """A new client and the events it missed; None means "too old: resync first"."""
        client = StreamClient(self._client_queue)
        self._clients.add(client)
        if last_event_id is None or last_event_id > self.last_id:
            return client, None
        oldest = self._ring[0].id if self._ring else self._next_id
        if last_event_id < oldest - 1:
            return client, None
        return client, [e for e in self._ring if e.id > last_event_id]

    def unsubscribe(self, client: StreamClient) -> None:
        self._clients.discard(client)

    def close(self) -> None:
        self.closed.set()
        for client in self._clients:
            client.wake.set()
        self._clients.clear()
