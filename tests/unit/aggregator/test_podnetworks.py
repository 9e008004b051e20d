"""aggregator.podnetworks (pure): which NADs a resource's pods use, whether their master is
a selected adapter's netdev, and what their IP pools have left for a node."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.cluster import (
    ClusterNode,
    ClusterView,
    HeldAddresses,
    IpamRange,
    IpPool,
    NetworkAttachment,
    NetworkStatus,
    PodRequest,
    PoolBlock,
)
from aggregator.placement import Requirement, SelectorTerm
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
    # /28 from .1 in blocks of 4: .1-.4, .5-.8, .9-.12 (.13-.16 would end on the broadcast).
    blocks = {
        n: PoolBlock(node=n, first=f"192.168.0.{i}", last=f"192.168.0.{i + 3}")
        for n, i in (("a", 1), ("b", 5), ("c", 9))
    }
    full = IpPool(kind="nv-ipam-ippool", namespace="n", name="pool1", network="192.168.0.0/28",
                  block_size=4, blocks=blocks)  # fmt: skip
    cluster = ClusterView(present=True, ip_pools=(full,))
    (use,) = pool_uses(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), "gpu-001", cluster)
    assert use.state == "no-block"
    assert "all 3 blocks of 192.168.0.0/28 are taken" in use.detail


# --- whose pool, and who holds its addresses --------------------------------------------------

GPU_LABELS = {"kubernetes.io/hostname": "gpu-001", "nvidia.com/gpu.present": "true"}


def selector(key: str, operator: str, *values: str) -> tuple[SelectorTerm, ...]:
    return (SelectorTerm(match_expressions=(Requirement(key=key, operator=operator,
                                                        values=values),)),)  # fmt: skip


@pytest.mark.parametrize(
    ("terms", "state"),
    [
        pytest.param(None, "ok", id="no-selector-every-node"),
        pytest.param(selector("nvidia.com/gpu.present", "In", "true"), "ok", id="selects"),
        pytest.param(selector("pool", "In", "storage"), "not-selected", id="other-nodes"),
        pytest.param((), "not-selected", id="no-terms-selects-nothing"),
    ],
)
def test_nv_ipam_pool_counts_only_on_the_nodes_it_selects(
    terms: tuple[SelectorTerm, ...] | None, state: str
) -> None:
    pool = msgspec.structs.replace(IPPOOL, node_selector=terms)
    nodes = {"gpu-001": ClusterNode(name="gpu-001", labels=GPU_LABELS)}
    cluster = ClusterView(present=True, ip_pools=(pool,), nodes=nodes)
    (use,) = pool_uses(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), "gpu-001", cluster)
    assert use.state == state
    if state == "not-selected":
        assert "nodeSelector does not select gpu-001" in use.detail


def test_nv_ipam_used_counts_every_unfinished_pods_addresses() -> None:
    # One RDMA pod, one other pod (any resource) and a finished one, all on gpu-001.
    held = (
        HeldAddresses(namespace="web", name="x", node="gpu-001", ips=("192.168.0.6",)),
        HeldAddresses(namespace="web", name="y", node="gpu-002", ips=("192.168.0.7",)),
    )
    finished = msgspec.structs.replace(pod("done", "192.168.0.8"), phase="Succeeded")
    cluster = ClusterView(present=True, ip_pools=(IPPOOL,), held_addresses=held,
                          pods=(pod("a", "192.168.0.2"), finished))  # fmt: skip
    (use,) = pool_uses(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), "gpu-001", cluster)
    assert (use.capacity, use.used, use.free, use.counted) == (5, 2, 3, "network-status")
    assert use.detail.startswith("at least 2 used")


def test_nv_ipam_overlapping_exclusions_make_the_pool_invalid() -> None:
    pool = msgspec.structs.replace(
        IPPOOL, exclusions=(("192.168.0.3", "192.168.0.4"), ("192.168.0.4", "192.168.0.5"))
    )
    cluster = ClusterView(present=True, ip_pools=(pool,))
    (use,) = pool_uses(nad(ipam_type="nv-ipam", ipam_pools=("pool1",)), "gpu-001", cluster)
    assert use.state == "invalid"
    assert "overlap" in use.detail


def wb_nad(**kwargs: object) -> NetworkAttachment:
    return nad(ipam_type="whereabouts", **kwargs)


def wb_pool(name: str, network: str, *held: str) -> IpPool:
    return IpPool(kind="whereabouts", namespace="kube-system", name=name, network=network,
                  allocated={ip: f"ml/{i}" for i, ip in enumerate(held)})  # fmt: skip


@pytest.mark.parametrize(
    ("attachment", "pools", "expected"),
    [
        # .10-.20 is 11 addresses, less the excluded /30 .12-.15 = 7; .11 and .30 held,
        # .30 outside the range: 1 used.
        pytest.param(
            wb_nad(ipam_ranges=(IpamRange(range="10.0.0.0/24", range_start="10.0.0.10",
                                          range_end="10.0.0.20", exclude=("10.0.0.12/30",)),)),
            (wb_pool("10.0.0.0-24", "10.0.0.0/24", "10.0.0.11", "10.0.0.30"),),
            ("ok", 7, 1, 6), id="range-start-end-exclude"),
        # network_name names the pool: the unnamed one is another network's.
        pytest.param(
            wb_nad(ipam_ranges=(IpamRange(range="10.0.0.0/29"),), ipam_network_name="blue"),
            (wb_pool("10.0.0.0-29", "10.0.0.0/29", "10.0.0.1"),
             wb_pool("blue-10.0.0.0-29", "10.0.0.0/29", "10.0.0.1", "10.0.0.2")),
            ("ok", 6, 2, 4), id="network-name"),
        pytest.param(
            wb_nad(ipam_ranges=(IpamRange(range="10.0.0.0/24", exclude=("bogus",)),)),
            (), ("invalid", None, None, None), id="exclude-refused"),
        # Fast IPAM: the node's /30 slice (2 usable), its pool named after node and slice.
        pytest.param(
            wb_nad(ipam_ranges=(IpamRange(range="10.1.0.0/28", exclude=("10.1.0.4/30",)),),
                   ipam_node_slice_size="/30", config_name="rdma-net"),
            (IpPool(kind="whereabouts-nodeslice", namespace="kube-system", name="rdma-net",
                    network="10.1.0.0/28", node_prefix=30,
                    blocks={"gpu-001": PoolBlock(node="gpu-001", prefix="10.1.0.4/30")}),
             wb_pool("gpu-001-10.1.0.4-30", "10.1.0.4/30", "10.1.0.5")),
            ("ok", 2, 1, 1), id="node-slice-exclude-not-applied"),
        pytest.param(
            wb_nad(ipam_ranges=(IpamRange(range="10.1.0.0/28"),), ipam_node_slice_size="30",
                   ipam_network_name="blue"),
            (IpPool(kind="whereabouts-nodeslice", namespace="kube-system", name="blue",
                    network="10.1.0.0/28", node_prefix=30,
                    blocks={n: PoolBlock(node=n, prefix=f"10.1.0.{4 * i}/30")
                            for i, n in enumerate(("a", "b", "c", "d"))}),),
            ("no-block", 0, 0, 0), id="node-slices-all-taken"),
        pytest.param(
            wb_nad(ipam_ranges=(IpamRange(range="10.1.0.0/28"),), ipam_node_slice_size="30",
                   ipam_network_name="blue"),
            (), ("missing", None, None, None), id="no-node-slice-pool"),
    ],
)  # fmt: skip
def test_whereabouts_pool_uses(
    attachment: NetworkAttachment,
    pools: tuple[IpPool, ...],
    expected: tuple[str, int | None, int | None, int | None],
) -> None:
    (use,) = pool_uses(attachment, "gpu-001", ClusterView(present=True, ip_pools=pools))
    assert (use.state, use.capacity, use.used, use.free) == expected, use


def test_whereabouts_ip_ranges_each_counted() -> None:
    attachment = wb_nad(ipam_ranges=(IpamRange(range="10.0.0.0/29"),
                                     IpamRange(range="fd00::/125")))  # fmt: skip
    uses = pool_uses(attachment, "gpu-001", ClusterView(present=True))
    assert [(u.pool, u.capacity) for u in uses] == [("10.0.0.0-29", 6), ("fd00---125", 6)]
