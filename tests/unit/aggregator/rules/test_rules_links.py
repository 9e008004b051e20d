"""Table tests of the link rules: port state, rate, link layer, MTU and link flaps."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.rules_cases import (
    Scenario,
    adapter,
    batch,
    fleet_of,
    hits,
    node,
    policy_doc,
    port_counters,
    roce,
)

PCI = "0000:1a:00.0"
P0 = "mlx5_0/1"
MIN400 = policy_doc(expect={"minRateGbps": 400})


def _rates(*rates: float) -> Scenario:
    """One CX-7 per node, node i at rates[i]."""
    return fleet_of(*(node(f"n{i}", adapter(rate=r)) for i, r in enumerate(rates)))


def _roce_mtus(*mtus: int) -> Scenario:
    return fleet_of(
        *(
            node(f"n{i}", roce("mlx5_0", "0000:1a:00.0", "10.0.0.1", mtu=m))
            for i, m in enumerate(mtus)
        )
    )


def _flap(rate: float) -> Scenario:
    counters = batch("n1", port_counters(rates={"counters/link_downed": rate}))
    return fleet_of(node("n1"), counters=(counters,))


FIRES_AND_RESOLVES = [
    pytest.param("port-down", fleet_of(node("n1", adapter(state="DOWN"))),
                 fleet_of(node("n1", adapter())), {("n1", "mlx5_0/1")}, id="port-down-state"),
    pytest.param("port-down", fleet_of(node("n1", adapter(state="ACTIVE", phys="Polling"))),
                 fleet_of(node("n1", adapter())), {("n1", "mlx5_0/1")}, id="port-down-phys"),
    pytest.param("port-down", fleet_of(node("n1", adapter(state="INIT"))),
                 fleet_of(node("n1", adapter())), {("n1", "mlx5_0/1")}, id="port-down-init"),
    pytest.param("rate-mismatch", _rates(400, 400, 200), _rates(400, 400, 400),
                 {("n2", "mlx5_0/1")}, id="rate-below-fleet-mode"),
    pytest.param("rate-mismatch",
                 fleet_of(node("n1", adapter(rate=200)), policies=MIN400),
                 fleet_of(node("n1", adapter(rate=400)), policies=MIN400),
                 {("n1", "mlx5_0/1")}, id="rate-below-policy-minimum"),
    pytest.param("link-layer-mismatch",
                 fleet_of(node("n0", adapter()), node("n1", adapter()),
                          node("n2", adapter(layer="Ethernet"))),
                 fleet_of(node("n0", adapter()), node("n1", adapter()), node("n2", adapter())),
                 {("n2", "mlx5_0/1")}, id="link-layer-differs-from-same-model"),
    pytest.param("link-layer-mismatch",
                 fleet_of(node("n1", adapter(layer="Ethernet")),
                          policies=policy_doc(expect={"linkLayer": "InfiniBand"})),
                 fleet_of(node("n1", adapter()),
                          policies=policy_doc(expect={"linkLayer": "InfiniBand"})),
                 {("n1", "mlx5_0/1")}, id="link-layer-differs-from-policy"),
    pytest.param("mtu-mismatch", _roce_mtus(9000, 9000, 1500), _roce_mtus(9000, 9000, 9000),
                 {("n2", "mlx5_0/1")}, id="mtu-differs-from-fabric"),
    pytest.param("mtu-mismatch",
                 fleet_of(node("n1", roce("mlx5_0", "0000:1a:00.0", "10.0.0.1", mtu=4200)),
                          policies=policy_doc(expect={"mtu": 9000})),
                 fleet_of(node("n1", roce("mlx5_0", "0000:1a:00.0", "10.0.0.1", mtu=9000)),
                          policies=policy_doc(expect={"mtu": 9000})),
                 {("n1", "mlx5_0/1")}, id="mtu-differs-from-policy"),
    pytest.param("link-flap", _flap(0.5), _flap(0.0), {("n1", P0)}, id="link-downed-rising"),
    pytest.param("link-flap",
                 fleet_of(node("n1"), counters=(batch("n1", port_counters(
                     rates={"counters/link_error_recovery": 2.0})),)),
                 _flap(0.0), {("n1", "mlx5_0/1")}, id="link-error-recovery-rising"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "bad", "fixed", "expected"), FIRES_AND_RESOLVES)
def test_fires_then_resolves(
    rule: str, bad: Scenario, fixed: Scenario, expected: set[tuple[str, str]]
) -> None:
    assert hits(rule, bad) == expected
    assert hits(rule, fixed) == set()


DOES_NOT_FIRE = [
    pytest.param("port-down", fleet_of(node("n1", adapter(state="UNKNOWN", phys=None))),
                 id="port-state-unknown-is-data-quality"),
    pytest.param("port-down", fleet_of(node("n1", adapter(state="ACTIVE_DEFER", phys="LinkUp"))),
                 id="port-active-defer"),
    pytest.param("rate-mismatch",
                 fleet_of(node("n0", roce("mlx5_0", "0000:1a:00.0", "10.0.0.1")),
                          node("n1", roce("mlx5_0", PCI, "10.0.0.2", state="DOWN", rate=40))),
                 id="rate-of-down-port-not-compared"),
    pytest.param("rate-mismatch", _rates(400), id="rate-single-port"),
    pytest.param("link-layer-mismatch",
                 fleet_of(node("n1", adapter(), roce("mlx5_1", "0000:1a:00.0", "10.0.0.1")),
                          policies=policy_doc(expect={"linkLayer": "InfiniBand"})),
                 id="link-layer-ethernet-only-model-next-to-ib"),
    pytest.param("mtu-mismatch", _roce_mtus(1500), id="mtu-alone-in-fabric"),
    pytest.param("mtu-mismatch",
                 fleet_of(node("n1", adapter(mtu=4092), roce("mlx5_1", PCI, "10.0.0.1"))),
                 id="mtu-different-link-layers-are-different-fabrics"),
    pytest.param("link-flap", fleet_of(node("n1")), id="flap-no-counters"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "scenario"), DOES_NOT_FIRE)
def test_does_not_fire(rule: str, scenario: Scenario) -> None:
    assert hits(rule, scenario) == set()


def test_rate_tie_flags_the_lower_rate() -> None:
    assert hits("rate-mismatch", _rates(400, 200)) == {("n1", "mlx5_0/1")}


def test_mtu_without_majority_flags_every_member() -> None:
    assert hits("mtu-mismatch", _roce_mtus(9000, 1500)) == {("n0", "mlx5_0/1"), ("n1", "mlx5_0/1")}


def test_port_down_evidence_and_severity() -> None:
    (finding,) = [f for f in fleet_of(node("n1", adapter(state="DOWN"))).findings()
                  if f.rule == "port-down"]  # fmt: skip
    assert finding.severity == "critical"
    assert finding.evidence["state"] == "DOWN"
    assert finding.evidence["phys_state"] == "Disabled"


def test_port_down_when_a_roce_netdev_is_down_before_sysfs_follows() -> None:
    up = roce("mlx5_0", "0000:1a:00.0", "10.0.0.1")
    iface = msgspec.structs.replace(up.interfaces[0], operstate="down")
    down = msgspec.structs.replace(up, interfaces=(iface,))
    (finding,) = [f for f in fleet_of(node("n1", down)).findings() if f.rule == "port-down"]
    assert finding.severity == "critical"
    assert finding.evidence["netdev_operstate"] == "down"
    assert finding.evidence["state"] == "ACTIVE"
    assert not [f for f in fleet_of(node("n1", up)).findings() if f.rule == "port-down"]
