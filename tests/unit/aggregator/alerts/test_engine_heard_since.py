"""A node loaded from KV and not heard from since this process could hear it (`heard_since`)
keeps its alerts as they were: a firing agent-stale alert is neither resolved nor notified
again while the rule cannot judge it, resolves once the node is heard, and a node that stays
silent is reported once staleAfter has passed since `heard_since`."""

from __future__ import annotations

from types import MappingProxyType

import msgspec
from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.lifecycle import LifecycleSettings, step
from aggregator.alerts.metrics import AlertMetrics
from aggregator.alerts.wiring import AllRules
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules.finding import Finding

T0 = 1_000_000.0
HEARD = T0 + 300.0  # the new process's subscription; the record was received at T0


class Clock:
    def __init__(self) -> None:
        self.now = HEARD

    def __call__(self) -> float:
        return self.now


def _engine(fleet: Fleet, clock: Clock) -> AlertEngine:
    heard = MappingProxyType({"n1": HEARD})
    rules = AllRules(heard_since=lambda: heard)
    return AlertEngine(
        fleet=fleet, changes=ChangeFeed().subscribe(), evaluate=rules.evaluate,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
        clock=clock, heard_since=lambda: heard,
    )  # fmt: skip


def _loaded() -> Fleet:
    return Fleet([NodeRecord(name="n1", first_seen=T0, last_seen=T0)])


async def _transitions(engine: AlertEngine, clock: Clock, now: float) -> list[tuple[str, str]]:
    """agent-stale's (the record has no snapshot: data-quality reports that)."""
    clock.now = now
    done = await engine.cycle("tick")
    assert done is not None
    return [(a.rule, a.state) for a in done.transitions if a.rule == "agent-stale"]


def _stale_finding() -> Finding:
    return Finding(rule="agent-stale", severity="critical", node="n1", subject="agent",
                   message="silent", evidence={})  # fmt: skip


async def test_a_loaded_firing_agent_stale_alert_stays_until_the_node_is_heard() -> None:
    fleet, clock = _loaded(), Clock()
    engine = _engine(fleet, clock)
    engine.load(step({}, [_stale_finding()], T0 + 40, LifecycleSettings()).states)
    # The finding is absent (30 s from HEARD not passed) and no start grace runs (`cycle`
    # called directly): only heard_since holds it.
    assert await _transitions(engine, clock, HEARD + 1) == []
    assert await _transitions(engine, clock, HEARD + 20) == []
    assert [s.phase for s in engine.states.values() if s.alert.rule == "agent-stale"] == ["firing"]
    assert await _transitions(engine, clock, HEARD + 31) == []  # reported again: no re-notify
    record = fleet.get("n1")
    assert record is not None
    fleet.load(msgspec.structs.replace(record, last_seen=HEARD + 32))  # heard: alive
    assert await _transitions(engine, clock, HEARD + 33) == [("agent-stale", "resolved")]


async def test_a_healthy_loaded_node_alerts_nothing_and_a_silent_one_after_the_limit() -> None:
    fleet, clock = _loaded(), Clock()
    engine = _engine(fleet, clock)
    # Counts from HEARD, not from T0 (300 s before): nothing during staleAfter (30 s).
    assert await _transitions(engine, clock, HEARD + 1) == []
    assert await _transitions(engine, clock, HEARD + 30) == []
    assert await _transitions(engine, clock, HEARD + 31) == [("agent-stale", "firing")]
