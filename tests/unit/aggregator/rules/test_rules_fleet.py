"""Table tests of the fleet/policy rules: agent-stale, resource-zero,
selector-matches-nothing, policy-conflict and rail-mismatch."""

from __future__ import annotations

from typing import Any

import pytest

from proto.messages.status import ResourceStatus
from tests.support.rules_cases import (
    T0,
    Scenario,
    adapter,
    fleet_of,
    hits,
    node,
    policy_doc,
    roce,
    status,
)

RES = "rdma/hca"
NONE = ResourceStatus(name=RES, devices=(), unmatched={"mlx5_0": "deviceIDs"})
SOME = ResourceStatus(name=RES, advertised=4, healthy=4, devices=("mlx5_0",))


def _plugin(*device_ids: str, name: str = "p") -> Any:
    return policy_doc(
        name,
        rdmaSharedDevicePlugin={
            "configList": [
                {
                    "resourceName": "hca",
                    "rdmaHcaMax": 4,
                    "selectors": {"deviceIDs": list(device_ids)},
                }
            ]
        },
    )


def _served(advertised: int, healthy: int, devices: tuple[str, ...] = ("mlx5_0",)) -> Scenario:
    resource = ResourceStatus(name=RES, advertised=advertised, healthy=healthy, devices=devices)
    return fleet_of(node("n1"), statuses=(status("n1", resource),))


def _rails(*ips: str, rate: float = 100.0, last_rate: float | None = None) -> Scenario:
    """Node i has one RoCE compute adapter at ips[i]; the last node's at last_rate."""
    return fleet_of(
        *(
            node(f"n{i}", roce("mlx5_0", "0000:1a:00.0", ip,
                               rate=last_rate if last_rate and i == len(ips) - 1 else rate))
            for i, ip in enumerate(ips)
        )
    )  # fmt: skip


FIRES_AND_RESOLVES = [
    pytest.param("agent-stale", fleet_of(node("n1"), now=T0 + 100),
                 fleet_of(node("n1", collected_at=T0 + 95, seq=2), now=T0 + 100),
                 {("n1", "agent")}, id="agent-stale"),
    pytest.param("resource-zero", _served(0, 0), _served(4, 4), {("n1", RES)},
                 id="resource-advertises-zero"),
    pytest.param("resource-zero", _served(4, 0), _served(4, 4), {("n1", RES)},
                 id="resource-no-healthy-device"),
    pytest.param("resource-zero",
                 fleet_of(node("n1"), statuses=(status("n1"),), policies=_plugin("1021")),
                 fleet_of(node("n1"), statuses=(status("n1", ResourceStatus(
                     name=RES, advertised=4, healthy=4, devices=("mlx5_0",))),),
                     policies=_plugin("1021")),
                 {("n1", RES)}, id="resource-wanted-but-not-served"),
    pytest.param("selector-matches-nothing", fleet_of(node("n1"), policies=_plugin("9999")),
                 fleet_of(node("n1"), policies=_plugin("1021")), {(None, f"p/{RES}")},
                 id="selector-matches-nothing-on-snapshots"),
    pytest.param("selector-matches-nothing",
                 fleet_of(node("n1"), policies=_plugin("1021"), statuses=(status("n1", NONE),)),
                 fleet_of(node("n1"), policies=_plugin("1021"), statuses=(status("n1", SOME),)),
                 {(None, f"p/{RES}")}, id="selector-matches-nothing-by-agent-status"),
    pytest.param("policy-conflict",
                 fleet_of(node("n1"), policies=(*policy_doc("a"), *policy_doc("b"))),
                 fleet_of(node("n1"), policies=policy_doc("a")), {("n1", "policy")},
                 id="policy-conflict"),
    pytest.param("rail-mismatch", _rails("10.0.0.1", "10.0.0.2", "10.0.9.3"),
                 _rails("10.0.0.1", "10.0.0.2", "10.0.0.3"), {("n2", "mlx5_0")},
                 id="rail-subnet"),
    pytest.param("rail-mismatch", _rails("10.0.0.1", "10.0.0.2", "10.0.0.3", last_rate=25.0),
                 _rails("10.0.0.1", "10.0.0.2", "10.0.0.3"), {("n2", "mlx5_0")},
                 id="rail-rate"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "bad", "fixed", "expected"), FIRES_AND_RESOLVES)
def test_fires_then_resolves(
    rule: str, bad: Scenario, fixed: Scenario, expected: set[tuple[str | None, str]]
) -> None:
    assert hits(rule, bad) == expected
    assert hits(rule, fixed) == set()


