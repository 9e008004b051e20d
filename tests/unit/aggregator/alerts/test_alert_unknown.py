"""An open alert whose rule can no longer judge its subject is unknown, not resolved: the
lifecycle alone (an injected `unjudged`), and rail-mismatch end to end (a port going down
took its rate away; before, that read as "resolved")."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from aggregator.alerts.lifecycle import (
    UNKNOWN_KEY,
    LifecycleSettings,
    RuleTiming,
    Step,
    Tracked,
    firing,
    listed,
    step,
)
from aggregator.fleet.state import NodeRecord
from aggregator.rules.engine.registry import cannot_judge, evaluate
from aggregator.rules.finding import Finding
from aggregator.rules.fleetpolicy import rail_unjudged
from proto.inventory import Device, PortStateName
from proto.messages.alerts import Alert
from tests.support.rules_cases import T0, adapter, fleet_of, node

RAIL = Finding(rule="rail-mismatch", severity="warning", node="c", subject="mlx5_0",
               message="m", evidence={"peers_rate_gbps": 400.0})  # fmt: skip
SETTINGS = LifecycleSettings(default=RuleTiming(clear_s=10.0))


def _gone(alert: Alert) -> str:
    return "port 1 DOWN"


def _fired() -> dict[str, Tracked]:
    return dict(step({}, [RAIL], 0.0, SETTINGS).states)


def test_an_unjudged_absence_is_unknown_open_and_not_notified() -> None:
    result = step(_fired(), [], 1.0, SETTINGS, unjudged=_gone)
    (state,) = result.states.values()
    assert result.transitions == ()
    assert state.phase == "unknown" and state.alert.state == "firing"
    assert state.alert.evidence[UNKNOWN_KEY] == "port 1 DOWN"
    assert firing(result.states) == listed(result.states) == [state.alert]
    # Long after resolveAfter, still unknown while it cannot be judged; the same object.
    later = step(result.states, [], 500.0, SETTINGS, unjudged=_gone)
    assert later.transitions == () and later.states == result.states and not later.changed


def test_judged_again_and_absent_resolves_only_after_resolve_after() -> None:
    unknown = step(_fired(), [], 1.0, SETTINGS, unjudged=_gone).states
    judged = step(unknown, [], 100.0, SETTINGS)  # the clock starts when it can judge again
    (state,) = judged.states.values()
    assert judged.transitions == () and state.phase == "firing"
    assert UNKNOWN_KEY not in state.alert.evidence
    assert [a.state for a in step(judged.states, [], 109.0, SETTINGS).transitions] == []
    assert [a.state for a in step(judged.states, [], 110.0, SETTINGS).transitions] == ["resolved"]


def test_judged_again_and_found_fires_on_without_a_notification() -> None:
    unknown = step(_fired(), [], 1.0, SETTINGS, unjudged=_gone).states
    back = step(unknown, [RAIL], 2.0, SETTINGS)
    (state,) = back.states.values()
    assert back.transitions == () and state.phase == "firing"
    assert state.alert.starts_at == 0.0 and UNKNOWN_KEY not in state.alert.evidence


def test_a_pending_alert_that_cannot_be_judged_is_forgotten_as_before() -> None:
    slow = LifecycleSettings(default=RuleTiming(for_s=30.0))
    pending = step({}, [RAIL], 0.0, slow).states
    result = step(pending, [], 1.0, slow, unjudged=_gone)
    assert result.states == {} and result.transitions == ()


def _rails(c_state: PortStateName = "ACTIVE", c_rate: float = 200.0) -> Mapping[str, NodeRecord]:
    """Rail 0 of three nodes: 400 Gb/s on a and b, `c_rate` on c."""
    return fleet_of(
        node("a", adapter()), node("b", adapter()),
        node("c", adapter(state=c_state, phys=None if c_state == "ACTIVE" else "Disabled",
                          rate=c_rate)),
    ).fleet()  # fmt: skip


def _cycle(states: Mapping[str, Tracked], fleet: Mapping[str, NodeRecord], now: float) -> Step:
    found = [f for f in evaluate(fleet, now=T0 + now) if f.rule == "rail-mismatch"]

    def unjudged(alert: Alert) -> str | None:
        return cannot_judge(fleet, alert.rule, alert.node, alert.subject, alert.evidence)

    return step(states, found, now, SETTINGS, unjudged=unjudged)


def test_rail_mismatch_port_down_is_unknown_then_fixed_resolves() -> None:
    fired = _cycle({}, _rails(), 0.0)
    assert [(a.node, a.subject, a.state) for a in fired.transitions] == [("c", "mlx5_0", "firing")]
    down = _cycle(fired.states, _rails("DOWN"), 1.0)
    assert down.transitions == ()  # before: "resolved" — a down port fixed nothing
    (state,) = down.states.values()
    assert state.phase == "unknown"
    assert state.alert.evidence[UNKNOWN_KEY] == (
        "mlx5_0 has port 1 DOWN/Disabled: its rate_gbps cannot be compared with its rail's"
    )
    still = _cycle(down.states, _rails("ACTIVE", 200.0), 2.0)  # up again, still slow
    assert still.transitions == () and [s.phase for s in still.states.values()] == ["firing"]
    fixed = _cycle(still.states, _rails("ACTIVE", 400.0), 3.0)
    assert fixed.transitions == ()  # resolveAfter (10 s here) runs from now
    assert [a.state for a in _cycle(fixed.states, _rails("ACTIVE", 400.0), 13.0).transitions] == [
        "resolved"
    ]


@pytest.mark.parametrize(
    ("fleet", "evidence", "reason"),
    [
        pytest.param(_rails("DOWN"), {"peers_rate_gbps": "400.0"},
                     "mlx5_0 has port 1 DOWN/Disabled: its rate_gbps cannot be compared with "
                     "its rail's", id="port-down-took-the-rate"),
        pytest.param(_rails("DOWN"), {"peers_subnet": "fe80::"}, None,
                     id="port-down-but-the-subnet-is-still-known"),
        pytest.param(_rails(), {"peers_rate_gbps": "400.0"}, None, id="judgeable"),
        pytest.param(fleet_of(node("c")).fleet(), {}, None, id="adapter-still-there"),
        pytest.param(fleet_of(node("c", adapter("mlx5_1"))).fleet(), {},
                     "mlx5_0 is no longer in the node's inventory", id="adapter-gone"),
        pytest.param({}, {}, "no inventory snapshot of the node", id="node-gone"),
    ],
)  # fmt: skip
def test_rail_unjudged(
    fleet: Mapping[str, NodeRecord], evidence: dict[str, str], reason: str | None
) -> None:
    assert rail_unjudged(fleet.get("c"), "mlx5_0", evidence) == reason


def test_rules_without_an_unjudged_check_always_judge() -> None:
    assert cannot_judge({}, "port-down", "c", "mlx5_0/1", {}) is None


async def test_the_engine_keeps_an_unknown_alert_open_and_sends_nothing() -> None:
    from prometheus_client import CollectorRegistry

    from aggregator.alerts.delivery import Broker
    from aggregator.alerts.engine import AlertEngine, EngineSettings
    from aggregator.alerts.metrics import AlertMetrics
    from aggregator.cluster import NO_CLUSTER
    from aggregator.fleet.changefeed import ChangeFeed
    from aggregator.fleet.state import Fleet

    rounds: list[list[Finding]] = [[RAIL], []]
    asked: list[tuple[str, str, str]] = []

    def judge_gone(
        fleet: Mapping[str, NodeRecord], rule: str, node: str, subject: str,
        evidence: Mapping[str, str],
    ) -> str | None:  # fmt: skip
        asked.append((rule, node, subject))
        return "port 1 DOWN"

    registry = CollectorRegistry()
    engine = AlertEngine(
        fleet=Fleet(), changes=ChangeFeed().subscribe(), evaluate=lambda *_: rounds.pop(0),
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(registry), broker=Broker(first_id=1), clock=lambda: 5.0,
        judge_gone=judge_gone,
    )  # fmt: skip
    await engine.cycle("test")
    await engine.cycle("test")
    assert asked == [("rail-mismatch", "c", "mlx5_0")]
    assert [a.evidence[UNKNOWN_KEY] for a in engine.firing()] == ["port 1 DOWN"]
    assert engine.broker.last_id == 1  # the firing only: no resolve was sent
    (gauge,) = engine.metrics.firing.collect()  # not registered: FleetCollector exports it
    assert [s.value for s in gauge.samples] == [1.0]


def _one(*devices: Device) -> Mapping[str, NodeRecord]:
    return fleet_of(node("c", *devices)).fleet()


@pytest.mark.parametrize(
    ("fleet", "reason"),
    [
        pytest.param(_one(adapter(rate=200.0)), None, id="active-judgeable"),
        pytest.param(_one(adapter(state="DOWN")),
                     "mlx5_0/1 is DOWN/Disabled: a port that is not ACTIVE has no rate to "
                     "compare", id="port-down"),
        pytest.param(_one(adapter("mlx5_1")), "mlx5_0 is no longer in the node's inventory",
                     id="adapter-gone"),
        pytest.param({}, "no inventory snapshot of the node", id="node-gone"),
    ],
)  # fmt: skip
def test_rate_mismatch_cannot_judge_a_port_that_is_not_active(
    fleet: Mapping[str, NodeRecord], reason: str | None
) -> None:
    assert cannot_judge(fleet, "rate-mismatch", "c", "mlx5_0/1", {}) == reason


@pytest.mark.parametrize(
    ("fleet", "reason"),
    [
        pytest.param(_one(adapter(state="DOWN")), None, id="port-down-mtu-still-judged"),
        pytest.param(_one(adapter(netdev="ib9")), "ib0 (mlx5_0/1) is no longer a netdev of mlx5_0",
                     id="netdev-gone"),
        pytest.param(_one(adapter("mlx5_1")), "mlx5_0 is no longer in the node's inventory",
                     id="adapter-gone"),
    ],
)  # fmt: skip
def test_mtu_mismatch_cannot_judge_a_netdev_that_went_away(
    fleet: Mapping[str, NodeRecord], reason: str | None
) -> None:
    assert cannot_judge(fleet, "mtu-mismatch", "c", "mlx5_0/1", {"netdev": "ib0"}) == reason
