"""aggregator.podnetworks (pure): which NADs a resource's pods use, whether their master is
a selected adapter's netdev, and what their IP pools have left for a node."""

from __future__ import annotations

import pytest

from aggregator.cluster import (
    ClusterView,
    IpPool,
    NetworkAttachment,
    NetworkStatus,
    PodRequest,
    PoolBlock,
)
from aggregator.podnetworks import master_selected, nad_uses, pool_uses
from tests.support.builders import nic

RES = "rdma/ib"
DEVICES = (nic("mlx5_0", index=0, netdevs=("ib0",)), nic("mlx5_1", index=1, netdevs=("ib1",)))


def nad(**kwargs: object) -> NetworkAttachment:
    fields: dict[str, object] = {"namespace": "ml", "name": "rdma-net", "cni_type": "ipoib"}
    return NetworkAttachment(**(fields | kwargs))  # type: ignore[arg-type]


def pod(name: str, *ips: str, node: str = "gpu-001") -> PodRequest:
    status = (NetworkStatus(name="ml/rdma-net", interface="net1", ips=ips),) if ips else ()
    return PodRequest(
        namespace="ml", name=name, node=node, phase="Running", requests={RES: 1},
        networks=("ml/rdma-net",), network_status=status,
    )  # fmt: skip


def test_nad_uses_requested_then_annotated() -> None:
    cluster = ClusterView(present=True, attachments=(
        nad(), nad(name="other", resource_name=RES), nad(namespace="prod", name="lost"),
    ))  # fmt: skip
    asking = PodRequest(namespace="ml", name="a", networks=("ml/rdma-net", "ml/lost"))
    uses = nad_uses(RES, [asking], cluster)
    assert [(u.key, u.attachment is not None, u.requested_by) for u in uses] == [
        ("ml/rdma-net", True, ("ml/a",)),
        ("ml/lost", False, ("ml/a",)),
        ("ml/other", True, ()),
    ]
    assert uses[1].elsewhere == ("prod/lost",)


@pytest.mark.parametrize(
    ("attachment", "expected"),
    [
        pytest.param(nad(master="ib1"), True, id="master"),
        pytest.param(nad(master="ib1.8001"), True, id="child-or-vlan"),
        pytest.param(nad(master="eth9"), False, id="other-netdev"),
        pytest.param(nad(cni_type="sriov"), None, id="sriov-no-master"),
        pytest.param(nad(cni_type="host-device", pci_address="0000:19:00.0"), True, id="pci"),
        pytest.param(nad(cni_type="host-device", pci_address="0000:99:00.0"), False, id="pci-no"),
    ],
)
def test_master_selected(attachment: NetworkAttachment, expected: bool | None) -> None:
    assert master_selected(attachment, DEVICES) is expected


IPPOOL = IpPool(
    kind="nv-ipam-ippool", namespace="nvidia-network-operator", name="pool1",
    network="192.168.0.0/24", block_size=8, gateway="192.168.0.1",
    exclusions=(("192.168.0.3", "192.168.0.4"),),
    blocks={"gpu-001": PoolBlock(node="gpu-001", first="192.168.0.1", last="192.168.0.8")},
)  # fmt: skip
CIDRPOOL = IpPool(
    kind="nv-ipam-cidrpool", namespace="nvidia-network-operator", name="pool1",
    network="10.0.0.0/16", node_prefix=29, gateway_index=1,
    blocks={"gpu-001": PoolBlock(node="gpu-001", prefix="10.0.0.0/29", gateway="10.0.0.1")},
)  # fmt: skip
WHEREABOUTS = IpPool(
    kind="whereabouts", namespace="kube-system", name="192.168.5.0-29", network="192.168.5.0/29",
    allocated={"192.168.5.1": "ml/a", "192.168.5.2": "ml/b"},
)  # fmt: skip


@pytest.mark.parametrize(
    ("attachment", "pools", "pods", "expected"),
    [
        # 8 addresses, minus the gateway and 2 excluded = 5; 2 held by pods here.
        pytest.param(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), (IPPOOL,),
                     (pod("a", "192.168.0.2"), pod("b", "192.168.0.5/24"),
                      pod("c", "192.168.0.6", node="gpu-002")),
                     ("ok", 5, 2, 3), id="ippool-block"),
        pytest.param(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), (IPPOOL,),
                     tuple(pod(f"p{i}", f"192.168.0.{i}") for i in (2, 5, 6, 7, 8)),
                     ("exhausted", 5, 5, 0), id="ippool-exhausted"),
        # /29: 6 hosts, minus the gateway = 5.
        pytest.param(nad(ipam_type="nv-ipam", ipam_pools=("pool1",), ipam_pool_type="cidrpool"),
                     (CIDRPOOL,), (pod("a", "10.0.0.2"),), ("ok", 5, 1, 4), id="cidrpool"),
        pytest.param(nad(ipam_type="whereabouts", ipam_range="192.168.5.0/29"), (WHEREABOUTS,),
                     (), ("ok", 6, 2, 4), id="whereabouts"),
        pytest.param(nad(ipam_type="whereabouts", ipam_range="192.168.6.0/30"), (WHEREABOUTS,),
                     (), ("ok", 2, 0, 2), id="whereabouts-no-pool-yet"),
        pytest.param(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)),
                     (IpPool(kind="nv-ipam-ippool", namespace="n", name="pool1",
                             network="192.168.0.0/29", block_size=8),),
                     (), ("no-block", 0, 0, 0), id="no-block"),
        pytest.param(nad(ipam_type="nv-ipam", ipam_pools=("nope",)), (IPPOOL,), (),
                     ("missing", None, None, None), id="pool-missing"),
        pytest.param(nad(ipam_type="host-local"), (), (),
                     ("not-observable", None, None, None), id="host-local"),
        pytest.param(nad(ipam_type="dhcp"), (), (), ("not-observable", None, None, None),
                     id="dhcp"),
        pytest.param(nad(ipam_type="calico-ipam"), (), (),
                     ("not-observable", None, None, None), id="other-ipam"),
        pytest.param(nad(), (), (), ("no-pool", None, None, None), id="no-ipam"),
        pytest.param(nad(ipam_type="static"), (), (), ("no-pool", None, None, None),
                     id="static"),
    ],
)  # fmt: skip
def test_pool_uses(
    attachment: NetworkAttachment,
    pools: tuple[IpPool, ...],
    pods: tuple[PodRequest, ...],
    expected: tuple[str, int | None, int | None, int | None],
) -> None:
    cluster = ClusterView(present=True, attachments=(attachment,), pods=pods, ip_pools=pools)
    (use,) = pool_uses(attachment, "gpu-001", cluster)
    assert (use.state, use.capacity, use.used, use.free) == expected, use


def test_host_local_says_why_not_observable() -> None:
    (use,) = pool_uses(nad(ipam_type="host-local"), "gpu-001", ClusterView(present=True))
    assert "/var/lib/cni/networks" in use.detail


def test_no_block_when_every_block_is_taken_says_so() -> None:
    blocks = {
        "a": PoolBlock(node="a", first="192.168.0.0", last="192.168.0.3"),
        "b": PoolBlock(node="b", first="192.168.0.4", last="192.168.0.7"),
    }
    full = IpPool(kind="nv-ipam-ippool", namespace="n", name="pool1", network="192.168.0.0/29",
                  block_size=4, blocks=blocks)  # fmt: skip
    cluster = ClusterView(present=True, ip_pools=(full,))
    (use,) = pool_uses(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), "gpu-001", cluster)
    assert use.state == "no-block"
    assert "all 2 blocks of 192.168.0.0/29 are taken" in use.detail
