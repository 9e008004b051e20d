"""Table tests of the version rules: firmware skew, firmware minimum, driver skew."""

from __future__ import annotations

import pytest

from aggregator.rules.versions import parse_version
from tests.support.rules_cases import Scenario, adapter, fleet_of, hits, node, policy_doc


def _fw(*per_node: tuple[str, ...]) -> Scenario:
    """Node i holds one CX-7 per firmware string in per_node[i]."""
    return fleet_of(
        *(
            node(f"n{i}", *(adapter(f"mlx5_{j}", f"0000:{0x19 + j:02x}:00.0", fw=fw)
                            for j, fw in enumerate(fws)))
            for i, fws in enumerate(per_node)
        )
    )  # fmt: skip


def _drivers(*versions: str | None) -> Scenario:
    return fleet_of(*(node(f"n{i}", modules={"mlx5_core": v}) for i, v in enumerate(versions)))


MIN_CX7 = policy_doc(expect={"minFirmware": {"ConnectX-7": "28.41.1000"}})
OLD, NEW = "28.39.1002", "28.41.1000"

FIRES_AND_RESOLVES = [
    pytest.param("fw-skew", _fw((NEW, NEW, OLD)), _fw((NEW, NEW, NEW)), {("n0", "mlx5_2")},
                 id="fw-skew-in-node"),
    pytest.param("fw-skew", _fw((NEW,), (NEW,), (OLD,)), _fw((NEW,), (NEW,), (NEW,)),
                 {("n2", "mlx5_0")}, id="fw-skew-in-fleet"),
    pytest.param("fw-below-minimum",
                 fleet_of(node("n1", adapter(fw=OLD)), policies=MIN_CX7),
                 fleet_of(node("n1", adapter(fw=NEW)), policies=MIN_CX7),
                 {("n1", "mlx5_0")}, id="fw-below-minimum-by-model-name"),
    pytest.param("fw-below-minimum",
                 fleet_of(node("n1", adapter(fw="28.9.9999")),
                          policies=policy_doc(expect={"minFirmware": {"0x1021": "28.10.0"}})),
                 fleet_of(node("n1", adapter(fw="28.10.0")),
                          policies=policy_doc(expect={"minFirmware": {"0x1021": "28.10.0"}})),
                 {("n1", "mlx5_0")}, id="fw-below-minimum-numeric-not-lexical"),
    pytest.param("driver-skew", _drivers("24.04", "24.04", "23.10"),
                 _drivers("24.04", "24.04", "24.04"), {("n2", "mlx5_core")}, id="driver-skew"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "bad", "fixed", "expected"), FIRES_AND_RESOLVES)
def test_fires_then_resolves(
    rule: str, bad: Scenario, fixed: Scenario, expected: set[tuple[str, str]]
) -> None:
    assert hits(rule, bad) == expected
    assert hits(rule, fixed) == set()


DOES_NOT_FIRE = [
    pytest.param("fw-skew", _fw((NEW,)), id="fw-single-adapter"),
    pytest.param("fw-skew", fleet_of(node("n1", adapter(fw=NEW),
                 adapter("mlx5_1", "0000:1a:00.0", device_id="0x101d", fw="22.38.1002"))),
                 id="fw-different-models"),
    pytest.param("fw-below-minimum", fleet_of(node("n1", adapter(fw=OLD))), id="fw-no-policy"),
    pytest.param("fw-below-minimum", fleet_of(node("n1", adapter(fw=OLD)), policies=policy_doc(
        expect={"minFirmware": {"ConnectX-6 Dx": "22.40.0"}})), id="fw-minimum-for-other-model"),
    pytest.param("driver-skew", _drivers("24.04"), id="driver-single-node"),
    pytest.param("driver-skew", _drivers(None, None), id="driver-inbox-everywhere"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "scenario"), DOES_NOT_FIRE)
def test_does_not_fire(rule: str, scenario: Scenario) -> None:
    assert hits(rule, scenario) == set()


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        pytest.param("28.41.1000", (28, 41, 1000), id="dotted"),
        pytest.param("22", (22,), id="single"),
        pytest.param("28.41.1000 (MT_0000000838)", None, id="suffix"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="none"),
    ],
)
def test_parse_version(text: str | None, parsed: tuple[int, ...] | None) -> None:
    assert parse_version(text) == parsed


def test_fw_skew_without_majority_flags_both() -> None:
    assert hits("fw-skew", _fw((NEW,), (OLD,))) == {("n0", "mlx5_0"), ("n1", "mlx5_0")}
