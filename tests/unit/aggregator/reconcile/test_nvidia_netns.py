"""The audit's findings for the RDMA netns mode: one critical nvidia-rdma-netns-exclusive per
node in exclusive mode, none for shared or unknown nodes, none when the config already fails
everywhere (that is the one nvidia-policy-invalid)."""

from __future__ import annotations

from typing import Any

from aggregator.fleet.state import NodeRecord
from aggregator.reconcile.nvidia import RULE_INVALID, RULE_NETNS, audit_nic_cluster_policy
from proto.inventory import RdmaNetnsMode
from tests.unit.proto.test_nicclusterpolicy_netns import ncp, node


def record(name: str, mode: RdmaNetnsMode | None) -> NodeRecord:
    return NodeRecord(name=name, snapshot=node(name, mode), first_seen=0.0, last_seen=0.0)


def test_one_finding_per_exclusive_node() -> None:
    modes: dict[str, RdmaNetnsMode | None] = {
        "ex1": "exclusive", "ex2": "exclusive", "sh": "shared", "un": None,
    }  # fmt: skip
    fleet = {n: record(n, m) for n, m in modes.items()}
    found = [f for f in audit_nic_cluster_policy(ncp(), fleet) if f.rule == RULE_NETNS]
    assert [(f.node, f.severity) for f in found] == [("ex1", "critical"), ("ex2", "critical")]
    assert found[0].subject == "NicClusterPolicy/nic-cluster-policy"
    assert "ex1: upstream would not start: RDMA subsystem in exclusive" in found[0].message
    evidence: dict[str, Any] = dict(found[0].evidence)
    assert evidence["path"] == "spec.rdmaSharedDevicePlugin"
    assert "nicfleet's device plugin starts" in evidence["reason"]
    assert evidence["fatal"] is True


def test_a_config_failing_everywhere_is_one_finding_not_one_per_node() -> None:
    bad = {"configList": [{"resourceName": "a-b", "rdmaHcaMax": 1, "devices": ["ib0"]}]}
    rules = [f.rule for f in audit_nic_cluster_policy(ncp(bad), {"ex": record("ex", "exclusive")})]
    assert RULE_INVALID in rules and RULE_NETNS not in rules
