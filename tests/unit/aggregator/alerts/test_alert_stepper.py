"""`Stepper.step` (advancing only fingerprints whose finding changed or whose state may
move with time) equals the lifecycle's full `step` after every cycle of random sequences:
findings kept as the same objects, replaced by equal or other ones, gone and back,
severities changing, held nodes, `for`/`clear` timings, flapping, retention, reloads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from aggregator.alerts import lifecycle
from aggregator.alerts.lifecycle import LifecycleSettings, RuleTiming, Stepper, Tracked, step
from aggregator.rules.finding import Finding

SUBJECTS = ("mlx5_0/1", "mlx5_1/1", "mlx5_2/1")
NODES = ("n0", "n1")
SETTINGS = LifecycleSettings(
    timings={"port-down": RuleTiming(for_s=5, clear_s=3), "link-flap": RuleTiming(clear_s=0)},
    flap_count=3,
    flap_window_s=30,
    resolved_retention_s=20,
)


def finding(rule: str, node: str, subject: str, severity: str, value: int) -> Finding:
    return Finding(
        rule=rule,
        severity=severity,  # type: ignore[arg-type]
        node=node,
        subject=subject,
        message=f"{subject} is bad",
        evidence={"value": value},
    )


class Machine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.stepper = Stepper()
        self.states: dict[str, Tracked] = {}
        self.current: dict[tuple[str, str, str], Finding] = {}  # kept as the same objects
        self.now = 1000.0

    @rule(
        rule_id=st.sampled_from(("port-down", "link-flap", "counter-errors")),
        node=st.sampled_from(NODES),
        subject=st.sampled_from(SUBJECTS),
        severity=st.sampled_from(("critical", "warning")),
        value=st.integers(0, 2),
    )
    def put(self, rule_id: str, node: str, subject: str, severity: str, value: int) -> None:
        self.current[(rule_id, node, subject)] = finding(rule_id, node, subject, severity, value)

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        if self.current:
            self.current.pop(data.draw(st.sampled_from(sorted(self.current))))

    @rule()
    def replace_all_by_equal_copies(self) -> None:
        self.current = {k: finding(f.rule, f.node or "", f.subject, f.severity,
                                   f.evidence["value"])  # type: ignore[arg-type]
                        for k, f in self.current.items()}  # fmt: skip

    @rule()
    def reload(self) -> None:
        """As `AlertEngine.load`: states from elsewhere (a copy)."""
        self.states = dict(self.states)

    @rule(
        advance=st.sampled_from((0.0, 1.0, 2.5, 4.0, 10.0, 25.0)),
        held=st.sampled_from((frozenset(), frozenset({"n0"}))),
        duplicate=st.booleans(),
    )
    def cycle(self, advance: float, held: frozenset[str], duplicate: bool) -> None:
        self.now += advance
        findings = list(self.current.values())
        if duplicate and findings:  # a less severe duplicate of a fingerprint
            f = findings[0]
            findings.append(finding(f.rule, f.node or "", f.subject, "info", 9))
        expected = step(self.states, findings, self.now, SETTINGS, held=held)
        got = self.stepper.step(self.states, findings, self.now, SETTINGS, held=held)
        assert got.states == expected.states
        assert got.transitions == expected.transitions
        assert got.changed == expected.changed and got.removed == expected.removed
        self.states = got.states


Machine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStepperEqualsStep = Machine.TestCase


def test_unchanged_firing_alerts_are_not_advanced_again() -> None:
    stepper = Stepper()
    findings = [finding("port-down", "n0", s, "critical", 0) for s in SUBJECTS]
    fired = stepper.step({}, findings, 0.0, LifecycleSettings())
    assert len(fired.transitions) == 3
    again = stepper.step(fired.states, findings, 1.0, LifecycleSettings())
    assert again.states == fired.states and not again.changed and not again.transitions
    assert all(again.states[k] is fired.states[k] for k in fired.states)


def test_resolved_alerts_are_not_advanced_again_until_their_retention_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fleet-wide episode leaves a resolved alert per node for an hour: a cycle skips
    them (counted by the calls of `_absent`) until one would move."""
    stepper = Stepper()
    timing = LifecycleSettings(flap_window_s=10, resolved_retention_s=60)
    findings = [finding("port-down", "n0", s, "critical", 0) for s in SUBJECTS]
    fired = stepper.step({}, findings, 0.0, timing)
    resolved = stepper.step(fired.states, [], 1.0, timing)
    assert {s.phase for s in resolved.states.values()} == {"resolved"}
    calls: list[str] = []
    absent = lifecycle._absent

    def counted(old: Tracked, now: float, settings: LifecycleSettings, *rest: Any) -> Any:
        calls.append(old.alert.fingerprint)
        return absent(old, now, settings, *rest)

    monkeypatch.setattr(lifecycle, "_absent", counted)
    rested = stepper.step(resolved.states, [], 5.0, timing)
    assert not calls and rested.states == resolved.states and not rested.changed
    aged = stepper.step(rested.states, [], 11.0, timing)  # the firing left the flap window
    assert len(calls) == 3 and len(aged.changed) == 3
    assert all(not s.fired_at for s in aged.states.values())
    calls.clear()
    later = stepper.step(aged.states, [], 40.0, timing)
    assert later.states == aged.states and not calls
    gone = stepper.step(later.states, [], 61.0, timing)  # retention over: forgotten
    assert len(calls) == 3 and not gone.states and len(gone.removed) == 3
