"""The secondary-network rules (pure): nad-resource-mismatch, nad-master-not-selected,
ip-pool-exhausted and ip-pool-low — and that incremental evaluation re-runs them when only
the cluster's pods, NADs or pools change."""

from __future__ import annotations

import msgspec
from msgspec.structs import replace as sr

from aggregator.cluster import (
    ClusterNode,
    ClusterView,
    HeldAddresses,
    IpPool,
    NetworkAttachment,
    NetworkStatus,
    PodRequest,
    PoolBlock,
)
from aggregator.fleet.state import NodeRecord
from aggregator.placement import Requirement, SelectorTerm
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import CLUSTER_RULES, evaluate
from aggregator.rules.finding import Finding
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, parse_alerts
from tests.support.builders import T0, modules, nic, plugin_status, resource_status, snapshot

NODE = "gpu-001"
RES = "rdma/ib"
NAD = NetworkAttachment(
    namespace="ml", name="rdma-net", cni_type="ipoib", master="ib0", ipam_type="nv-ipam",
    ipam_pools=("pool1",),
)  # fmt: skip
POOL = IpPool(
    kind="nv-ipam-ippool", namespace="nvidia-network-operator", name="pool1",
    network="192.168.0.0/24", block_size=4,
    blocks={NODE: PoolBlock(node=NODE, first="192.168.0.1", last="192.168.0.4")},
)  # fmt: skip
OURS = frozenset({"nad-resource-mismatch", "nad-master-not-selected", "ip-pool-exhausted",
                  "ip-pool-low"})  # fmt: skip


def pod(name: str, ip: str) -> PodRequest:
    return PodRequest(
        namespace="ml", name=name, node=NODE, phase="Running", requests={RES: 1},
        networks=("ml/rdma-net",),
        network_status=(NetworkStatus(name="ml/rdma-net", interface="net1", ips=(ip,)),),
    )  # fmt: skip


def fleet() -> dict[str, NodeRecord]:
    devices = (nic("mlx5_0", netdevs=("ib0",)),)
    snap = msgspec.structs.replace(snapshot(NODE, devices=devices), modules=modules())
    status = plugin_status(NODE, resource_status(RES, devices=("mlx5_0",)))
    return {NODE: NodeRecord(name=NODE, snapshot=snap, first_seen=T0, last_seen=T0,
                             device_plugin=status)}  # fmt: skip


def cluster(**kwargs: object) -> ClusterView:
    fields: dict[str, object] = {
        "present": True, "pods": (pod("a", "192.168.0.1"),), "attachments": (NAD,),
        "ip_pools": (POOL,),
    }  # fmt: skip
    return ClusterView(**(fields | kwargs))  # type: ignore[arg-type]


def ours(view: ClusterView, thresholds: object = DEFAULT_THRESHOLDS) -> list[Finding]:
    found = evaluate(fleet(), (), view, T0 + 1, thresholds=thresholds)  # type: ignore[arg-type]
    return [f for f in found if f.rule in OURS]


def test_healthy_networks_have_no_findings() -> None:
    assert ours(cluster()) == []


def test_every_rule_here_reads_the_cluster() -> None:
    assert OURS <= CLUSTER_RULES


def test_annotation_naming_another_resource() -> None:
    (finding,) = ours(cluster(attachments=(sr(NAD, resource_name="rdma/other"),)))
    assert (finding.rule, finding.node, finding.subject) == (
        "nad-resource-mismatch", NODE, "nad/ml/rdma-net",
    )  # fmt: skip
    assert finding.evidence["annotation"] == "rdma/other"


def test_annotated_nad_used_by_a_pod_requesting_nothing_says_so() -> None:
    bare = sr(pod("a", "192.168.0.1"), requests={})
    found = ours(cluster(pods=(bare,), attachments=(sr(NAD, resource_name=RES),)))
    (finding,) = [f for f in found if f.rule == "nad-resource-mismatch"]
    assert "requests no device-plugin resource" in finding.message
    assert f"request {RES} in the pod" in finding.message
    assert "requests :" not in finding.message


def test_master_not_selected_with_and_without_annotation() -> None:
    for nad in (sr(NAD, master="ib7"), sr(NAD, master="ib7", resource_name=RES)):
        (finding,) = ours(cluster(attachments=(nad,)))
        assert (finding.rule, finding.severity) == ("nad-master-not-selected", "critical")
        assert "ib7" in finding.message


def test_annotated_nad_nobody_uses_yet_is_checked_on_serving_nodes() -> None:
    spare = sr(NAD, name="spare", master="eth3", resource_name=RES)
    (finding,) = ours(cluster(pods=(), attachments=(spare,)))
    assert (finding.rule, finding.subject) == ("nad-master-not-selected", "nad/ml/spare")


