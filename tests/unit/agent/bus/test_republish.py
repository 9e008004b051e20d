"""Republish scheduling (pure, injected clock and draws), the agent's handling of resync
requests and the aggregator's spread: jitter, dedup, rate limit, bad payloads."""

from __future__ import annotations

import asyncio

import looptime
import msgspec
import pytest

from agent.bus.republish import RepublishControl
from agent.bus.republishpacing import RepublishPolicy, RepublishSchedule
from aggregator.bus.resyncrequest import request_spread
from proto.codec import encode
from proto.messages.control import MAX_RESYNC_SPREAD_S, ResyncRequest
from tests.support.waits import wait_until


def request(spread_s: float = 0.0) -> bytes:
    return encode(ResyncRequest(reason="start", spread_s=spread_s, requested_at=1.0))


def test_first_request_is_due_within_the_jitter_window() -> None:
    schedule = RepublishSchedule(RepublishPolicy(jitter_s=5.0, min_interval_s=30.0))
    assert schedule.request(100.0, draw=0.0) == 100.0
    assert not RepublishSchedule(schedule.policy).take(100.0)  # nothing pending there
    schedule = RepublishSchedule(schedule.policy)
    assert schedule.request(100.0, draw=0.5) == 102.5
    assert not schedule.take(102.4)
    assert schedule.take(102.5)
    assert schedule.due is None
    assert not schedule.take(200.0)  # answered once


def test_many_requests_in_the_window_cause_one_republish() -> None:
    schedule = RepublishSchedule(RepublishPolicy(jitter_s=5.0, min_interval_s=0.0))
    assert schedule.request(0.0, draw=0.8) == 4.0
    for i in range(1, 100):  # 99 more requests before the answer is due
        assert schedule.request(i * 0.04, draw=0.1) is None
    answered = [t / 10 for t in range(0, 100) if schedule.take(t / 10)]
    assert answered == [4.0]


def test_requests_after_an_answer_wait_for_the_rate_limit() -> None:
    schedule = RepublishSchedule(RepublishPolicy(jitter_s=2.0, min_interval_s=30.0))
    schedule.request(0.0, draw=0.0)
    assert schedule.take(0.0)
    # A request right after the answer is deferred, not dropped: the aggregator may have
    # (re)connected after the answer went out.
    assert schedule.request(1.0, draw=0.5) == 31.0
    assert not schedule.take(30.9)
    assert schedule.take(31.0)
    # A hostile flood: one answer per min_interval at most.
    answers = 0
    for tick in range(0, 3000):  # 300 s, a request every 100 ms
        now = 31.0 + tick / 10
        schedule.request(now, draw=0.99)
        answers += schedule.take(now)
    assert answers <= 300 // 30


@pytest.mark.parametrize(
    ("spread", "window"),
    [
        pytest.param(0.0, 5.0, id="own-jitter-is-the-minimum"),
        pytest.param(60.0, 60.0, id="aggregator-widens"),
        pytest.param(1e9, MAX_RESYNC_SPREAD_S, id="capped"),
        pytest.param(-3.0, 5.0, id="negative-ignored"),
        pytest.param(float("nan"), 5.0, id="nan-ignored"),
    ],
)
def test_spread_from_the_request_widens_the_window(spread: float, window: float) -> None:
    schedule = RepublishSchedule(RepublishPolicy(jitter_s=5.0))
    assert schedule.request(10.0, draw=1.0, spread_s=spread) == 10.0 + window


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"jitter_s": -1.0}, id="negative-jitter"),
        pytest.param({"jitter_s": 1e6}, id="huge-jitter"),
        pytest.param({"min_interval_s": -1.0}, id="negative-interval"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="republish"):
        RepublishPolicy(**kwargs)


@pytest.mark.parametrize(
    ("nodes", "rate", "spread"),
    [
        pytest.param(0, 200.0, 0.0, id="empty-fleet"),
        pytest.param(10_000, 200.0, 50.0, id="ten-thousand"),
        pytest.param(1_000_000, 200.0, MAX_RESYNC_SPREAD_S, id="capped"),
        pytest.param(10, 0.0, MAX_RESYNC_SPREAD_S, id="no-rate"),
    ],
)
def test_aggregator_spreads_answers_by_fleet_size(nodes: int, rate: float, spread: float) -> None:
    assert request_spread(nodes, rate) == spread


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xc1junk", id="garbage"),
        pytest.param(msgspec.msgpack.encode({"schema": "nicfleet.v1.Alert"}), id="other-schema"),
        pytest.param(
            msgspec.msgpack.encode(
                {"schema": "nicfleet.v1.ResyncRequest", "requested_at": 1.0, "spread_s": -1.0}
            ),
            id="negative-spread",
        ),
    ],
)
def test_bad_requests_are_counted_and_ignored(payload: bytes) -> None:
    control = RepublishControl(RepublishPolicy(), monotonic=Clock(), draw=lambda: 0.0)
    control.handle(payload)
    control.handle(payload)
    assert (control.stats.rejected, control.stats.requests, control.pending) == (2, 0, False)
    control.handle(request())  # still serving
    assert control.pending


def test_control_answers_once_per_window() -> None:
    """On the event loop's own clock, fake and fast-forwarded while the loop idles
    (looptime): the control wakes itself at the jittered moment, no test-side clock push."""
    loop = looptime.new_event_loop(start=0.0)
    control = RepublishControl(
        RepublishPolicy(jitter_s=5.0, min_interval_s=30.0), monotonic=loop.time, draw=lambda: 0.5
    )
    answered: list[float] = []

    async def republish() -> None:
        answered.append(loop.time())

    async def scenario() -> None:
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(control.run(stop, republish))
            for _ in range(50):
                control.handle(request())
            assert (control.stats.requests, control.stats.coalesced) == (50, 49)
            await wait_until(lambda: bool(answered), what="one answer")
            assert answered == [pytest.approx(2.5)]  # jitter 5 s x draw 0.5, from t=0
            control.handle(request(spread_s=60.0))  # inside the 30 s rate limit: deferred
            assert control.pending and len(answered) == 1
            stop.set()

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert control.stats.answered == 1
