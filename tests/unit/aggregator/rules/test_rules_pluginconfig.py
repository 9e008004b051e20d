"""resource-config-invalid: a configList entry the agent reports as not served (invalid,
with the field at fault) is one critical finding naming node, resource and field; it
resolves once the entry is served, and resource-zero leaves such an entry alone."""

from __future__ import annotations

from proto.messages.status import ResourceStatus
from tests.support.rules_cases import fleet_of, hits, node, status

GOOD = ResourceStatus(name="rdma/a", advertised=4, healthy=4, devices=("mlx5_0",))
BAD = ResourceStatus(
    name="nvidia.kubernetes.io/b",
    registration="config-invalid",
    config_path="configList[1].resourcePrefix",
    config_error="'nvidia.kubernetes.io' is reserved for Kubernetes",
)
FIXED = ResourceStatus(name="nvidia.com/b", advertised=4, healthy=4, devices=("mlx5_1",))


def test_an_invalid_entry_is_one_finding_naming_node_resource_and_field() -> None:
    scenario = fleet_of(node("n1"), statuses=(status("n1", GOOD, BAD),))
    assert hits("resource-config-invalid", scenario) == {("n1", "nvidia.kubernetes.io/b")}
    (finding,) = [f for f in scenario.findings() if f.rule == "resource-config-invalid"]
    assert finding.severity == "critical"
    assert finding.evidence["field"] == "configList[1].resourcePrefix"
    assert "reserved for Kubernetes" in str(finding.evidence["reason"])
    assert "configList[1].resourcePrefix" in finding.message and "n1" in finding.message


def test_it_resolves_once_served_and_resource_zero_leaves_it_alone() -> None:
    bad = fleet_of(node("n1"), statuses=(status("n1", GOOD, BAD),))
    assert hits("resource-zero", bad) == set()
    fixed = fleet_of(node("n1"), statuses=(status("n1", GOOD, FIXED),))
    assert hits("resource-config-invalid", fixed) == set()


def test_no_status_no_finding() -> None:
    assert hits("resource-config-invalid", fleet_of(node("n1"))) == set()
