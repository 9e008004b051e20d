"""The chain trace (pure): a healthy chain, then each link broken in turn."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pytest

from aggregator.cluster import ClusterNode, ClusterView, NetworkAttachment, PodRequest
from aggregator.fleet.adapterhistory import AdapterHistory, ResourcePeak
from aggregator.fleet.state import NodeRecord
from aggregator.trace.chain import LINK_NAMES, UnknownNode, UnknownResource, trace
from proto.http import Trace, ValidationRecord
from proto.inventory import Device, ModuleInfo, NodeSnapshot
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.messages.validation import Evidence, RdmaInterface, ValidationResult
from proto.policy import Policy
from tests.support.builders import (
    T0,
    modules,
    nic,
    plugin_status,
    rdma_policy,
    resource_status,
    snapshot,
)

NODE = "gpu-001"
RES = "rdma/ib"


def adapter(name: str, index: int, **kwargs: Any) -> Device:
    return msgspec.structs.replace(
        nic(name, index=index, netdevs=(f"ib{index}",), **kwargs), fw_ver="28.39.1002"
    )


ADAPTERS = (adapter("mlx5_0", 0), adapter("mlx5_1", 1))
SERVED = plugin_status(NODE, resource_status(RES, devices=("mlx5_0", "mlx5_1")))
# A passed pair validation (aggregator.validations.record): the chain's tested-data-path link.
VALIDATED = ValidationRecord(
    id="abc123", nodes=(NODE, "gpu-002"), resource=RES, namespace="nicfleet-system",
    phase="done", passed=True, created_at=T0 - 60, updated_at=T0, phase_since=T0,
    finished_at=T0, bytes_per_second=24e9,
    # verify on gpu-001 found its IPoIB interface (the chain's pod-interface link)
    server=ValidationResult(
        verdict="rdma-path", started_at=T0 - 30, finished_at=T0 - 10,
        evidence=Evidence(rdma_interfaces=(
            RdmaInterface(interface="net1", device="mlx5_0", sources=("device-net",)),
        )),
    ),
)  # fmt: skip


@dataclass(frozen=True)
class World:
    devices: tuple[Device, ...] = ADAPTERS
    modules: dict[str, ModuleInfo] = field(default_factory=modules)
    status: DevicePluginStatus | None = SERVED
    policies: tuple[Policy, ...] = (rdma_policy("ib", RES),)
    in_fleet: bool = True
    has_snapshot: bool = True
    allocatable: dict[str, str] | None = field(default_factory=lambda: {RES: "2"})
    capacity: dict[str, str] = field(default_factory=dict)
    pods: tuple[PodRequest, ...] = (
        PodRequest(namespace="ml", name="train-0", node=NODE, phase="Running", requests={RES: 1}),
        PodRequest(namespace="ml", name="train-1", phase="Pending", requests={RES: 1}),
    )
    attachments: tuple[NetworkAttachment, ...] = (
        NetworkAttachment(namespace="ml", name="ib-net", resource_name=RES, master="ib0"),
    )
    cluster_present: bool = True
    now: float = T0 + 5
    validation: ValidationRecord | None = VALIDATED
    adapters: AdapterHistory | None = None  # what the agent process showed before

    def fleet(self) -> dict[str, NodeRecord]:
        if not self.in_fleet:
            return {"gpu-002": NodeRecord(name="gpu-002", first_seen=T0, last_seen=T0)}
        snap: NodeSnapshot | None = None
        if self.has_snapshot:
            snap = msgspec.structs.replace(
                snapshot(NODE, devices=self.devices), modules=self.modules
            )
        record = NodeRecord(
            name=NODE, snapshot=snap, first_seen=T0, last_seen=T0, device_plugin=self.status,
            adapters=self.adapters,
        )  # fmt: skip
        return {NODE: record}

    def cluster(self) -> ClusterView:
        if not self.cluster_present:
            return ClusterView()
        nodes = {"gpu-002": ClusterNode(name="gpu-002")}
        if self.allocatable is not None:
            nodes[NODE] = ClusterNode(
                name=NODE, allocatable=self.allocatable, capacity=self.capacity
            )
        return ClusterView(present=True, nodes=nodes, pods=self.pods, attachments=self.attachments)

    def trace(self, node: str = NODE, resource: str = RES) -> Trace:
        return trace(
            node,
            resource,
            fleet=self.fleet(),
            cluster=self.cluster(),
            policies=self.policies,
            now=self.now,
            stale_after=30.0,
            validation=self.validation,
        )


HEALTHY = World()


def served(**kwargs: Any) -> DevicePluginStatus:
    kwargs.setdefault("devices", ("mlx5_0", "mlx5_1"))
    return plugin_status(NODE, resource_status(RES, **kwargs))


def without(names: tuple[str, ...], *drop: str) -> dict[str, ModuleInfo]:
    return {n: ModuleInfo() for n in names if n not in drop}


ALL_MODULES = tuple(modules())
DOWN = (adapter("mlx5_0", 0, state="DOWN"), adapter("mlx5_1", 1, state="DOWN"))


def _init_ports() -> tuple[Device, ...]:
    # Physical link up but the port never went past INIT: no subnet manager.
    return tuple(
        msgspec.structs.replace(
            d, ports=tuple(msgspec.structs.replace(p, state="INIT") for p in d.ports)
        )
        for d in ADAPTERS
    )


INIT = _init_ports()


def test_healthy_chain() -> None:
    result = HEALTHY.trace()
    assert [link.name for link in result.links] == list(LINK_NAMES)
    assert [link.status for link in result.links] == ["ok"] * len(LINK_NAMES)
    assert (result.verdict, result.ok, result.first_broken) == ("ok", True, None)
    assert result.verdict_reason == "every link holds"
    assert all(link.cause is None and link.fix is None for link in result.links)
    by_name = {link.name: link for link in result.links}
    assert by_name["adapter"].evidence["selected"] == ["mlx5_0", "mlx5_1"]
    assert by_name["device-plugin"].evidence["registration"] == "registered"
    assert by_name["advertised"].evidence == {"advertised": 2, "healthy": 2, "unhealthy": {}}
    assert by_name["allocatable"].evidence["allocatable"] == "2"
    pods = by_name["pods"].evidence
    assert (pods["running"], pods["pending"], pods["pending_unscheduled"]) == (1, 0, 1)
    assert pods["attachments"] == [
        {"name": "ml/ib-net", "k8s.v1.cni.cncf.io/resourceName": RES, "master": "ib0"}
    ]
    # The JSON form is the API's answer; it must encode.
    assert msgspec.json.decode(msgspec.json.encode(result))["first_broken"] is None


def test_no_cluster_leaves_kubernetes_links_unknown() -> None:
    result = replace(HEALTHY, cluster_present=False).trace()
    statuses = {link.name: link.status for link in result.links}
    assert statuses["allocatable"] == statuses["pods"] == "unknown"
    assert result.links[7].evidence == {"cluster": "no cluster"}
    # Not judged is not ok: the verdict says which links it could not judge.
    assert (result.verdict, result.ok, result.first_broken) == ("unknown", False, None)
    assert result.verdict_reason == (
        "6 links not judged (components, allocatable, pods, scheduling, attachment, ip-pool); "
        "nothing broken"
    )


def test_resource_served_without_a_policy() -> None:
    result = replace(HEALTHY, policies=()).trace()
    assert result.ok
    assert result.links[5].evidence["policies"] == []


@pytest.mark.parametrize(
    ("world", "link", "cause"),
    [
        pytest.param(replace(HEALTHY, now=T0 + 100), "agent", "not reporting since", id="stale"),
        pytest.param(replace(HEALTHY, in_fleet=False), "agent", "no agent has ever", id="no-agent"),
        pytest.param(
            replace(HEALTHY, has_snapshot=False), "agent", "no inventory", id="no-snapshot"
        ),
        pytest.param(
            replace(HEALTHY, status=served(devices=(), unmatched={"mlx5_0": "vendors"})),
            "adapter",
            "no adapter matches the selectors of rdma/ib (mlx5_0: vendors)",
            id="nothing-selected",
        ),
        pytest.param(
            replace(HEALTHY, devices=ADAPTERS[:1]), "adapter", "mlx5_1 missing", id="adapter-gone"
        ),
        pytest.param(
            replace(HEALTHY, devices=(), modules=without(ALL_MODULES, "mlx5_ib")),
            "driver",
            "mlx5_ib not loaded: RDMA devices cannot exist",
            id="no-mlx5_ib",
        ),
        pytest.param(
            replace(HEALTHY, devices=(), modules={}),
            "driver",
            "mlx5_core not loaded",
            id="no-mlx5_core",
        ),
        pytest.param(
            replace(HEALTHY, devices=(adapter("mlx5_0", 0, driver=None), ADAPTERS[1])),
            "driver",
            "no driver bound to mlx5_0",
            id="unbound",
        ),
        pytest.param(
            replace(HEALTHY, devices=(adapter("mlx5_0", 0, driver="vfio-pci"), ADAPTERS[1])),
            "driver",
            "passthrough driver",
            id="vfio",
        ),
        pytest.param(
            replace(
                HEALTHY, devices=(msgspec.structs.replace(ADAPTERS[0], fw_ver=None), ADAPTERS[1])
            ),
            "driver",
            "no firmware version readable on mlx5_0",
            id="no-firmware",
        ),
        pytest.param(replace(HEALTHY, devices=DOWN), "rdma-device", "no physical link", id="down"),
        pytest.param(
            replace(HEALTHY, devices=INIT),
            "rdma-device",
            "no subnet manager",
            id="no-subnet-manager",
        ),
        pytest.param(
            replace(
                HEALTHY,
                devices=(adapter("mlx5_0", 0, char_devices=()), adapter("mlx5_1", 1)),
                modules=without(ALL_MODULES, "ib_uverbs"),
            ),
            "char-devices",
            "no /dev/infiniband/uverbsN for mlx5_0: ib_uverbs not loaded",
            id="no-uverbs",
        ),
        pytest.param(
            replace(
                HEALTHY,
                devices=tuple(adapter(d.name, i, rdma_cm=False) for i, d in enumerate(ADAPTERS)),
            ),
            "char-devices",
            "rdma_ucm not loaded",
            id="no-rdma_cm",
        ),
        pytest.param(
            replace(HEALTHY, status=None), "device-plugin", "never reported", id="no-plugin"
        ),
        pytest.param(
            replace(HEALTHY, status=plugin_status(NODE, resource_status("rdma/other"))),
            "device-plugin",
            "configured but the agent does not serve it (applied config generation 1)",
            id="not-served",
        ),
        pytest.param(
            replace(HEALTHY, status=served(registration="waiting")),
            "device-plugin",
            "kubelet's socket is not there",
            id="waiting-for-kubelet",
        ),
        pytest.param(
            replace(HEALTHY, status=served(registration="rejected", error="bad version")),
            "device-plugin",
            "rejected the registration: bad version",
            id="rejected",
        ),
        pytest.param(
            replace(HEALTHY, policies=(rdma_policy("a", RES), rdma_policy("b", RES))),
            "device-plugin",
            "selected by 2 policies",
            id="policy-conflict",
        ),
        pytest.param(
            replace(HEALTHY, status=served(advertised=0, healthy=0)),
            "advertised",
            "advertises 0 devices",
            id="advertised-0",
        ),
        pytest.param(
            replace(
                HEALTHY,
                status=served(healthy=0, unhealthy={"mlx5_0": "port 1 DOWN"}),
            ),
            "advertised",
            "all 2 devices are unhealthy (mlx5_0: port 1 DOWN)",
            id="unhealthy",
        ),
        pytest.param(
            replace(HEALTHY, allocatable={RES: "0"}),
            "allocatable",
            "the plugin has 2 healthy devices but the kubelet lists 0",
            id="allocatable-0",
        ),
        pytest.param(
            replace(HEALTHY, allocatable=None),
            "allocatable",
            "not a node of the Kubernetes cluster",
            id="not-a-cluster-node",
        ),
        pytest.param(
            replace(
                HEALTHY,
                attachments=(
                    NetworkAttachment(namespace="ml", name="eth", resource_name=RES, master="eth9"),
                ),
            ),
            "attachment",
            "ml/eth uses master 'eth9', not a netdev of the adapters selected for rdma/ib",
            id="nad-wrong-master",
        ),
    ],
)
def test_each_broken_link(world: World, link: str, cause: str) -> None:
    result = world.trace()
    assert result.first_broken is not None, result.links
    broken = result.links[result.first_broken]
    assert broken.name == link
    assert broken.status == "broken"
    assert broken.cause is not None and cause in broken.cause
    assert broken.fix
    assert not result.ok
    assert all(x.status != "broken" for x in result.links[: result.first_broken])


def test_driver_missing_leaves_adapter_unknown() -> None:
    result = replace(HEALTHY, devices=(), modules=without(ALL_MODULES, "mlx5_ib")).trace()
    assert result.links[1].status == "unknown"
    assert result.links[2].fix == "load mlx5_ib (modprobe mlx5_ib) or check the OFED install"


def test_stale_agent_still_checks_the_last_known_data() -> None:
    result = replace(HEALTHY, now=T0 + 100, devices=DOWN).trace()
    assert result.first_broken == 0
    assert "stale after 30s" in (result.links[0].cause or "")
    assert result.links[3].status == "broken"


def test_one_adapter_down_degrades_the_chain_and_names_it() -> None:
    unhealthy = {"mlx5_0": "no port ACTIVE/LinkUp (1:DOWN/Disabled)"}
    world = replace(
        HEALTHY,
        devices=(DOWN[0], ADAPTERS[1]),
        status=served(healthy=1, unhealthy=unhealthy),
        allocatable={RES: "1"},
        capacity={RES: "2"},
    )
    result = world.trace()
    by_name = {link.name: link for link in result.links}
    rdma = by_name["rdma-device"]
    assert rdma.status == "degraded"
    assert rdma.evidence["adapters_down"] == rdma.evidence["degraded_adapters"] == ["mlx5_0"]
    assert rdma.cause == ("1 of 2 selected adapters up; mlx5_0/1 not active: no physical link")
    advertised = by_name["advertised"]
    assert advertised.status == "degraded"
    assert (
        advertised.cause
        == "1 of 2 devices healthy (mlx5_0: no port ACTIVE/LinkUp (1:DOWN/Disabled))"
    )
    assert by_name["allocatable"].status == "degraded"
    assert "offers 1 of 2 rdma/ib" in (by_name["allocatable"].cause or "")
    assert (result.verdict, result.ok, result.first_broken) == ("degraded", False, None)
    assert result.verdict_reason == (
        "capacity reduced on mlx5_0 (rdma-device, advertised, allocatable)"
    )


@pytest.mark.parametrize(
    ("generation", "status"),
    [pytest.param(1, "degraded", id="same-config"), pytest.param(2, "ok", id="new-config")],
)
def test_fewer_advertised_than_the_agents_peak_is_degraded(generation: int, status: str) -> None:
    peak = ResourcePeak(advertised=2, devices=("mlx5_0", "mlx5_1"), config_generation=1, at=T0)
    world = replace(
        HEALTHY,
        devices=ADAPTERS[:1],  # mlx5_1 unregistered: the plugin serves mlx5_0 only
        status=plugin_status(
            NODE, resource_status(RES, devices=("mlx5_0",)), generation=generation
        ),
        adapters=AdapterHistory(epoch=0, since=T0, peaks={RES: peak}),
    )
    result = world.trace()
    advertised = result.links[6]
    assert advertised.status == status
    if status == "degraded":
        assert advertised.cause == (
            "1 advertised over 1 adapter, down from 2 over 2 adapters since the agent started "
            "(same config): mlx5_1 no longer served"
        )
        assert advertised.evidence["degraded_adapters"] == ["mlx5_1"]
        assert result.verdict == "degraded"


def test_a_shared_resource_with_one_adapter_unhealthy_is_degraded() -> None:
    # Shared device IDs stay Healthy while any adapter is: `unhealthy` names the one down.
    unhealthy = {"mlx5_0": "no port ACTIVE/LinkUp (1:DOWN/Disabled)"}
    world = replace(HEALTHY, status=served(advertised=64, unhealthy=unhealthy))
    link = world.trace().links[6]
    assert (link.status, link.evidence["degraded_adapters"]) == ("degraded", ["mlx5_0"])
    assert link.cause == (
        "1 of 2 selected adapters unhealthy (mlx5_0: no port ACTIVE/LinkUp (1:DOWN/Disabled)); "
        "the 64 shared devices run on the others"
    )


def test_every_adapter_down_is_broken_not_degraded() -> None:
    result = replace(HEALTHY, devices=DOWN, status=served(healthy=0)).trace()
    assert (result.verdict, result.first_broken) == ("broken", 3)
    assert result.verdict_reason.startswith("link 3 (rdma-device): no active port")


def test_unknown_node_suggests_close_names() -> None:
    with pytest.raises(UnknownNode) as caught:
        HEALTHY.trace(node="gpu-01")
    assert caught.value.suggestions[0] == NODE
    assert set(caught.value.suggestions) <= {NODE, "gpu-002"}


def test_node_known_to_the_cluster_only_is_traced() -> None:
    result = HEALTHY.trace(node="gpu-002")
    assert result.first_broken == 0
    assert result.links[0].cause == "no agent has ever reported from gpu-002"


@pytest.mark.parametrize("resource", ["rdma/ibb", "rdma/nothing"])
def test_unknown_resource_names_what_the_node_has(resource: str) -> None:
    with pytest.raises(UnknownResource) as caught:
        HEALTHY.trace(resource=resource)
    assert caught.value.suggestions == (RES,)
    assert "known here: rdma/ib" in str(caught.value)


def test_served_only_status_fields_are_the_agents_account() -> None:
    status: ResourceStatus = resource_status(RES, devices=("mlx5_1",), advertised=64)
    result = replace(HEALTHY, status=plugin_status(NODE, status), attachments=()).trace()
    assert result.verdict == "unknown"  # no NAD: attachment and ip-pool cannot be judged
    assert result.links[2].evidence["drivers"] == {"mlx5_1": "mlx5_core"}


def test_allocatable_zero_follows_unhealthy_devices() -> None:
    world = replace(HEALTHY, status=served(healthy=0), allocatable={RES: "0"})
    link = world.trace().links[7]
    assert link.status == "broken"
    assert "counts only healthy devices" in (link.cause or "")


def test_evidence_config_leaves_out_unset_fields() -> None:
    result = HEALTHY.trace()
    assert result.links[1].evidence["selectors"] == {"vendors": ["15b3"]}
    config = result.links[5].evidence["config"]
    assert config == {
        "resourceName": "ib",
        "resourcePrefix": "rdma",
        "rdmaHcaMax": 64,
        "selectors": {"vendors": ["15b3"]},
        "exclusive": False,
    }


def test_unknown_resource_on_a_node_without_any_says_how_to_get_one() -> None:
    error = UnknownResource(NODE, "rdma/ib", ())
    assert "its agent serves none" in str(error)
    assert "--device-plugin-config" in str(error)
