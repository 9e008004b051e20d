"""The chain trace of a resource the agent leaves out of its config (`registration:
config-invalid`, the others served): the device-plugin and advertised links name the field
and the error, and the fix is to correct that field."""

from __future__ import annotations

from aggregator.cluster import ClusterView
from aggregator.fleet.state import NodeRecord
from aggregator.trace.chain import trace
from proto.http import Link
from proto.messages.status import ResourceStatus
from tests.support.builders import T0, nic, plugin_status, resource_status, snapshot

NODE = "gpu-001"
BAD = "kubernetes.io/ib_c"
PATH = "configList[1].resourcePrefix"
ERROR = "'kubernetes.io' is reserved for Kubernetes"


def links(status: ResourceStatus) -> dict[str, Link]:
    record = NodeRecord(
        name=NODE,
        snapshot=snapshot(NODE, devices=(nic("mlx5_0"),)),
        first_seen=T0,
        last_seen=T0,
        device_plugin=plugin_status(NODE, resource_status("rdma/ib"), status),
    )
    result = trace(
        NODE,
        status.name,
        fleet={NODE: record},
        cluster=ClusterView(),
        policies=(),
        now=T0 + 1,
        stale_after=30.0,
    )
    return {link.name: link for link in result.links}


def test_device_plugin_and_advertised_links_name_the_field_and_the_error() -> None:
    # As agent.deviceplugin.advertised reports an entry it does not serve.
    bad = ResourceStatus(
        name=BAD, registration="config-invalid", config_path=PATH, config_error=ERROR
    )
    by_name = links(bad)
    plugin = by_name["device-plugin"]
    assert plugin.status == "broken"
    assert plugin.cause == (
        f"the device-plugin config's entry for {BAD} is invalid, the agent does not serve it:"
        f" {PATH}: {ERROR}"
    )
    assert plugin.fix == f"correct {PATH} in the device-plugin config"
    assert (plugin.evidence["config_path"], plugin.evidence["config_error"]) == (PATH, ERROR)
    advertised = by_name["advertised"]
    assert advertised.status == "broken"
    assert advertised.cause is not None and f"{PATH}: {ERROR}" in advertised.cause
    assert advertised.fix == f"correct {PATH} in the device-plugin config"


def test_a_served_resource_has_no_config_evidence() -> None:
    plugin = links(resource_status("rdma/ib_b"))["device-plugin"]
    assert plugin.status == "ok"
    assert "config_path" not in plugin.evidence