DOES_NOT_FIRE = [
    pytest.param("agent-stale", fleet_of(node("n1"), now=T0 + 30), id="stale-at-limit"),
    pytest.param("resource-zero", fleet_of(node("n1"), policies=_plugin("1021")),
                 id="resource-no-status-no-verdict"),
    pytest.param("selector-matches-nothing", fleet_of(node("n1")), id="selector-no-policy"),
    pytest.param("selector-matches-nothing", fleet_of(
        node("n1", adapter(), roce("mlx5_1", "0000:1a:00.0", "10.0.0.1")),
        policies=_plugin("101d")), id="selector-matches-second-adapter"),
    pytest.param("policy-conflict", fleet_of(node("n1"), policies=policy_doc("a")),
                 id="one-policy"),
    pytest.param("rail-mismatch", _rails("10.0.0.1"), id="rail-no-peers"),
    pytest.param("rail-mismatch", fleet_of(
        node("n0", adapter()), node("n1", adapter(gid="fe80:0000:0000:0000:0000:0000:0000:0001"))),
        id="rail-ib-same-prefix"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "scenario"), DOES_NOT_FIRE)
def test_does_not_fire(rule: str, scenario: Scenario) -> None:
    assert hits(rule, scenario) == set()


def test_rail_index_follows_pci_order_and_skips_other_link_layers() -> None:
    # n1's front-end Ethernet adapter sits first by PCI address; rail 0 is still its IB adapter.
    ib = adapter("mlx5_1", "0000:3b:00.0")
    front = roce("mlx5_0", "0000:1a:00.0", "192.168.0.1")
    odd = adapter("mlx5_1", "0000:3b:00.0", gid="fec0:0000:0000:0001:58a2:e103:001b:2576")
    clean = fleet_of(node("n0", adapter()), node("n1", front, ib), node("n2", adapter()))
    assert hits("rail-mismatch", clean) == set()
    skewed = fleet_of(node("n0", adapter()), node("n1", front, odd), node("n2", adapter()))
    assert hits("rail-mismatch", skewed) == {("n1", "mlx5_1")}


def test_rails_are_compared_within_one_fabric_and_one_policy() -> None:
    # Two InfiniBand nodes and two RoCE nodes: rail 0 of an IB node is no peer of rail 0 of a
    # RoCE node (the demo fleet mixes both), so nothing differs.
    mixed = fleet_of(
        node("ib0", adapter()),
        node("ib1", adapter()),
        node("eth0", roce("mlx5_0", "0000:1a:00.0", "10.0.0.1")),
        node("eth1", roce("mlx5_0", "0000:1a:00.0", "10.0.0.2")),
    )
    assert hits("rail-mismatch", mixed) == set()
    # Within the RoCE pool a node on another subnet still stands out.
    odd = fleet_of(
        node("ib0", adapter()),
        node("eth0", roce("mlx5_0", "0000:1a:00.0", "10.0.0.1")),
        node("eth1", roce("mlx5_0", "0000:1a:00.0", "10.0.0.2")),
        node("eth2", roce("mlx5_0", "0000:1a:00.0", "10.0.9.3")),
    )
    assert hits("rail-mismatch", odd) == {("eth2", "mlx5_0")}


def test_rails_without_a_majority_tell_one_story_and_blame_no_node() -> None:
    """Two different machines in one pool (the demo's H100 and A100 nodes): before, every
    adapter of both was "rate_gbps ... (peers: no majority)"."""
    split = fleet_of(
        node("a", adapter(), adapter("mlx5_1", "0000:1a:00.0")),
        node("b", adapter(rate=200.0), adapter("mlx5_1", "0000:1a:00.0", rate=200.0)),
    )
    found = [f for f in split.findings() if f.rule == "rail-mismatch"]
    assert [(f.node, f.subject) for f in found] == [(None, "pool/-/InfiniBand")]
    (story,) = found
    assert story.evidence == {"policy": None, "link_layer": "InfiniBand", "rails": "0,1"}
    assert "rail 0: rate_gbps 200.0 on 1 node, 400.0 on 1 node; rail 1:" in story.message
    assert "its own NicFleetPolicy" in story.message
    # With a majority the odd adapter is named, and no pool story is told.
    third = fleet_of(*split.snapshots, node("c", adapter(), adapter("mlx5_1", "0000:1a:00.0")))
    assert hits("rail-mismatch", third) == {("b", "mlx5_0"), ("b", "mlx5_1")}
