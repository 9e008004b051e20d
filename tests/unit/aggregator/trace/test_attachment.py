"""The chain's `attachment` and `ip-pool` links (pure), through `trace`: each way a pod's
secondary network breaks, and where the links sit in the chain."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec
import pytest
from msgspec.structs import replace as sr

from aggregator.cluster import (
    ClusterNode,
    ClusterView,
    IpPool,
    NetworkAttachment,
    NetworkStatus,
    PodRequest,
    PoolBlock,
)
from aggregator.fleet.state import NodeRecord
from aggregator.trace.attachment import ATTACHMENT_LINK
from aggregator.trace.chain import LINK_NAMES, trace
from aggregator.trace.ippool import IP_POOL_LINK
from proto.http import Link
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
ADAPTERS = (
    msgspec.structs.replace(nic("mlx5_0", index=0, netdevs=("ib0",)), fw_ver="28.39.1002"),
    msgspec.structs.replace(nic("mlx5_1", index=1, netdevs=("ib1",)), fw_ver="28.39.1002"),
)
NAD = NetworkAttachment(
    namespace="ml", name="rdma-net", cni_type="ipoib", master="ib0", ipam_type="nv-ipam",
    ipam_pools=("pool1",),
)  # fmt: skip
POOL = IpPool(
    kind="nv-ipam-ippool", namespace="nvidia-network-operator", name="pool1",
    network="192.168.0.0/24", block_size=4,
    blocks={NODE: PoolBlock(node=NODE, first="192.168.0.1", last="192.168.0.4")},
)  # fmt: skip
STATUS = NetworkStatus(
    name="ml/rdma-net", interface="net1", ips=("192.168.0.1",), pci_address="0000:19:00.0",
    rdma_device="mlx5_0",
)  # fmt: skip
POD = PodRequest(
    namespace="ml", name="train-0", node=NODE, phase="Running", requests={RES: 1},
    networks=("ml/rdma-net",), network_status=(STATUS,),
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    pods: tuple[PodRequest, ...] = (POD,)
    attachments: tuple[NetworkAttachment, ...] = (NAD,)
    pools: tuple[IpPool, ...] = (POOL,)
    present: bool = True
    has_snapshot: bool = True

    def links(self, pod: PodRequest | None = None) -> dict[str, Link]:
        snap = (
            msgspec.structs.replace(snapshot(NODE, devices=ADAPTERS), modules=modules())
            if self.has_snapshot
            else None
        )
        status = plugin_status(NODE, resource_status(RES, devices=("mlx5_0", "mlx5_1")))
        record = NodeRecord(name=NODE, snapshot=snap, first_seen=T0, last_seen=T0,
                            device_plugin=status)  # fmt: skip
        cluster = ClusterView(
            present=self.present, nodes={NODE: ClusterNode(name=NODE, allocatable={RES: "2"})},
            pods=self.pods, attachments=self.attachments, ip_pools=self.pools,
        ) if self.present else ClusterView()  # fmt: skip
        result = trace(NODE, RES, fleet={NODE: record}, cluster=cluster,
                       policies=(rdma_policy("ib", RES),), now=T0 + 1, stale_after=30.0,
                       pod=pod)  # fmt: skip
        return {link.name: link for link in result.links}


HEALTHY = Case()


def test_links_sit_after_scheduling_before_the_tested_path() -> None:
    names = list(LINK_NAMES)
    assert names.index("pods") < names.index(ATTACHMENT_LINK) < names.index(IP_POOL_LINK)
    assert names.index(IP_POOL_LINK) < names.index("tested-data-path")
    if "scheduling" in names:
        assert names.index("scheduling") < names.index(ATTACHMENT_LINK)


def test_healthy_attachment_and_pool() -> None:
    links = HEALTHY.links()
    attachment, pool = links[ATTACHMENT_LINK], links[IP_POOL_LINK]
    assert (attachment.status, pool.status) == ("ok", "ok"), (attachment, pool)
    assert attachment.evidence["attachments"][0]["requested_by"] == ["ml/train-0"]
    assert attachment.evidence["interfaces"][0]["interface"] == "net1"
    (found,) = pool.evidence["pools"]
    assert (found["capacity"], found["used"], found["free"]) == (4, 1, 3)
    assert found["block"] == "192.168.0.1-192.168.0.4"


def test_without_a_cluster_both_are_unknown() -> None:
    links = replace(HEALTHY, present=False).links()
    assert links[ATTACHMENT_LINK].status == links[IP_POOL_LINK].status == "unknown"


def test_nothing_to_attach_is_unknown_not_broken() -> None:
    plain = sr(POD, networks=(), network_status=())
    links = replace(HEALTHY, pods=(plain,), attachments=()).links()
    assert links[ATTACHMENT_LINK].status == "unknown"
    assert links[IP_POOL_LINK].status == "unknown"


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        pytest.param(
            replace(HEALTHY, attachments=(sr(NAD, namespace="default"),)),
            "requests NetworkAttachmentDefinition ml/rdma-net, which does not exist (there is "
            "one in default/rdma-net)",
            id="nad-in-another-namespace",
        ),
        pytest.param(
            replace(HEALTHY, attachments=(sr(NAD, config_error="spec.config is not JSON"),)),
            "ml/rdma-net: spec.config is not JSON",
            id="bad-config",
        ),
        pytest.param(
            replace(HEALTHY, attachments=(sr(NAD, resource_name="rdma/other"),)),
            "annotated k8s.v1.cni.cncf.io/resourceName=rdma/other, but pod ml/train-0 "
            "requests rdma/ib",
            id="annotation-names-another-resource",
        ),
        pytest.param(
            replace(HEALTHY, attachments=(sr(NAD, master="ib7"),)),
            "uses master 'ib7', not a netdev of the adapters selected for rdma/ib",
            id="master-not-selected-without-annotation",
        ),
        pytest.param(
            replace(
                HEALTHY,
                attachments=(
                    sr(NAD, cni_type="host-device", master=None, pci_address="0000:aa:00.0"),
                ),
            ),
            "uses 0000:aa:00.0, not a netdev of the adapters",
            id="host-device-pci-not-selected",
        ),
        pytest.param(
            replace(HEALTHY, pods=(sr(POD, networks_error="not valid JSON"),)),
            "pod ml/train-0: not valid JSON",
            id="bad-networks-annotation",
        ),
        pytest.param(
            replace(HEALTHY, pods=(sr(POD, network_status=()),)),
            "network-status has no entry for ml/rdma-net",
            id="not-attached",
        ),
        pytest.param(
            replace(
                HEALTHY,
                pods=(
                    sr(
                        POD,
                        network_status=(
                            sr(STATUS, rdma_device="mlx5_9", pci_address="0000:aa:00.2"),
                        ),
                    ),
                ),
            ),
            "attached to mlx5_9, not an adapter the resource selects",
            id="device-info-other-adapter",
        ),
    ],
)
def test_attachment_broken(case: Case, cause: str) -> None:
    link = case.links()[ATTACHMENT_LINK]
    assert link.status == "broken", link
    assert link.cause is not None and cause in link.cause
    assert link.fix


def test_annotated_nad_without_pods_is_checked_too() -> None:
    annotated = sr(NAD, name="spare", master="eth3", resource_name=RES)
    link = replace(HEALTHY, pods=(), attachments=(annotated,)).links()[ATTACHMENT_LINK]
    assert link.status == "broken"
    assert "ml/spare uses master 'eth3'" in (link.cause or "")


def test_pending_pod_is_not_judged_by_its_network_status() -> None:
    pending = sr(POD, phase="Pending", network_status=())
    assert replace(HEALTHY, pods=(pending,)).links()[ATTACHMENT_LINK].status == "ok"


def test_without_inventory_masters_are_not_judged() -> None:
    case = replace(HEALTHY, attachments=(sr(NAD, master="ib7"),), has_snapshot=False)
    assert case.links()[ATTACHMENT_LINK].status == "unknown"


def test_a_pods_own_chain_reads_only_that_pod() -> None:
    other = sr(POD, name="train-1", network_status=())  # would break the node's chain
    case = replace(HEALTHY, pods=(POD, other))
    assert case.links()[ATTACHMENT_LINK].status == "broken"
    assert case.links(pod=POD)[ATTACHMENT_LINK].status == "ok"


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        pytest.param(
            replace(HEALTHY, pods=tuple(
                sr(POD, name=f"t{i}", network_status=(sr(STATUS, ips=(f"192.168.0.{i}",)),))
                for i in range(1, 5))),
            "block 192.168.0.1-192.168.0.4 of gpu-001 has 0 of 4 addresses free",
            id="exhausted",
        ),
        pytest.param(
            replace(HEALTHY, pools=(sr(POOL, blocks={}),)),
            "has no block for gpu-001",
            id="no-block-for-node",
        ),
        pytest.param(
            replace(HEALTHY, pools=()),
            "no NV-IPAM IPPool named 'pool1'",
            id="pool-missing",
        ),
    ],
)  # fmt: skip
def test_ip_pool_broken(case: Case, cause: str) -> None:
    link = case.links()[IP_POOL_LINK]
    assert link.status == "broken", link
    assert link.cause is not None and cause in link.cause
    assert link.fix


def test_host_local_is_not_observable() -> None:
    case = replace(HEALTHY, attachments=(sr(NAD, ipam_type="host-local", ipam_pools=()),))
    link = case.links()[IP_POOL_LINK]
    assert link.status == "unknown"
    assert "not observable" in link.evidence["reason"]
