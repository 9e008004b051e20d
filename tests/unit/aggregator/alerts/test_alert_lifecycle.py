"""Alert lifecycle with an injected clock: for, hysteresis, flap damping, resolve, restart."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from aggregator.alerts.delivery import Broker, alert_subject
from aggregator.alerts.lifecycle import (
    FLEET_NODE,
    LifecycleSettings,
    RuleTiming,
    Tracked,
    fingerprint,
    listed,
    step,
)
from aggregator.rules.finding import Finding
from proto.codec import decode, encode
from proto.messages.alerts import Alert


def port_down(
    node: str | None = "node-1", subject: str = "mlx5_0/1", **evidence: object
) -> Finding:
    return Finding(
        rule="port-down",
        severity="critical",
        node=node,
        subject=subject,
        message="Port is down.",
        evidence=evidence,  # type: ignore[arg-type]
    )


def run(
    timeline: Sequence[tuple[float, Sequence[Finding]]],
    settings: LifecycleSettings,
    states: dict[str, Tracked] | None = None,
) -> tuple[dict[str, Tracked], list[tuple[float, str]]]:
    """Feed (now, findings) rounds; return the final states and (now, state) transitions."""
    current = dict(states or {})
    seen: list[tuple[float, str]] = []
    for now, findings in timeline:
        result = step(current, findings, now, settings)
        current = result.states
        seen += [(now, alert.state) for alert in result.transitions]
    return current, seen


P = [port_down()]
NONE: list[Finding] = []


@pytest.mark.parametrize(
    ("timing", "timeline", "expected"),
    [
        pytest.param(RuleTiming(), [(0, P)], [(0, "firing")], id="for-0-fires-at-once"),
        pytest.param(
            RuleTiming(for_s=10),
            [(0, P), (5, P), (9.9, P), (10, P), (11, P)],
            [(10, "firing")],
            id="for-10-fires-after-10s",
        ),
        pytest.param(
            RuleTiming(for_s=10), [(0, P), (5, NONE), (6, P), (15, P)], [], id="for-resets"
        ),
        pytest.param(
            RuleTiming(),
            [(0, P), (1, P), (2, NONE), (3, NONE)],
            [(0, "firing"), (2, "resolved")],
            id="resolve-once",
        ),
        pytest.param(
            RuleTiming(clear_s=5),
            [(0, P), (1, NONE), (3, NONE), (4, P), (5, NONE), (9.9, NONE), (10, NONE)],
            [(0, "firing"), (10, "resolved")],
            id="hysteresis",
        ),
        pytest.param(
            RuleTiming(),
            [(0, P), (1, NONE), (2, P)],
            [(0, "firing"), (1, "resolved"), (2, "firing")],
            id="refires-after-resolve",
        ),
    ],
)
def test_transitions(
    timing: RuleTiming,
    timeline: list[tuple[float, list[Finding]]],
    expected: list[tuple[float, str]],
) -> None:
    settings = LifecycleSettings(timings={"port-down": timing})
    _, seen = run(timeline, settings)
    assert seen == expected


def test_flapping_alert_stays_firing_until_quiet_for_the_window() -> None:
    settings = LifecycleSettings(flap_count=3, flap_window_s=100)
    timeline: list[tuple[float, Sequence[Finding]]] = [
        (0, P), (1, NONE), (2, P), (3, NONE), (4, P), (5, NONE), (6, P), (50, NONE),
    ]  # fmt: skip
    states, seen = run(timeline, settings)
    assert seen == [(0, "firing"), (1, "resolved"), (2, "firing"), (3, "resolved"), (4, "firing")]
    (state,) = states.values()
    assert state.phase == "firing" and state.flapping
    assert state.alert.evidence["flapping"] == "true"
    # Quiet for the whole window: resolves once, and the flap history ages out.
    states, seen = run([(149, NONE), (150, NONE)], settings, states)
    assert seen == [(150, "resolved")]
    states, seen = run([(400, P)], settings, states)
    assert seen == [(400, "firing")]
    assert not next(iter(states.values())).flapping


def test_restart_from_persisted_state_does_not_renotify() -> None:
    settings = LifecycleSettings()
    states, seen = run([(0, P)], settings)
    assert seen == [(0, "firing")]
    # What KV holds survives a codec round trip; a "new process" continues from it.
    restored = {key: decode(encode(state), Tracked) for key, state in states.items()}
    states2, seen2 = run([(100, P), (101, P)], settings, restored)
    assert seen2 == []
    assert next(iter(states2.values())).alert.starts_at == 0
    _, seen3 = run([(102, NONE)], settings, states2)
    assert seen3 == [(102, "resolved")]


def test_evidence_update_is_not_a_transition_but_severity_change_is() -> None:
    settings = LifecycleSettings()
    states, _ = run([(0, [port_down(rate=1)])], settings)
    result = step(states, [port_down(rate=2)], 1, settings)
    assert result.transitions == ()
    assert next(iter(result.states.values())).alert.evidence == {"rate": "2"}
    warning = Finding(
        rule="port-down", severity="warning", node="node-1", subject="mlx5_0/1", message="m"
    )
    result = step(result.states, [warning], 2, settings)
    assert [a.severity for a in result.transitions] == ["warning"]


def test_alert_fields_fingerprint_and_evidence_are_strings() -> None:
    finding = port_down(state="DOWN", up=False, rate=None, errors=3, nan=float("nan"))
    (alert,) = step({}, [finding], 5.0, LifecycleSettings()).transitions
    assert alert.fingerprint == fingerprint("port-down", "node-1", "mlx5_0/1")
    assert len(alert.fingerprint) == 32 and alert.fingerprint.isalnum()
    assert alert.evidence == {
        "state": "DOWN", "up": "false", "rate": "null", "errors": "3", "nan": "nan",
    }  # fmt: skip
    assert (alert.rule, alert.severity, alert.state, alert.node) == (
        "port-down", "critical", "firing", "node-1",
    )  # fmt: skip
    assert alert.starts_at == 5.0 and alert.ends_at is None


def test_fleet_wide_findings_use_the_reserved_node_token() -> None:
    finding = Finding(
        rule="driver-skew", severity="warning", node=None, subject="mlx5_core", message="m"
    )
    (alert,) = step({}, [finding], 0, LifecycleSettings()).transitions
    assert alert.node == FLEET_NODE
    assert alert_subject(alert) == "nicfleet.v1.alert.warning.driver-skew._fleet"


def test_node_names_with_dots_become_one_subject_token() -> None:
    (alert,) = step({}, [port_down(node="gpu.rack-1")], 0, LifecycleSettings()).transitions
    assert alert_subject(alert) == "nicfleet.v1.alert.critical.port-down.gpu_rack-1"


def test_duplicate_fingerprints_keep_the_most_severe() -> None:
    warning = Finding(
        rule="port-down", severity="warning", node="node-1", subject="mlx5_0/1", message="w"
    )
    (alert,) = step({}, [warning, port_down()], 0, LifecycleSettings()).transitions
    assert alert.severity == "critical"


def test_pending_is_not_listed_and_never_fired_pending_is_forgotten() -> None:
    settings = LifecycleSettings(timings={"port-down": RuleTiming(for_s=10)})
    result = step({}, P, 0, settings)
    assert listed(result.states) == [] and result.changed
    result = step(result.states, NONE, 1, settings)
    assert result.states == {} and result.removed and result.transitions == ()


def test_resolved_alerts_are_forgotten_after_retention() -> None:
    settings = LifecycleSettings(resolved_retention_s=60, flap_window_s=10)
    states, _ = run([(0, P), (1, NONE)], settings)
    assert [a.state for a in listed(states)] == ["resolved"]
    result = step(states, NONE, 62, settings)
    assert result.states == {} and result.removed


def alert(n: int) -> Alert:
    return Alert(
        rule="port-down", severity="critical", state="firing", node="n", subject=str(n),
        message="m", starts_at=float(n), fingerprint=f"f{n}",
    )  # fmt: skip


def test_broker_resume_window_and_slow_client() -> None:
    dropped: list[int] = []
    broker = Broker(first_id=100, ring_size=4, client_queue=2, on_drop=lambda: dropped.append(1))
    broker.publish([alert(1), alert(2), alert(3)])
    assert broker.last_id == 102
    _, backlog = broker.subscribe(100)
    assert backlog is not None and [e.id for e in backlog] == [101, 102]
    _, backlog = broker.subscribe(102)
    assert backlog == []
    assert broker.subscribe(None)[1] is None  # fresh client: resync
    assert broker.subscribe(5000)[1] is None  # id from the future (other process): resync
    broker.publish([alert(4), alert(5), alert(6)])  # ring keeps 102..105
    assert broker.subscribe(100)[1] is None  # too old
    slow, _ = broker.subscribe(105)
    broker.publish([alert(7), alert(8)])
    assert not slow.dropped
    broker.publish([alert(9)])
    assert slow.dropped and dropped


def test_held_nodes_keep_firing_alerts_while_their_finding_is_absent() -> None:
    settings = LifecycleSettings()
    states, _ = run([(0, P)], settings)
    result = step(states, NONE, 1, settings, held=frozenset({"node-1"}))
    assert result.transitions == () and result.states == states
    result = step(result.states, NONE, 2, settings)
    assert [a.state for a in result.transitions] == ["resolved"]


async def test_engine_keeps_alerts_when_evaluation_raises() -> None:
    from prometheus_client import CollectorRegistry

    from aggregator.alerts.engine import AlertEngine, EngineSettings
    from aggregator.alerts.metrics import AlertMetrics
    from aggregator.cluster import NO_CLUSTER
    from aggregator.fleet.changefeed import ChangeFeed
    from aggregator.fleet.state import Fleet

    outcomes: list[list[Finding] | Exception] = [P, RuntimeError("rule bug"), NONE]

    def evaluate(*_: object) -> list[Finding]:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    registry = CollectorRegistry()
    engine = AlertEngine(
        fleet=Fleet(), changes=ChangeFeed().subscribe(), evaluate=evaluate,
        policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
        metrics=AlertMetrics.create(registry), broker=Broker(first_id=1), clock=lambda: 5.0,
    )  # fmt: skip
    await engine.cycle("test")
    assert [a.state for a in engine.firing()] == ["firing"]
    assert await engine.cycle("test") is None  # the bug: nothing resolves, nothing is lost
    assert [a.subject for a in engine.firing()] == ["mlx5_0/1"]
    assert registry.get_sample_value("nicfleet_rule_evaluation_errors_total") == 1
    await engine.cycle("test")
    assert engine.firing() == [] and engine.broker.last_id == 2


class _MemoryStore:
    """The persisted alert states a previous leader left behind (AlertStore's contract)."""

    def __init__(self) -> None:
        self.saved: dict[str, object] = {}

    async def load(self) -> dict[str, object]:
        return dict(self.saved)

    async def save(self, states: dict[str, object], durable: set[str], removed: set[str]):
        self.saved = dict(states)
        return len(durable), 0


async def test_followers_serve_findings_but_only_the_leader_notifies() -> None:
    from prometheus_client import CollectorRegistry

    from aggregator.alerts.engine import AlertEngine, EngineSettings
    from aggregator.alerts.metrics import AlertMetrics
    from aggregator.cluster import NO_CLUSTER
    from aggregator.fleet.changefeed import ChangeFeed
    from aggregator.fleet.state import Fleet

    store = _MemoryStore()

    def engine(leading: list[bool]) -> AlertEngine:
        return AlertEngine(
            fleet=Fleet(), changes=ChangeFeed().subscribe(), evaluate=lambda *_: P,
            policies=lambda: (), cluster=lambda: NO_CLUSTER, settings=EngineSettings(),
            metrics=AlertMetrics.create(CollectorRegistry()), broker=Broker(first_id=1),
            store=store, clock=lambda: 5.0, is_leader=lambda: leading[0],  # type: ignore[arg-type]
        )  # fmt: skip

    leader, follower = engine([True]), engine(follower_leads := [False])
    leader._started_at = follower._started_at = 1.0
    await leader.cycle("test")
    assert leader.broker.last_id == 1  # notified once
    await follower.cycle("test")
    assert follower.findings == tuple(P)  # serves findings
    assert follower.firing() == [] and follower.broker.last_id == 0  # but never notifies
    # The leader dies; the follower takes over from what it persisted: still firing,
    # not sent again.
    follower_leads[0] = True
    await follower.cycle("test")
    assert [a.subject for a in follower.firing()] == ["mlx5_0/1"]
    assert follower.broker.last_id == 0
