"""Bad input to the rules: missing and absurd values become `data-quality` findings (never
a crash, never a silent all-clear); the registry's invariants; policy `alerts` validation."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from aggregator.rules.catalog import ALL_RULES, RULE_IDS, RULES
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.thresholds import (
    DEFAULT_THRESHOLDS,
    ThresholdError,
    Thresholds,
    parse_alerts,
    parse_duration,
    thresholds_for,
)
from proto.inventory import ReadError
from tests.support.rules_cases import (
    T0,
    Scenario,
    adapter,
    batch,
    fleet_of,
    hits,
    node,
    policy_doc,
    port_counters,
)

P0 = ("n1", "mlx5_0/1")


def _counters(**kw: Any) -> Scenario:
    return fleet_of(node("n1"), counters=(batch("n1", port_counters(**kw)),))


FIRES_AND_RESOLVES = [
    pytest.param(_counters(rates={"counters/symbol_error": math.nan}), {P0}, id="nan-rate"),
    pytest.param(_counters(rates={"counters/symbol_error": -3.0}), {P0}, id="negative-rate"),
    pytest.param(_counters(rates={"rx_bytes": math.inf}), {P0}, id="infinite-rate"),
    pytest.param(_counters(resets=("counters/symbol_error",)), {P0}, id="counter-went-backwards"),
    pytest.param(_counters(saturated=("counters/link_downed",)), {P0}, id="counter-saturated"),
    pytest.param(_counters(counters={"symbol_error": -1}), {P0}, id="negative-counter"),
    pytest.param(fleet_of(node("n1", adapter(state="UNKNOWN", phys=None))), {P0},
                 id="port-state-unknown"),
    pytest.param(fleet_of(node("n1", adapter(rate=math.nan))), {P0}, id="nan-link-rate"),
    pytest.param(fleet_of(node("n1", adapter(rate=-100.0))), {P0}, id="negative-link-rate"),
    pytest.param(fleet_of(node("n1", adapter(fw="garbage"))), {("n1", "mlx5_0")},
                 id="unparsable-firmware"),
    pytest.param(fleet_of(node("n1", adapter(mtu=-1))), {("n1", "mlx5_0")}, id="negative-mtu"),
    pytest.param(fleet_of(msgspec.structs.replace(node("n1"), errors=(
        ReadError(path="/class/iommu", error="EACCES"),))), {("n1", "snapshot")},
        id="unreadable-host-file"),
    pytest.param(fleet_of(node("n1", msgspec.structs.replace(adapter(), errors=(
        ReadError(path="/class/infiniband/mlx5_0/fw_ver", error="EIO"),)))), {("n1", "mlx5_0")},
        id="unreadable-device-file"),
]  # fmt: skip


@pytest.mark.parametrize(("scenario", "expected"), FIRES_AND_RESOLVES)
def test_absurd_input_is_a_data_quality_finding(
    scenario: Scenario, expected: set[tuple[str, str]]
) -> None:
    assert hits("data-quality", scenario) == expected
    clean = fleet_of(node("n1"), counters=(batch("n1", port_counters()),))
    assert hits("data-quality", clean) == set()


def test_no_snapshot_yet_is_not_bad_data_until_missing_after_has_passed() -> None:
    """A first contact often starts with a counter batch or status (the aggregator just
    started): nothing fires for what this process has not observed yet."""
    first_contact = Scenario(counters=(batch("n1"),), now=T0 + 1)
    assert {f.rule for f in first_contact.findings()} == set()
    assert hits("snapshot-missing", Scenario(counters=(batch("n1"),), now=T0 + 30)) == set()
    late = Scenario(counters=(batch("n1"),), now=T0 + 31)
    assert hits("snapshot-missing", late) == {("n1", "snapshot")}
    assert hits("data-quality", late) == set()
    (finding,) = [f for f in late.findings() if f.rule == "snapshot-missing"]
    assert finding.evidence == {"first_seen": T0, "age_s": 31.0}
    arrived = fleet_of(node("n1"), counters=(batch("n1"),), now=T0 + 31)
    assert hits("snapshot-missing", arrived) == set()


def test_reset_of_an_unwatched_counter_is_not_reported() -> None:
    assert hits("data-quality", _counters(resets=("counters/port_rcv_packets",))) == set()


def test_nan_rate_never_reads_as_all_clear() -> None:
    findings = _counters(rates={"hw_counters/req_transport_retries_exceeded": math.nan}).findings()
    assert [f.rule for f in findings] == ["data-quality"]


def test_a_rule_that_raises_becomes_a_finding_and_the_others_still_run() -> None:
    broken = Thresholds(rules={})  # agent-stale's staleAfter is missing: the rule raises
    findings = evaluate(fleet_of(node("n1", adapter(state="DOWN"))).fleet(), now=T0,
                        thresholds=broken)  # fmt: skip
    rules = {(f.rule, f.subject) for f in findings}
    assert ("data-quality", "rule/agent-stale") in rules
    assert ("port-down", "mlx5_0/1") in rules


def test_all_rules_match_the_catalogue_and_sort_is_deterministic() -> None:
    assert tuple(rule.id for rule in ALL_RULES) == RULE_IDS
    assert set(RULES) == set(RULE_IDS)
    scenario = fleet_of(node("b", adapter(state="DOWN")), node("a", adapter(state="DOWN")))
    findings = scenario.findings()
    assert [(f.node, f.rule) for f in findings][:2] == [("a", "port-down"), ("b", "port-down")]
    assert findings == scenario.findings()


def test_evaluate_on_an_empty_fleet_is_empty() -> None:
    assert evaluate({}, (), now=T0, thresholds=DEFAULT_THRESHOLDS) == []


# --- policy `alerts` ------------------------------------------------------------------


def test_parse_alerts_applies_for_resolve_thresholds_and_enabled() -> None:
    parsed = parse_alerts({
        "port-down": {"for": "500ms", "resolveAfter": "1m30s"},
        "counter-errors": {"thresholds": {"discards": 3}},
        "fw-skew": {"enabled": False},
    })  # fmt: skip
    assert parsed.of("port-down").for_s == 0.5
    assert parsed.of("port-down").resolve_s == 90.0
    assert parsed.param("counter-errors", "discards") == 3.0
    assert parsed.param("counter-errors", "physical_errors") == 1.0  # default kept
    assert not parsed.enabled("fw-skew")
    assert parsed.of("link-flap") == DEFAULT_THRESHOLDS.of("link-flap")


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        pytest.param({"port-dwon": {"for": "1s"}}, "alerts.port-dwon", id="unknown-rule-id"),
        pytest.param({"port-down": {"fro": "1s"}}, "alerts.port-down.fro", id="unknown-key"),
        pytest.param({"port-down": {"for": "soon"}}, "alerts.port-down.for", id="bad-duration"),
        pytest.param({"port-down": {"for": -1}}, "alerts.port-down.for", id="negative-duration"),
        pytest.param({"port-down": {"for": math.nan}}, "alerts.port-down.for", id="nan-duration"),
        pytest.param({"port-down": {"enabled": "yes"}}, "alerts.port-down.enabled",
                     id="enabled-not-bool"),
        pytest.param({"port-down": "fast"}, "alerts.port-down", id="entry-not-mapping"),
        pytest.param({"counter-errors": {"thresholds": {"bogus": 1}}},
                     "alerts.counter-errors.thresholds.bogus", id="unknown-threshold"),
        pytest.param({"counter-errors": {"thresholds": {"discards": -1}}},
                     "alerts.counter-errors.thresholds.discards", id="negative-threshold"),
        pytest.param({"counter-errors": {"thresholds": {"discards": "10"}}},
                     "alerts.counter-errors.thresholds.discards", id="threshold-not-number"),
        pytest.param({"port-down": {"thresholds": {"x": 1}}},
                     "alerts.port-down.thresholds.x", id="rule-without-thresholds"),
    ],
)  # fmt: skip
def test_parse_alerts_names_the_bad_key(raw: dict[str, Any], path: str) -> None:
    with pytest.raises(ThresholdError) as caught:
        parse_alerts(raw)
    assert caught.value.path == path


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30s", 30.0), ("2m", 120.0), ("1h", 3600.0), ("250ms", 0.25), (5, 5.0), (0, 0.0)],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value, "x") == seconds


def test_invalid_policy_alerts_become_a_finding_and_defaults_stay() -> None:
    good = policy_doc("a", alerts={"port-down": {"for": "2s"}})
    bad = policy_doc("b", alerts={"no-such-rule": {}})
    thresholds, problems = thresholds_for((*good, *bad))
    assert thresholds.of("port-down").for_s == 2.0
    (problem,) = problems
    assert (problem.rule, problem.subject) == ("data-quality", "policy/b")
    assert problem.evidence["path"] == "spec.alerts.no-such-rule"
