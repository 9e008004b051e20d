"""Table tests of the counter rules on the latest counter batch: error families against
their default and policy thresholds, retries exceeded, ignored CNPs."""

from __future__ import annotations

import pytest

from aggregator.rules.thresholds import parse_alerts
from tests.support.rules_cases import Scenario, batch, fleet_of, hits, node, port_counters

P0 = ("n1", "mlx5_0/1")


def _with(rates: dict[str, float], **kw: object) -> Scenario:
    return fleet_of(node("n1"), counters=(batch("n1", port_counters(rates=rates)),), **kw)


QUIET = _with({"counters/symbol_error": 0.0, "hw_counters/rp_cnp_ignored": 0.0})

FIRES_AND_RESOLVES = [
    pytest.param("counter-errors", _with({"counters/symbol_error": 5.0}), id="symbol-errors"),
    pytest.param("counter-errors", _with({"counters/port_rcv_errors": 2.0}), id="port-rcv-errors"),
    pytest.param("counter-errors", _with({"counters/port_xmit_discards": 50.0}), id="discards"),
    pytest.param("counter-errors", _with({"hw_counters/local_ack_timeout_err": 3.0}),
                 id="local-ack-timeout"),
    pytest.param("counter-errors", _with({"hw_counters/out_of_sequence": 500.0}),
                 id="out-of-sequence"),
    pytest.param("counter-errors", _with({"hw_counters/packet_seq_err": 2.0}), id="packet-seq-err"),
    pytest.param("counter-errors", _with({"hw_counters/roce_adp_retrans": 20.0}),
                 id="roce-adp-retrans"),
    pytest.param("counter-errors", _with({"hw_counters/rx_icrc_encapsulated": 2.0}),
                 id="rx-icrc-encapsulated"),
    pytest.param("retries-exceeded", _with({"hw_counters/req_transport_retries_exceeded": 0.5}),
                 id="transport-retries"),
    pytest.param("retries-exceeded", _with({"hw_counters/req_rnr_retries_exceeded": 1.0}),
                 id="rnr-retries"),
    pytest.param("cc-misconfigured", _with({"hw_counters/rp_cnp_ignored": 10.0}),
                 id="cnp-ignored"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "bad"), FIRES_AND_RESOLVES)
def test_fires_then_resolves(rule: str, bad: Scenario) -> None:
    assert hits(rule, bad) == {P0}
    assert hits(rule, QUIET) == set()


DOES_NOT_FIRE = [
    pytest.param("counter-errors", _with({"counters/symbol_error": 0.5}), id="below-default"),
    pytest.param("counter-errors", _with({"counters/port_xmit_discards": 5.0}),
                 id="discards-below-default"),
    pytest.param("counter-errors", _with({"counters/symbol_error": float("nan")}),
                 id="nan-rate-is-data-quality"),
    pytest.param("counter-errors", _with({"counters/symbol_error": -5.0}),
                 id="negative-rate-is-data-quality"),
    pytest.param("counter-errors", fleet_of(node("n1")), id="no-counter-batch"),
    pytest.param("counter-errors", _with({"counters/symbol_error": 5.0}, thresholds=parse_alerts(
        {"counter-errors": {"thresholds": {"physical_errors": 10}}})), id="policy-raises-limit"),
    pytest.param("counter-errors", _with({"counters/symbol_error": 5.0}, thresholds=parse_alerts(
        {"counter-errors": {"enabled": False}})), id="rule-disabled"),
    pytest.param("retries-exceeded", _with({"hw_counters/req_transport_retries_exceeded": 0.0}),
                 id="retries-flat"),
    pytest.param("cc-misconfigured", _with({"hw_counters/rp_cnp_handled": 100.0}),
                 id="cnp-handled-is-fine"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "scenario"), DOES_NOT_FIRE)
def test_does_not_fire(rule: str, scenario: Scenario) -> None:
    assert hits(rule, scenario) == set()


def test_policy_can_lower_a_threshold() -> None:
    strict = parse_alerts({"counter-errors": {"thresholds": {"physical_errors": 0.1}}})
    assert hits("counter-errors", _with({"counters/symbol_error": 0.5}, thresholds=strict)) == {P0}


def test_one_finding_per_port_names_every_family_over_its_limit() -> None:
    scenario = _with({"counters/symbol_error": 5.0, "hw_counters/packet_seq_err": 9.0})
    (finding,) = [f for f in scenario.findings() if f.rule == "counter-errors"]
    assert finding.evidence["physical_errors_per_s"] == 5.0
    assert finding.evidence["packet_seq_err_per_s"] == 9.0
    assert "packet_seq_err" in finding.message  # the worst against its limit


def test_retries_exceeded_is_critical() -> None:
    scenario = _with({"hw_counters/req_rnr_retries_exceeded": 1.0})
    (finding,) = [f for f in scenario.findings() if f.rule == "retries-exceeded"]
    assert finding.severity == "critical"
    assert finding.evidence == {"req_rnr_retries_exceeded_per_s": 1.0}
