"""Table tests of the version rules: firmware skew, firmware minimum, driver skew."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.rules.finding import Finding
from aggregator.rules.versions import parse_version
from proto.inventory import Device, ModuleInfo, NodeSnapshot
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
    # Per node: the odd adapter; fleet-wide: the model's story, once.
    pytest.param("fw-skew", _fw((NEW, NEW, OLD)), _fw((NEW, NEW, NEW)),
                 {("n0", "mlx5_2"), (None, "ConnectX-7")}, id="fw-skew-in-node"),
    pytest.param("fw-skew", _fw((NEW,), (NEW,), (OLD,)), _fw((NEW,), (NEW,), (NEW,)),
                 {("n2", "mlx5_0"), (None, "ConnectX-7")}, id="fw-skew-in-fleet"),
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
                 _drivers("24.04", "24.04", "24.04"),
                 {("n2", "mlx5_core"), (None, "mlx5_core/version")}, id="driver-skew"),
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


def _psid(device: Device, psid: str) -> Device:
    return msgspec.structs.replace(device, board_id=psid)


def _inbox(name: str, **srcversions: str) -> NodeSnapshot:
    modules = {m: ModuleInfo(version=None, srcversion=v) for m, v in srcversions.items()}
    return msgspec.structs.replace(node(name), modules=modules)


def _skew(rule: str, scenario: Scenario) -> list[Finding]:
    return [f for f in scenario.findings() if f.rule == rule]


def test_fw_skew_without_majority_says_so_once_and_suggests_a_pin() -> None:
    found = _skew("fw-skew", _fw((NEW,), (OLD,), ("28.40.1000",)))
    assert [(f.node, f.subject) for f in found] == [(None, "ConnectX-7")]  # no odd one out
    (story,) = found
    assert "no version has a majority" in story.message
    assert 'expect.minFirmware: {"ConnectX-7": "<version>"}' in story.message
    assert story.evidence["majority_fw"] is None
    assert story.evidence["adapters"] == 3


def test_fw_skew_with_a_majority_counts_versions_and_names_the_odd_nodes() -> None:
    found = _skew("fw-skew", _fw((NEW, NEW), (NEW, NEW), (OLD,), (NEW,)))
    assert [(f.node, f.subject) for f in found] == [(None, "ConnectX-7"), ("n2", "mlx5_0")]
    story, odd = found
    assert "(28.41.1000 on 5 adapters, 28.39.1002 on 1)" in story.message
    assert story.evidence["versions"] == "28.41.1000=5, 28.39.1002=1"
    assert "the other adapter carries a fw-skew finding" in story.message
    assert odd.evidence["majority_fw"] == NEW and odd.evidence["scope"] == "fleet"
    assert "flash 28.41.1000" in odd.message and "no majority" not in odd.message


def test_fw_skew_compares_like_with_like_models_and_psids() -> None:
    cx6 = adapter("mlx5_1", "0000:1a:00.0", device_id="0x101d", fw="22.38.1002")
    oem = _psid(adapter("mlx5_2", "0000:1b:00.0", fw=OLD), "DEL0000000027")
    scenario = fleet_of(
        node("n0", _psid(adapter(fw=NEW), "MT_0000000838"), cx6, oem),
        node("n1", _psid(adapter(fw=NEW), "MT_0000000838"),
             msgspec.structs.replace(cx6, fw_ver="22.39.1002")),
    )  # fmt: skip
    # One CX-7 PSID at one version, the OEM CX-7 alone in its group: only the CX-6 differ.
    assert hits("fw-skew", scenario) == {(None, "ConnectX-6 Dx")}


def test_driver_skew_compares_versions_with_versions_and_builds_with_builds() -> None:
    scenario = fleet_of(
        node("ofed-a", modules={"mlx5_core": "24.04", "ib_core": "24.04"}),
        node("ofed-b", modules={"mlx5_core": "23.10", "ib_core": "23.10"}),
        _inbox("inbox-a", mlx5_core="BEAC93A75FC7BBDBA35300F", ib_core="F8DC622DE453F24AE8"),
        _inbox("inbox-b", mlx5_core="BEAC93A75FC7BBDBA35300F", ib_core="F8DC622DE453F24AE8"),
    )
    (story,) = _skew("driver-skew", scenario)  # the inbox builds agree: no second story
    assert (story.node, story.subject) == (None, "mlx5_core/version")
    assert "(24.04 on 1 node, 23.10 on 1)" in story.message
    assert "2 more nodes run the inbox modules" in story.message
    assert "srcversion" not in str(story.evidence["versions"])


def test_driver_skew_of_inbox_builds_shows_short_hashes() -> None:
    scenario = fleet_of(
        _inbox("a", mlx5_core="BEAC93A75FC7BBDBA35300F"),
        _inbox("b", mlx5_core="BEAC93A75FC7BBDBA35300F"),
        _inbox("c", mlx5_core="0123456789ABCDEF0123456"),
    )
    story, odd = _skew("driver-skew", scenario)
    assert (story.subject, odd.node, odd.subject) == ("mlx5_core/srcversion", "c", "mlx5_core")
    assert "is build 01234567 here but build BEAC93A7 on most of the fleet" in odd.message


def test_four_different_machines_tell_one_story_per_version_set() -> None:
    """The demo's shape: every node another machine and driver; before grouping, every
    adapter and module was "unlike the fleet, which has no majority version"."""
    cx6 = adapter("mlx5_1", "0000:1a:00.0", device_id="0x101d", fw="22.38.1002")
    scenario = fleet_of(
        node("ib-01", adapter(), cx6, modules={"mlx5_core": "24.04", "nvidia": "550.90.07"}),
        node("ib-02", adapter("mlx5_0", fw=OLD),
             modules={"mlx5_core": "5.8-3.0.7", "nvidia": "535.183.01"}),
        msgspec.structs.replace(
            _inbox("roce-01", mlx5_core="BEAC93A75FC7BBDBA35300F"),
            devices=(msgspec.structs.replace(cx6, fw_ver="22.39.1002"),)),
        msgspec.structs.replace(
            _inbox("roce-02", mlx5_core="BEAC93A75FC7BBDBA35300F"),
            devices=(msgspec.structs.replace(cx6, fw_ver="22.36.1010"),)),
    )  # fmt: skip
    rows = {(f.rule, f.node, f.subject) for f in scenario.findings() if "skew" in f.rule}
    assert rows == {
        ("fw-skew", None, "ConnectX-7"),  # 1 vs 1: no majority
        ("fw-skew", None, "ConnectX-6 Dx"),  # 1 vs 1 vs 1
        ("driver-skew", None, "mlx5_core/version"),  # OFED 24.04 vs 5.8
        ("driver-skew", None, "nvidia/version"),  # 550 vs 535: 1 vs 1
    }
