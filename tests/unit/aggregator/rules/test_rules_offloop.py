"""A full rule evaluation (first call, policy change) runs off the event loop: ingest keeps
applying messages meanwhile, the result equals the full evaluation of the fleet it caught
up with, and an abandoned evaluation (cancelled) leaves the next one correct."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from aggregator.alerts.wiring import MAX_ON_LOOP, AllRules
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.state import Fleet
from aggregator.rules.engine.incremental import Abandoned, IncrementalRules
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from proto.inventory import Device
from tests.support.rules_cases import T0, adapter, batch, node, policy_doc, port_counters, roce
from tests.support.waits import wait_until

NODES = 500  # large enough that a full evaluation takes many loop iterations


def _devices(i: int) -> tuple[Device, ...]:
    found = [
        adapter(f"mlx5_{a}", f"0000:{0x19 + a:02x}:00.0", fw="28.39.1002" if i % 97 == a else
                "28.41.1000", rate=200.0 if i % 89 == a else 400.0)
        for a in range(6)
    ]  # fmt: skip
    found.append(roce("mlx5_6", "0000:40:00.0", f"10.6.{i % 3}.5"))
    return tuple(found)


def _fleet() -> Fleet:
    fleet = Fleet()
    for i in range(NODES):
        fleet.apply_snapshot(node(f"n{i:05d}", *_devices(i)), received_at=T0)
    return fleet


def _counters(fleet: Fleet, i: int) -> None:
    """One ingested message: a counter batch (some over the error limit) for one node."""
    b = batch(f"n{i % NODES:05d}", port_counters(rates={"counters/symbol_error": float(i % 3)}))
    fleet.apply_counters(msgspec.structs.replace(b, seq=i + 1), received_at=T0)


async def _ingest_during(
    rules: AllRules, fleet: Fleet, evaluation: asyncio.Future[Any], first: int = 0
) -> int:
    """Apply messages while the worker runs; how many were applied before it finished
    (a short catch-up may be done before this task first runs)."""
    await wait_until(
        lambda: rules.full_evaluation_running or evaluation.done(),
        interval=0.001,
        what="the worker",
    )
    applied = 0
    while not evaluation.done():  # the loop is free: this task runs between its steps
        applied += 1
        _counters(fleet, first + applied)
        await asyncio.sleep(0)
    return applied


async def test_ingest_keeps_going_while_a_full_evaluation_runs() -> None:
    fleet = _fleet()
    rules = AllRules()
    policies = policy_doc("p", expect={"mtu": 4092})
    evaluation = asyncio.ensure_future(rules.evaluate_async(fleet, policies, NO_CLUSTER, T0))
    await wait_until(lambda: rules.full_evaluation_running, interval=0.001, what="the worker")
    copy = dict(fleet.view())  # what the worker evaluates: nothing applied since it started
    applied = await _ingest_during(rules, fleet, evaluation)
    assert applied > 0  # messages were applied before the evaluation finished
    assert list(await evaluation) == evaluate(copy, policies, NO_CLUSTER, T0)
    assert rules._incremental.rebuilds == 1
    # Many nodes changed meanwhile: the catch-up runs in the worker too, incrementally.
    assert applied > MAX_ON_LOOP or copy == dict(fleet.view())
    copy = dict(fleet.view())
    evaluation = asyncio.ensure_future(rules.evaluate_async(fleet, policies, NO_CLUSTER, T0))
    if applied > MAX_ON_LOOP:
        await _ingest_during(rules, fleet, evaluation, first=applied)
    assert list(await evaluation) == evaluate(copy, policies, NO_CLUSTER, T0)
    # Ingest quiet: caught up with the live fleet, on the loop, still incrementally.
    _counters(fleet, 10**6)
    again = await rules.evaluate_async(fleet, policies, NO_CLUSTER, T0 + 1)
    assert list(again) == evaluate(fleet.view(), policies, NO_CLUSTER, T0 + 1)
    assert rules._incremental.rebuilds == 1


async def test_a_cancelled_full_evaluation_is_abandoned_and_the_next_starts_over() -> None:
    fleet = _fleet()
    rules = AllRules()
    evaluation = asyncio.ensure_future(rules.evaluate_async(fleet, (), NO_CLUSTER, T0))
    await wait_until(lambda: rules.full_evaluation_running, interval=0.001, what="the worker")
    evaluation.cancel()
    with pytest.raises(asyncio.CancelledError):
        await evaluation
    _counters(fleet, 1)
    found = await rules.evaluate_async(fleet, (), NO_CLUSTER, T0)  # waits for the worker
    assert list(found) == evaluate(fleet.view(), (), NO_CLUSTER, T0)
    assert not rules.full_evaluation_running


def test_abandon_stops_between_rules_and_the_next_call_starts_over() -> None:
    fleet = Fleet([])
    fleet.apply_snapshot(node("n1"), received_at=T0)
    incremental = IncrementalRules()
    assert incremental.starts_over((), NO_CLUSTER, DEFAULT_THRESHOLDS)
    with pytest.raises(Abandoned):
        incremental.evaluate(fleet.view(), now=T0, abandon=lambda: True)
    assert incremental.starts_over((), NO_CLUSTER, DEFAULT_THRESHOLDS)
    assert incremental.evaluate(fleet.view(), now=T0) == evaluate(fleet.view(), now=T0)
    assert not incremental.starts_over((), NO_CLUSTER, DEFAULT_THRESHOLDS)
    assert incremental.starts_over(policy_doc("p"), NO_CLUSTER, DEFAULT_THRESHOLDS)


async def test_a_stopping_engine_abandons_its_full_evaluation_and_keeps_serving() -> None:
    from prometheus_client import CollectorRegistry

    from aggregator.alerts.delivery import Broker
    from aggregator.alerts.engine import AlertEngine, EngineSettings
    from aggregator.alerts.metrics import AlertMetrics
    from aggregator.fleet.changefeed import ChangeFeed

    fleet = _fleet()
    rules = AllRules()
    registry = CollectorRegistry()
    engine = AlertEngine(
        fleet=fleet, changes=ChangeFeed().subscribe(), evaluate=rules.evaluate_async,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(registry), broker=Broker(first_id=1), clock=lambda: T0,
    )  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.ensure_future(engine.run(stop))
    await wait_until(lambda: rules.full_evaluation_running, interval=0.001, what="the worker")
    stop.set()
    await running  # returns without waiting for the evaluation: it was abandoned
    assert engine.evaluated_at is None and engine.findings == ()
    # The next evaluation waits for the abandoned worker, then starts over, complete.
    assert await engine.cycle("start") is not None
    assert list(engine.findings) == evaluate(fleet.view(), (), NO_CLUSTER, T0)
    assert registry.get_sample_value("nicfleet_rule_evaluation_errors_total") == 0
