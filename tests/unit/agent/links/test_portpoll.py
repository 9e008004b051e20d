"""The port-state poll (agent.links.portpoll) against a scripted reader: baseline, events
numbered after the last seq, a blocked read that is retried."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from agent.errors import CollectionTimeout
from agent.links.portdiff import PortStates
from agent.links.portpoll import PortPoll
from proto.messages.events import LinkEvent
from tests.support.waits import wait_until

UP: PortStates = {("mlx5_0", 1): ("ACTIVE", "5: LinkUp")}
DOWN: PortStates = {("mlx5_0", 1): ("DOWN", "3: Disabled")}


class ScriptedReader:
    """Answers each collect with the next item; the last one repeats."""

    def __init__(self, *answers: PortStates | CollectionTimeout) -> None:
        self._answers: Iterator[PortStates | CollectionTimeout] = iter(answers)
        self._last: PortStates | CollectionTimeout = answers[0]
        self.reads = 0

    def collect(self) -> PortStates:
        self.reads += 1
        self._last = next(self._answers, self._last)
        if isinstance(self._last, CollectionTimeout):
            raise self._last
        return self._last


@asynccontextmanager
async def polling(poll: PortPoll) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(poll.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task


def make_poll(reader: ScriptedReader, seen: list[LinkEvent], last_seq: int = 0) -> PortPoll:
    async def on_events(events: list[LinkEvent]) -> None:
        seen.extend(events)

    return PortPoll(
        reader, node="n1", interval=0.01, clock=lambda: 100.0,
        last_seq=lambda: last_seq, on_events=on_events,
    )  # fmt: skip


async def test_baseline_then_a_change_is_one_event_after_the_last_seq() -> None:
    seen: list[LinkEvent] = []
    poll = make_poll(ScriptedReader(UP, UP, DOWN), seen, last_seq=41)
    await poll.baseline()
    assert poll.states == UP
    async with polling(poll):
        await wait_until(lambda: bool(seen), what="a port-state event")
    assert [(e.kind, e.seq, e.old_state, e.new_state) for e in seen] == [
        ("port-state", 42, "ACTIVE", "DOWN")
    ]
    assert poll.states == DOWN


async def test_a_blocked_baseline_is_left_to_the_loop() -> None:
    seen: list[LinkEvent] = []
    reader = ScriptedReader(CollectionTimeout("/sys/class/infiniband", "ETIMEDOUT"), UP, UP)
    poll = make_poll(reader, seen)
    await poll.baseline()
    assert poll.states is None
    async with polling(poll):
        await wait_until(lambda: poll.states == UP, what="the first good poll")
        await wait_until(lambda: reader.reads >= 4, what="more polls")
    assert seen == []  # the first good poll is the baseline, not a change
