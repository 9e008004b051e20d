"""The alert engine's loop coalesces fleet changes: no change-triggered cycle sooner than
`EngineSettings.min_cycle_s` after the previous cycle (changes meanwhile are evaluated by
the next one), an isolated change is evaluated at once, and stopping ends a hold."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.metrics import AlertMetrics
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.rules.finding import Finding
from tests.support.waits import wait_until


def _engine(
    feed: ChangeFeed, settings: EngineSettings, calls: list[float], registry: CollectorRegistry
) -> AlertEngine:
    def evaluate(*_: object) -> list[Finding]:
        calls.append(0.0)
        return []

    return AlertEngine(
        fleet=Fleet(), changes=feed.subscribe(), evaluate=evaluate,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=settings,
        metrics=AlertMetrics.create(registry), broker=Broker(first_id=1),
        clock=lambda: 5.0,
    )  # fmt: skip


async def test_changes_within_the_minimum_interval_wait_and_stop_ends_the_wait() -> None:
    feed, calls = ChangeFeed(), list[float]()
    engine = _engine(
        feed, EngineSettings(tick_s=3600, min_cycle_s=3600), calls, CollectorRegistry()
    )
    stop = asyncio.Event()
    running = asyncio.ensure_future(engine.run(stop))
    await wait_until(lambda: len(calls) == 1, what="the start cycle")
    for node in ("a", "b", "c"):
        feed.publish(node, "counters")
        await asyncio.sleep(0)  # let the loop take it
    stop.set()
    await asyncio.wait_for(running, 10)  # the hold ends with the stop
    assert len(calls) == 1  # no cycle per change within the interval


async def test_an_isolated_change_is_evaluated_and_a_burst_in_one_cycle() -> None:
    feed, calls, registry = ChangeFeed(), list[float](), CollectorRegistry()
    engine = _engine(feed, EngineSettings(tick_s=3600, min_cycle_s=0.05), calls, registry)
    stop = asyncio.Event()
    running = asyncio.ensure_future(engine.run(stop))
    try:
        await wait_until(lambda: len(calls) == 1, what="the start cycle")
        feed.publish("a", "counters")
        await wait_until(lambda: len(calls) == 2, what="the change's cycle")
        for node in ("a", "b", "c"):  # one burst, taken along by one cycle
            feed.publish(node, "counters")
        await wait_until(lambda: len(calls) == 3, what="the burst's cycle")
        assert (
            registry.get_sample_value("nicfleet_rule_evaluations_total", {"trigger": "change"}) == 2
        )
    finally:
        stop.set()
        await running


def test_the_default_minimum_interval_leaves_room_for_the_latency_target() -> None:
    settings = EngineSettings()
    assert 0 < settings.min_cycle_s <= 0.25 < settings.tick_s
