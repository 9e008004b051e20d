"""Per-resource aggregation (pure): capacity, health, zero-advertising and stale nodes."""

from __future__ import annotations

import pytest

from aggregator.cluster import ClusterNode, ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.trace.resources import allocatable_count, summarize_resources
from proto.http import ResourceSummary
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.policy import Policy
from tests.support.builders import T0, plugin_status, rdma_policy, resource_status, snapshot

NOW = T0 + 5


def record(
    name: str, status: DevicePluginStatus | None = None, *, last_seen: float = T0
) -> NodeRecord:
    return NodeRecord(
        name=name,
        snapshot=snapshot(name),
        first_seen=T0,
        last_seen=last_seen,
        device_plugin=status,
    )


FLEET = {
    "a": record(
        "a",
        plugin_status(
            "a",
            resource_status("rdma/ib", advertised=64, healthy=64),
            resource_status("rdma/eth", advertised=8, healthy=0),
        ),
    ),
    "b": record("b", plugin_status("b", resource_status("rdma/ib", advertised=0, healthy=0))),
    "c": record("c"),  # no device-plugin status yet
    "old": record(
        "old", plugin_status("old", resource_status("rdma/ib", advertised=64)), last_seen=T0 - 99
    ),
}


def run(
    policies: tuple[Policy, ...] = (),
    cluster: ClusterView | None = None,
    *,
    node: str | None = None,
    name: str | None = None,
) -> dict[str, ResourceSummary]:
    items = summarize_resources(
        fleet=FLEET,
        cluster=cluster or ClusterView(),
        policies=policies,
        now=NOW,
        stale_after=30.0,
        node=node,
        name=name,
    )
    assert [i.name for i in items] == sorted(i.name for i in items)
    return {i.name: i for i in items}


def test_from_agent_status_only() -> None:
    result = run()
    assert set(result) == {"rdma/eth", "rdma/ib"}
    ib = result["rdma/ib"]
    assert (ib.nodes_selected, ib.nodes_advertising, ib.capacity, ib.healthy) == (3, 1, 64, 64)
    assert ib.zero_nodes == ("b",)
    assert ib.stale_nodes == ("old",)  # its 64 are not counted
    assert ib.allocatable is None
    assert [n.node for n in ib.nodes] == ["a", "b", "old"]
    eth = result["rdma/eth"]
    assert (eth.capacity, eth.healthy, eth.zero_nodes) == (8, 0, ())
    assert (eth.unhealthy_nodes, ib.unhealthy_nodes) == (("a",), ())


def test_policy_selected_nodes_without_status_are_listed_not_judged() -> None:
    ib = run((rdma_policy("ib", "rdma/ib"),))["rdma/ib"]
    assert ib.nodes_selected == 4
    assert ib.zero_nodes == ("b",)  # c reports no plugin status: resource-zero does not judge it
    row = {n.node: n for n in ib.nodes}["c"]
    assert (row.configured, row.advertised, row.registration, row.state) == (
        True,
        None,
        None,
        "ready",
    )


def test_cluster_allocatable_and_label_selection() -> None:
    cluster = ClusterView(
        present=True,
        nodes={
            "a": ClusterNode(name="a", labels={"rdma": "ib"}, allocatable={"rdma/ib": "64"}),
            "b": ClusterNode(name="b", labels={"rdma": "ib"}, allocatable={"rdma/ib": "0"}),
            "new": ClusterNode(name="new", labels={"rdma": "ib"}),  # no agent yet
        },
    )
    ib = run((rdma_policy("ib", "rdma/ib", labels={"rdma": "ib"}),), cluster)["rdma/ib"]
    assert ib.allocatable == 64
    by_node = {n.node: n for n in ib.nodes}
    assert by_node["a"].allocatable == 64
    assert by_node["new"].state is None and by_node["new"].allocatable is None
    assert ib.zero_nodes == ("b",)  # "new" has no agent, so no status to judge


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        pytest.param({"node": "a"}, {"rdma/eth": 1, "rdma/ib": 1}, id="node"),
        pytest.param({"name": "rdma/eth"}, {"rdma/eth": 1}, id="name"),
        pytest.param({"node": "b", "name": "rdma/eth"}, {}, id="both-nothing"),
        pytest.param({"node": "nope"}, {}, id="unknown-node"),
    ],
)
def test_filters(filters: dict[str, str], expected: dict[str, int]) -> None:
    assert {
        n: r.nodes_selected
        for n, r in run(node=filters.get("node"), name=filters.get("name")).items()
    } == expected


@pytest.mark.parametrize(
    ("raw", "count"),
    [("8", 8), ("0", 0), (None, None), ("1k", None), ("-1", None), ("٣", None)],
)
def test_allocatable_count(raw: str | None, count: int | None) -> None:
    assert allocatable_count(raw) == count


def test_a_config_invalid_row_carries_the_field_and_the_error() -> None:
    bad = ResourceStatus(
        name="kubernetes.io/ib_c",
        registration="config-invalid",
        config_path="configList[1].resourcePrefix",
        config_error="'kubernetes.io' is reserved for Kubernetes",
    )
    fleet = {"a": record("a", plugin_status("a", resource_status("rdma/ib"), bad))}
    items = summarize_resources(
        fleet=fleet, cluster=ClusterView(), policies=(), now=NOW, stale_after=30.0
    )
    rows = {(i.name, n.node): n for i in items for n in i.nodes}
    row = rows[("kubernetes.io/ib_c", "a")]
    assert (row.registration, row.advertised, row.config_path, row.config_error) == (
        "config-invalid",
        0,
        "configList[1].resourcePrefix",
        "'kubernetes.io' is reserved for Kubernetes",
    )
    served = rows[("rdma/ib", "a")]
    assert (served.config_path, served.config_error) == (None, None)
