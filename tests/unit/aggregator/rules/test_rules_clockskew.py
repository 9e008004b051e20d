"""clock-skew: the estimate of an agent's clock offset (aggregator.fleet.clockoffset) and the
warning it raises beyond the tolerance, either way, resolving once the clock is back."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.fleet import clockoffset
from aggregator.fleet.clockoffset import ClockOffset
from aggregator.fleet.state import Fleet
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from tests.support.builders import T0, counters, snapshot

EPOCH = round(T0 * 1e9)


def samples(pairs: list[tuple[float, float]]) -> ClockOffset | None:
    clock = None
    for stamped, received in pairs:
        clock = clockoffset.observe(clock, stamped, received)
    return clock


@pytest.mark.parametrize(
    ("pairs", "offset"),
    [
        pytest.param([(T0, T0)], 0.0, id="in-step"),
        # Transit only delays: the least delayed message tells the offset.
        pytest.param([(T0 + 600, T0 + 3), (T0 + 601, T0 + 1), (T0 + 602, T0 + 4)], 600.0,
                     id="ahead-600s-delays-removed"),
        pytest.param([(T0 - 20, T0 + 1), (T0 - 19, T0 + 0.5)], -19.5, id="behind"),
        # Samples older than two windows are forgotten: a clock corrected under a running
        # agent shows within 60 s.
        pytest.param([(T0 + 600, T0), (T0 + 31, T0 + 31), (T0 + 62, T0 + 62)], 0.0,
                     id="corrected-two-windows-later"),
        pytest.param([(T0 + 600, T0), (T0 + 31, T0 + 31)], 600.0, id="previous-window-kept"),
        pytest.param([(T0 + 5, T0), (float("nan"), T0 + 1)], 5.0, id="nan-stamp-skipped"),
    ],
)  # fmt: skip
def test_offset_estimate(pairs: list[tuple[float, float]], offset: float) -> None:
    clock = samples(pairs)
    assert clock is not None and clock.offset_s == pytest.approx(offset)


def test_an_unmoved_estimate_is_the_same_object() -> None:
    clock = samples([(T0 + 10, T0)])
    assert clockoffset.observe(clock, T0 + 10, T0 + 5) is clock  # a more delayed sample


def skew_findings(fleet: Fleet, now: float) -> list[Finding]:
    return [f for f in evaluate(fleet.view(), now=now) if f.rule == "clock-skew"]


def test_a_clock_600s_ahead_is_a_warning_naming_the_offset_and_resolves_on_restart() -> None:
    fleet = Fleet()
    ahead = round((T0 + 600) * 1e9)
    for i in range(5):
        batch = counters(seq=i + 1, collected_at=T0 + 600 + i)
        # 0.2 s, then 1.2 s ... of transit: the estimate takes the least delayed.
        fleet.apply_counters(msgspec.structs.replace(batch, epoch=ahead), T0 + i + 0.2 + i % 2)
    (finding,) = skew_findings(fleet, T0 + 5)
    assert finding.severity == "warning" and finding.node == "gpu-001"
    assert finding.subject == "clock"
    assert finding.evidence == {"offset_s": 599.8, "direction": "ahead", "tolerance_s": 5.0}
    assert "599.8s ahead of" in finding.message
    # Restarted with the clock fixed: a new process, a new estimate, resolved at once.
    restarted = msgspec.structs.replace(snapshot(collected_at=T0 + 10), epoch=round((T0 + 9) * 1e9))
    assert fleet.apply_snapshot(restarted, T0 + 10.1).applied
    assert skew_findings(fleet, T0 + 11) == []


def test_behind_beyond_the_tolerance_and_inside_it() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(msgspec.structs.replace(snapshot(collected_at=T0 - 8), epoch=EPOCH), T0)
    (finding,) = skew_findings(fleet, T0)
    assert finding.evidence["offset_s"] == -8.0 and finding.evidence["direction"] == "behind"
    assert "8.0s behind the aggregator's" in finding.message
    near = Fleet()
    near.apply_snapshot(msgspec.structs.replace(snapshot(collected_at=T0 + 4), epoch=EPOCH), T0)
    assert skew_findings(near, T0) == []


def test_the_tolerance_is_a_policy_threshold() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(msgspec.structs.replace(snapshot(collected_at=T0 + 4), epoch=EPOCH), T0)
    strict = DEFAULT_THRESHOLDS.with_rule(
        "clock-skew", params={**DEFAULT_THRESHOLDS.of("clock-skew").params, "toleranceS": 1.0}
    )
    found = [f for f in evaluate(fleet.view(), now=T0, thresholds=strict) if f.rule == "clock-skew"]
    assert [f.evidence["offset_s"] for f in found] == [4.0]


def test_a_clock_corrected_under_a_running_agent_resolves_within_two_windows() -> None:
    fleet = Fleet()
    fleet.apply_counters(
        msgspec.structs.replace(counters(seq=1, collected_at=T0 + 30), epoch=EPOCH), T0
    )
    assert skew_findings(fleet, T0)
    for i in range(2, 70):
        batch = counters(seq=i, collected_at=T0 + i)
        fleet.apply_counters(msgspec.structs.replace(batch, epoch=EPOCH), T0 + i)
    assert skew_findings(fleet, T0 + 70) == []
