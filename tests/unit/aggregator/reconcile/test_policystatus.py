"""Table tests of policy status: per-node state, conditions, changes and node labels."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.cluster import NO_CLUSTER, ClusterNode, ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.reconcile.nodelabels import node_labels, worst_gpu_relation
from aggregator.reconcile.plan import EMPTY_PLAN, plan
from aggregator.reconcile.status import (
    PolicyStatus,
    policy_status,
    status_changes,
)
from proto.inventory import GpuNicRelation, NodeSnapshot
from proto.messages.status import DevicePluginStatus
from proto.policy import Expect, Policy
from tests.support.builders import T0, nic, plugin_status, rdma_policy, resource_status, snapshot

IB = rdma_policy("ib", "rdma/ib")
ROCE = rdma_policy("roce", "rdma/roce")
NOW = T0 + 5


def record(
    node: str = "a",
    *,
    dp: DevicePluginStatus | None = None,
    snap: NodeSnapshot | None = None,
    last_seen: float = T0,
) -> NodeRecord:
    return NodeRecord(
        name=node,
        snapshot=snap or snapshot(node),
        device_plugin=dp if dp is not None else plugin_status(node, resource_status("rdma/ib")),
        first_seen=T0,
        last_seen=last_seen,
    )


def status(
    policies: tuple[Policy, ...],
    records: tuple[NodeRecord, ...],
    cluster: ClusterView = NO_CLUSTER,
    errors: tuple[str, ...] = (),
) -> PolicyStatus:
    fleet = {r.name: r for r in records}
    planned = plan(policies, fleet, cluster, previous=EMPTY_PLAN)
    return policy_status(
        policies[0], planned, fleet, cluster, now=NOW, stale_after=30.0, errors=errors
    )


def conditions(s: PolicyStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in s.conditions}


def with_topology(relation: str) -> NodeSnapshot:
    links = (
        GpuNicRelation(gpu="0000:18:00.0", nic="mlx5_0", relation="SYS"),
        GpuNicRelation(gpu="0000:18:00.0", nic="mlx5_1", relation=relation),  # type: ignore[arg-type]
        GpuNicRelation(gpu="0000:19:00.0", nic="mlx5_0", relation="PIX"),
    )
    return msgspec.structs.replace(snapshot("a"), gpu_nic_topology=links)


ALLOC_ZERO = ClusterView(
    present=True, nodes={"a": ClusterNode(name="a", allocatable={"rdma/ib": "0"})}
)
ALLOC_OK = ClusterView(
    present=True, nodes={"a": ClusterNode(name="a", allocatable={"rdma/ib": "64"})}
)


@pytest.mark.parametrize(
    ("policies", "records", "cluster", "node_state", "expected"),
    [
        pytest.param(
            (IB,), (record(),), NO_CLUSTER, "Ready",
            {"Ready": ("True", "AllNodesReady"), "Degraded": ("False", "AsExpected"),
             "ConfigApplied": ("True", "AllApplied"),
             "ResourcesAdvertised": ("True", "AllAdvertised"),
             "TopologyOK": ("True", "WithinLimit")},
            id="all-good-from-agent-status",
        ),
        pytest.param(
            (IB,), (record(dp=plugin_status("a", resource_status("rdma/ib"), generation=0)),),
            NO_CLUSTER, "ConfigPending",
            {"Ready": ("False", "ConfigPending"), "ConfigApplied": ("False", "ConfigPending")},
            id="agent-behind",
        ),
        pytest.param(
            (IB,), (record(dp=plugin_status("a", resource_status("rdma/ib", advertised=0))),),
            NO_CLUSTER, "NotAdvertised",
            {"Ready": ("False", "ResourceNotAdvertised"),
             "ResourcesAdvertised": ("False", "NotAdvertised")},
            id="agent-advertises-zero",
        ),
        pytest.param(
            (IB,), (record(dp=plugin_status("a", resource_status("rdma/roce"))),),
            NO_CLUSTER, "NotAdvertised", {"ResourcesAdvertised": ("False", "NotAdvertised")},
            id="resource-missing-on-agent",
        ),
        pytest.param(
            (IB,), (record(),), ALLOC_ZERO, "NotAdvertised",
            {"Ready": ("False", "AllocatableZero"),
             "ResourcesAdvertised": ("False", "AllocatableZero")},
            id="allocatable-zero-while-agent-advertises",
        ),
        pytest.param(
            (IB,), (record(),), ALLOC_OK, "Ready", {"Ready": ("True", "AllNodesReady")},
            id="allocatable-from-cluster",
        ),
        pytest.param(
            (IB,), (record(dp=plugin_status("a", resource_status("rdma/ib", healthy=0))),),
            NO_CLUSTER, "Unhealthy", {"Ready": ("False", "NoHealthyDevice")},
            id="no-healthy-device",
        ),
        pytest.param(
            (IB,), (record(), record("b", last_seen=T0 - 60)), NO_CLUSTER, "Ready",
            {"Ready": ("True", "AllNodesReady"), "Degraded": ("True", "NodeStale")},
            id="stale-node-does-not-block-ready",
        ),
        pytest.param(
            (IB, ROCE), (record(),), NO_CLUSTER, "Conflict",
            {"Ready": ("False", "PolicyConflict"), "Degraded": ("True", "PolicyConflict")},
            id="conflict",
        ),
        pytest.param(
            (IB,), (record(snap=with_topology("PHB")),), NO_CLUSTER, "Ready",
            {"TopologyOK": ("False", "RelationTooFar"), "Degraded": ("True", "RelationTooFar")},
            id="topology-beyond-default-pxb",
        ),
        pytest.param(
            (msgspec.structs.replace(IB, spec=msgspec.structs.replace(
                IB.spec, expect=Expect(max_gpu_nic_relation="PHB"))),),
            (record(snap=with_topology("PHB")),), NO_CLUSTER, "Ready",
            {"TopologyOK": ("True", "WithinLimit")}, id="topology-within-explicit-limit",
        ),
    ],
)  # fmt: skip
def test_policy_status_table(
    policies: tuple[Policy, ...],
    records: tuple[NodeRecord, ...],
    cluster: ClusterView,
    node_state: str,
    expected: dict[str, tuple[str, str]],
) -> None:
    result = status(policies, records, cluster)
    node = next(n for n in result.nodes if n.node == "a")
    assert node.state == node_state
    got = conditions(result)
    for type_, value in expected.items():
        assert got[type_] == value, type_


def test_allocatable_zero_reason_names_node_and_resource() -> None:
    result = status((IB,), (record(),), ALLOC_ZERO)
    advertised = next(c for c in result.conditions if c.type == "ResourcesAdvertised")
    assert "a:" in advertised.message and "rdma/ib" in advertised.message
    assert "allocatable 0" in advertised.message


def test_summary_counts() -> None:
    records = (
        record("a"),
        record("b", dp=plugin_status("b", resource_status("rdma/ib"), generation=0)),
        record("c", dp=plugin_status("c", resource_status("rdma/ib", healthy=0))),
        record("d", last_seen=T0 - 60),
    )
    summary = status((IB,), records).summary
    assert (summary.selected, summary.configured, summary.advertising) == (4, 2, 2)
    assert (summary.healthy, summary.ready, summary.stale) == (2, 1, 1)


def test_no_node_selected_is_not_ready() -> None:
    result = status((rdma_policy("gpu", labels={"pool": "gpu"}),), (), ClusterView(present=True))
    assert conditions(result)["Ready"] == ("False", "NoNodesSelected")


def test_policy_errors_degrade_and_are_kept() -> None:
    result = status((IB,), (record(),), errors=("p.yaml: document 0: $.spec.x: unknown",))
    assert conditions(result)["Degraded"] == ("True", "InvalidPolicy")
    assert "$.spec.x" in next(c.message for c in result.conditions if c.type == "Degraded")
    assert result.errors == ("p.yaml: document 0: $.spec.x: unknown",)


def test_status_changes_report_transitions_with_reasons() -> None:
    before = status((IB,), (record(), record("b")))
    after = status((IB,), (record(dp=plugin_status("a", resource_status("rdma/ib", healthy=0))),))
    changes = status_changes(before, after)
    assert [(c.node, c.old, c.new, c.reason) for c in changes] == [
        ("a", "Ready", "Unhealthy", "NoHealthyDevice"),
        ("b", "Ready", None, "NodeUnselected"),
    ]
    assert status_changes(after, after) == ()
    first = status_changes(None, before)
    assert [(c.node, c.old, c.new) for c in first] == [("a", None, "Ready"), ("b", None, "Ready")]


def test_node_labels_and_worst_relation() -> None:
    snap = msgspec.structs.replace(
        with_topology("PXB"), devices=(nic("mlx5_0"), nic("mlx5_1", index=1))
    )
    assert worst_gpu_relation(snap) == ("0000:18:00.0", "PXB")
    labels = node_labels(snap)
    assert labels == {
        "nicfleet.io/rdma": "true",
        "nicfleet.io/link-layer": "InfiniBand",
        "nicfleet.io/rdma-rate-gbps": "400",
        "nicfleet.io/gpu-nic-relation": "PXB",
    }
    assert node_labels(snapshot("x", devices=())) == {}