def test_pool_exhausted_and_low() -> None:
    full = tuple(pod(f"p{i}", f"192.168.0.{i}") for i in range(1, 5))
    (exhausted,) = ours(cluster(pods=full))
    assert (exhausted.rule, exhausted.severity, exhausted.subject) == (
        "ip-pool-exhausted", "critical", "pool/nvidia-network-operator/pool1",
    )  # fmt: skip
    assert exhausted.evidence["free"] == 0
    (low,) = ours(cluster(pods=full[:2]))  # 2 of 4 left: at the default lowFree 2
    assert (low.rule, low.severity, low.evidence["free"]) == ("ip-pool-low", "warning", 2)
    stricter = parse_alerts({"ip-pool-low": {"thresholds": {"lowFree": 1}}})
    assert ours(cluster(pods=full[:2]), stricter) == []


def test_no_block_for_the_node_is_exhausted() -> None:
    (finding,) = ours(cluster(ip_pools=(sr(POOL, blocks={}),)))
    assert finding.rule == "ip-pool-exhausted"
    assert "no block for gpu-001" in finding.message


def test_host_local_raises_nothing() -> None:
    local = sr(NAD, ipam_type="host-local", ipam_pools=())
    assert ours(cluster(attachments=(local,))) == []


def test_incremental_follows_a_cluster_object_change() -> None:
    engine = IncrementalRules()
    records = fleet()
    before = cluster()
    assert [f for f in engine.evaluate(records, (), before, T0 + 1) if f.rule in OURS] == []
    rebuilds = engine.rebuilds
    after = cluster(attachments=(sr(NAD, master="ib7"),))
    assert not engine.starts_over((), before, DEFAULT_THRESHOLDS)
    assert engine.starts_over((), after, DEFAULT_THRESHOLDS)  # every node: off the loop
    found = engine.evaluate(records, (), after, T0 + 2)
    assert [f.rule for f in found if f.rule in OURS] == ["nad-master-not-selected"]
    assert engine.rebuilds == rebuilds  # re-ran those rules, did not start over
    assert found == evaluate(records, (), after, T0 + 2)


def test_other_pods_addresses_count_against_the_nodes_block() -> None:
    # One RDMA pod holds .1; pods of other workloads on the node hold the rest of the block.
    others = (HeldAddresses(namespace="web", name="w", node=NODE,
                            ips=("192.168.0.2", "192.168.0.3", "192.168.0.4")),)  # fmt: skip
    (finding,) = ours(cluster(held_addresses=others))
    assert (finding.rule, finding.evidence["used"], finding.evidence["counted"]) == (
        "ip-pool-exhausted", 4, "network-status",
    )  # fmt: skip


def test_low_says_free_is_an_upper_bound_for_nv_ipam() -> None:
    (low,) = ours(cluster(pods=(pod("a", "192.168.0.1"), pod("b", "192.168.0.2"))))
    assert "has at most 2 of 4 addresses left" in low.message


def test_pool_not_selecting_the_node_is_exhausted_for_it() -> None:
    other = (SelectorTerm(match_expressions=(
        Requirement(key="pool", operator="In", values=("storage",)),)),)  # fmt: skip
    view = cluster(ip_pools=(sr(POOL, node_selector=other),),
                   nodes={NODE: ClusterNode(name=NODE, labels={"pool": "gpu"})})  # fmt: skip
    (finding,) = ours(view)
    assert (finding.rule, finding.evidence["state"]) == ("ip-pool-exhausted", "not-selected")
    assert "nodeSelector does not select gpu-001" in finding.message
    assert "select the node in the pool's nodeSelector" in finding.message


def test_pool_the_node_agent_refuses_is_exhausted_for_it() -> None:
    overlapping = (("192.168.0.2", "192.168.0.3"), ("192.168.0.3", "192.168.0.3"))
    (finding,) = ours(cluster(ip_pools=(sr(POOL, exclusions=overlapping),)))
    assert (finding.rule, finding.evidence["state"]) == ("ip-pool-exhausted", "invalid")
    assert "overlap" in finding.message


def test_incremental_follows_the_addresses_other_pods_hold() -> None:
    engine = IncrementalRules()
    records = fleet()
    before = cluster()
    assert [f for f in engine.evaluate(records, (), before, T0 + 1) if f.rule in OURS] == []
    held = (HeldAddresses(namespace="web", name="w", node=NODE,
                          ips=("192.168.0.2", "192.168.0.3", "192.168.0.4")),)  # fmt: skip
    after = cluster(held_addresses=held)
    assert engine.starts_over((), after, DEFAULT_THRESHOLDS)
    found = engine.evaluate(records, (), after, T0 + 2)
    assert [f.rule for f in found if f.rule in OURS] == ["ip-pool-exhausted"]
