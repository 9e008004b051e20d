"""Within the startup grace, fleet-level findings (peer rules) do not fire: they are
judged on the part of the fleet heard so far. One that holds fires when the grace ends;
one that was only true of the first nodes to report is never sent (before: nodes joining
one by one made transient majorities fire and resolve at every start). The engine's own
loop, a clock the test sets and a 10 ms tick."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from aggregator.alerts.delivery import Broker
from aggregator.alerts.engine import AlertEngine, EngineSettings
from aggregator.alerts.lifecycle import LifecycleSettings, RuleTiming, holding
from aggregator.alerts.metrics import AlertMetrics
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.rules.finding import Finding
from tests.support.waits import wait_until

T0 = 1_000_000.0
SKEW = Finding(rule="fw-skew", severity="warning", node="n2", subject="mlx5_0", message="m")
DOWN = Finding(rule="port-down", severity="critical", node="n1", subject="mlx5_0/1", message="m")


def test_holding_lengthens_for_of_the_rules_named_only() -> None:
    settings = LifecycleSettings(timings={"fw-skew": RuleTiming(for_s=60.0, clear_s=5.0)})
    held = holding(settings, ("fw-skew", "rail-mismatch"), 30.0)
    assert held.timing("fw-skew") == RuleTiming(for_s=60.0, clear_s=5.0)  # already longer
    assert held.timing("rail-mismatch") == RuleTiming(for_s=30.0)
    assert held.timing("port-down") == RuleTiming()


async def test_fleet_findings_wait_out_the_startup_grace_node_findings_do_not() -> None:
    clock = [T0]
    found: list[Finding] = []
    engine = AlertEngine(
        fleet=Fleet(), changes=ChangeFeed().subscribe(), evaluate=lambda *_: list(found),
        policies=lambda: (), cluster=lambda: NO_CLUSTER,
        settings=EngineSettings(tick_s=0.01, startup_grace_s=30.0),
        metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
        clock=lambda: clock[0],
    )  # fmt: skip

    async def at(now: float, *findings: Finding) -> list[tuple[str, str]]:
        found[:] = findings
        clock[0] = now
        await wait_until(lambda: engine.evaluated_at == now, what=f"a cycle at {now}")
        await wait_until(lambda: engine.evaluated_at == now and engine.findings == findings,
                         what="the findings evaluated")  # fmt: skip
        return sorted((a.rule, a.state) for a in engine.firing())

    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        assert await at(T0) == []  # the start
        assert await at(T0 + 1, SKEW, DOWN) == [("port-down", "firing")]
        assert await at(T0 + 10, DOWN) == [("port-down", "firing")]  # a transient majority
        assert await at(T0 + 20, SKEW, DOWN) == [("port-down", "firing")]
        assert await at(T0 + 29, SKEW, DOWN) == [("port-down", "firing")]
        assert await at(T0 + 30, SKEW, DOWN) == [("fw-skew", "firing"), ("port-down", "firing")]
        # Sent: port-down once, fw-skew once at the end of the grace; never a resolve.
        assert engine.broker.last_id == 2
    finally:
        stop.set()
        await task
