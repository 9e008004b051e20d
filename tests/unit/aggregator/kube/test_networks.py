"""Secondary-network objects as the upstream controllers write them -> the cluster model
(aggregator.kube.networks, pure): NAD CNI configs, Multus network-status, NV-IPAM
IPPool/CIDRPool and whereabouts IPPool."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggregator.cluster import HeldAddresses, IpamRange, NetworkStatus, PoolBlock
from aggregator.kube.networks import (
    CniConfig,
    held_addresses_from_object,
    ip_pool_from_object,
    parse_cni_config,
    parse_network_status,
)
from aggregator.kube.objects import attachment_from_object, networks_error, pod_request_from_object
from aggregator.placement import Requirement, SelectorTerm

NV_IPAM = {"type": "nv-ipam", "poolName": "pool1"}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"cniVersion": "0.3.1", "type": "macvlan", "master": "ens1f0", "mode": "bridge",
             "ipam": NV_IPAM},
            CniConfig(cni_type="macvlan", master="ens1f0", ipam_type="nv-ipam",
                      ipam_pools=("pool1",)),
            id="macvlan-nv-ipam",
        ),
        pytest.param(
            {"cniVersion": "0.3.1", "type": "ipoib", "master": "ib0",
             "ipam": {"type": "whereabouts", "range": "192.168.5.225/28"}},
            CniConfig(cni_type="ipoib", master="ib0", ipam_type="whereabouts",
                      ipam_range="192.168.5.225/28",
                      ipam_ranges=(IpamRange(range="192.168.5.224/28"),)),
            id="ipoib-whereabouts",
        ),
        pytest.param(
            {"cniVersion": "0.3.1", "type": "host-device", "device": "ens2f0",
             "ipam": {"type": "host-local", "subnet": "10.56.217.0/24"}},
            CniConfig(cni_type="host-device", master="ens2f0", ipam_type="host-local"),
            id="host-device-by-name",
        ),
        pytest.param(
            {"cniVersion": "0.3.1", "type": "host-device", "pciBusID": "0000:3b:00.1"},
            CniConfig(cni_type="host-device", pci_address="0000:3b:00.1"),
            id="host-device-by-pci",
        ),
        pytest.param(
            {"cniVersion": "0.3.1", "type": "sriov", "vlan": 0,
             "ipam": {"type": "nv-ipam", "poolName": "v4,v6", "poolType": "cidrpool"}},
            CniConfig(cni_type="sriov", ipam_type="nv-ipam", ipam_pools=("v4", "v6"),
                      ipam_pool_type="cidrpool"),
            id="sriov-cidrpool-dual-stack",
        ),
        pytest.param(
            {"cniVersion": "0.4.0", "name": "rdma", "plugins": [
                {"type": "macvlan", "master": "ens1f1", "ipam": {"type": "static"}},
                {"type": "tuning", "sysctl": {}},
            ]},
            CniConfig(cni_type="macvlan", master="ens1f1", ipam_type="static",
                      config_name="rdma"),
            id="conflist",
        ),
    ],
)  # fmt: skip
def test_cni_config_of_each_type(config: dict[str, Any], expected: CniConfig) -> None:
    assert parse_cni_config(json.dumps(config)) == expected


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        pytest.param("{not json", "spec.config is not JSON", id="bad-json"),
        pytest.param("", "spec.config is empty", id="empty"),
        pytest.param(None, "spec.config is empty", id="absent"),
        pytest.param("[1]", "not a JSON object", id="a-list"),
        pytest.param('{"master": "ib0"}', "no CNI type", id="no-type"),
        pytest.param('{"plugins": []}', "no plugins", id="empty-conflist"),
        pytest.param(7, "not a string", id="number"),
    ],
)
def test_bad_cni_config_is_a_reason(raw: object, error: str) -> None:
    found = parse_cni_config(raw)
    assert found.error is not None and error in found.error
    assert found.cni_type is None


def test_attachment_carries_the_parsed_config() -> None:
    nad = attachment_from_object({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "rdma-net", "namespace": "ml",
                     "annotations": {"k8s.v1.cni.cncf.io/resourceName": "rdma/ib"}},
        "spec": {"config": json.dumps({"cniVersion": "0.3.1", "type": "ipoib", "master": "ib0",
                                       "ipam": NV_IPAM})},
    })  # fmt: skip
    assert nad is not None
    assert (nad.cni_type, nad.master, nad.ipam_type, nad.ipam_pools) == (
        "ipoib", "ib0", "nv-ipam", ("pool1",),
    )  # fmt: skip
    assert nad.resource_name == "rdma/ib" and nad.config_error is None


# Multus' network-status as it writes it: the default network first, then each attachment;
# device-info as the SR-IOV device plugin / host-device report it (device-info-spec 1.1.0).
NETWORK_STATUS = [
    {"name": "cbr0", "interface": "eth0", "ips": ["10.244.1.7"], "mac": "0a:58:0a:f4:01:07",
     "default": True, "dns": {}},
    {"name": "ml/rdma-net", "interface": "net1", "ips": ["192.168.2.5"],
     "mac": "ae:12:4f:55:00:01", "dns": {},
     "device-info": {"type": "pci", "version": "1.1.0",
                     "pci": {"pci-address": "0000:19:00.2", "rdma-device": "mlx5_4"}}},
]  # fmt: skip


def test_network_status_skips_the_default_network() -> None:
    assert parse_network_status(json.dumps(NETWORK_STATUS)) == (
        NetworkStatus(
            name="ml/rdma-net", interface="net1", ips=("192.168.2.5",), mac="ae:12:4f:55:00:01",
            pci_address="0000:19:00.2", rdma_device="mlx5_4",
        ),
    )  # fmt: skip


@pytest.mark.parametrize("raw", [None, "", "{", '{"name": "x"}', '[{"interface": "net1"}]', "[7]"])
def test_bad_network_status_is_empty(raw: str | None) -> None:
    assert parse_network_status(raw) == ()


def test_pod_reads_network_status_and_the_old_annotation() -> None:
    def pod(annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
            "spec": {"containers": [{"resources": {"limits": {"rdma/ib": "1"}}}]},
        }

    new = pod({"k8s.v1.cni.cncf.io/networks": "rdma-net@net1",
               "k8s.v1.cni.cncf.io/network-status": json.dumps(NETWORK_STATUS)})  # fmt: skip
    old = pod({"k8s.v1.cni.cncf.io/networks-status": json.dumps(NETWORK_STATUS)})
    for obj in (new, old):
        found = pod_request_from_object(obj, ("rdma/",))
        assert found is not None
        assert [s.name for s in found.network_status] == ["ml/rdma-net"]
    parsed = pod_request_from_object(new, ("rdma/",))
    assert parsed is not None and parsed.networks == ("ml/rdma-net",)


@pytest.mark.parametrize(
    ("annotation", "error"),
    [
        pytest.param("a, other/b@net2", None, id="comma-list"),
        pytest.param('[{"name": "a", "namespace": "ml", "interface": "net1"}]', None, id="json"),
        pytest.param('[{"name": "a"', "not valid JSON", id="bad-json"),
        pytest.param('[{"namespace": "ml"}]', "not a list of", id="no-name"),
    ],
)
def test_networks_annotation_error(annotation: str, error: str | None) -> None:
    found = networks_error(annotation)
    assert (found is None) if error is None else (found is not None and error in found)


def test_nv_ipam_ippool_as_the_controller_writes_it() -> None:
    pool = ip_pool_from_object("nv-ipam-ippool", {
        "apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "pool1", "namespace": "nvidia-network-operator"},
        "spec": {"subnet": "192.168.0.0/16", "perNodeBlockSize": 100, "gateway": "192.168.0.1",
                 "exclusions": [{"startIP": "192.168.0.10", "endIP": "192.168.0.20"}],
                 "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]}]}},
        "status": {"allocations": [
            {"nodeName": "gpu-001", "startIP": "192.168.0.1", "endIP": "192.168.0.100"},
            {"nodeName": "gpu-002", "startIP": "192.168.0.101", "endIP": "192.168.0.200"},
        ]},
    })  # fmt: skip
    assert pool is not None
    assert (pool.network, pool.block_size, pool.gateway) == ("192.168.0.0/16", 100, "192.168.0.1")
    assert pool.exclusions == (("192.168.0.10", "192.168.0.20"),)
    assert pool.blocks["gpu-001"] == PoolBlock(
        node="gpu-001", first="192.168.0.1", last="192.168.0.100"
    )
    assert pool.node_selector == (
        SelectorTerm(match_expressions=(
            Requirement(key="node-role.kubernetes.io/worker", operator="Exists"),)),
    )  # fmt: skip


def test_nv_ipam_cidrpool_as_the_controller_writes_it() -> None:
    pool = ip_pool_from_object("nv-ipam-cidrpool", {
        "apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "CIDRPool",
        "metadata": {"name": "pool1", "namespace": "nvidia-network-operator"},
        "spec": {"cidr": "192.168.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 24,
                 "exclusions": [{"startIP": "192.168.0.10", "endIP": "192.168.0.20"}],
                 "staticAllocations": [{"nodeName": "gpu-003", "prefix": "192.168.9.0/24"}]},
        "status": {"allocations": [
            {"nodeName": "gpu-001", "prefix": "192.168.0.0/24", "gateway": "192.168.0.1"},
            {"nodeName": "", "prefix": "192.168.1.0/24"},
        ]},
    })  # fmt: skip
    assert pool is not None
    assert (pool.network, pool.node_prefix, pool.gateway_index) == ("192.168.0.0/16", 24, 1)
    assert pool.blocks == {
        "gpu-001": PoolBlock(node="gpu-001", prefix="192.168.0.0/24", gateway="192.168.0.1")
    }
    assert pool.static_prefixes == ("192.168.9.0/24",)
    assert pool.node_selector is None  # no spec.nodeSelector: every node


def test_nv_ipam_per_node_exclusions_are_index_pairs() -> None:
    pool = ip_pool_from_object("nv-ipam-ippool", {
        "metadata": {"name": "pool1", "namespace": "nvidia-network-operator"},
        "spec": {"subnet": "10.0.0.0/24", "perNodeBlockSize": 16,
                 "perNodeExclusions": [{"startIndex": 0, "endIndex": 1},
                                       {"startIndex": 9}]},
    })  # fmt: skip
    assert pool is not None
    assert pool.per_node_exclusions == ((0, 1),)


def test_whereabouts_node_slice_pool_as_the_node_controller_writes_it() -> None:
    pool = ip_pool_from_object("whereabouts-nodeslice", {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "NodeSlicePool",
        "metadata": {"name": "rdma-net", "namespace": "kube-system"},
        "spec": {"range": "10.1.0.0/16", "sliceSize": "/22"},
        "status": {"allocations": [
            {"nodeName": "gpu-001", "sliceRange": "10.1.0.0/22"},
            {"nodeName": "", "sliceRange": "10.1.4.0/22"},
        ]},
    })  # fmt: skip
    assert pool is not None
    assert (pool.kind, pool.network, pool.node_prefix) == (
        "whereabouts-nodeslice",
        "10.1.0.0/16",
        22,
    )
    assert pool.blocks == {"gpu-001": PoolBlock(node="gpu-001", prefix="10.1.0.0/22")}


@pytest.mark.parametrize(
    ("ipam", "expected"),
    [
        pytest.param(
            {"type": "whereabouts", "range": "10.0.0.0/24", "range_start": "10.0.0.10",
             "range_end": "10.0.0.20", "exclude": ["10.0.0.12/30"]},
            (IpamRange(range="10.0.0.0/24", range_start="10.0.0.10", range_end="10.0.0.20",
                       exclude=("10.0.0.12/30",)),),
            id="range-start-end-exclude"),
        # "first-last/prefix" sets both ends (whereabouts pkg/config).
        pytest.param(
            {"type": "whereabouts", "range": "192.168.2.225-192.168.2.230/24"},
            (IpamRange(range="192.168.2.0/24", range_start="192.168.2.225",
                       range_end="192.168.2.230"),),
            id="dash-notation"),
        pytest.param(
            {"type": "whereabouts", "range": "10.0.0.0/24",
             "ipRanges": [{"range": "fd00::/64", "exclude": ["fd00::1"]}]},
            (IpamRange(range="10.0.0.0/24"), IpamRange(range="fd00::/64", exclude=("fd00::1",))),
            id="ip-ranges"),
    ],
)  # fmt: skip
def test_whereabouts_ranges(ipam: dict[str, Any], expected: tuple[IpamRange, ...]) -> None:
    config = parse_cni_config(json.dumps({"cniVersion": "0.3.1", "name": "n", "type": "ipoib",
                                          "master": "ib0", "ipam": ipam}))  # fmt: skip
    assert config.ipam_ranges == expected


def test_whereabouts_fast_ipam_settings() -> None:
    config = parse_cni_config(json.dumps({"cniVersion": "0.3.1", "name": "rdma-net",
        "type": "macvlan", "master": "ens1f0", "ipam": {
            "type": "whereabouts", "range": "10.1.0.0/16", "node_slice_size": "/22",
            "network_name": "blue"}}))  # fmt: skip
    assert (config.ipam_node_slice_size, config.ipam_network_name, config.config_name) == (
        "/22",
        "blue",
        "rdma-net",
    )


def pod_object(phase: str, *, node: str | None = "gpu-001") -> dict[str, Any]:
    status = [{"name": "cbr0", "ips": ["10.244.0.5"], "default": True},
              {"name": "web/storage-net", "interface": "net1", "ips": ["10.0.0.7"]}]  # fmt: skip
    return {
        "metadata": {"name": "web-0", "namespace": "web", "annotations": {
            "k8s.v1.cni.cncf.io/network-status": json.dumps(status)}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }  # fmt: skip


def test_held_addresses_of_any_unfinished_pod() -> None:
    assert held_addresses_from_object(pod_object("Running")) == HeldAddresses(
        namespace="web", name="web-0", node="gpu-001", ips=("10.0.0.7",)
    )
    assert held_addresses_from_object(pod_object("Succeeded")) is None
    assert held_addresses_from_object(pod_object("Running", node=None)) is None
    assert (
        held_addresses_from_object({"metadata": {"name": "x"}, "spec": {"nodeName": "n"}}) is None
    )


def test_whereabouts_pool_offsets_become_addresses() -> None:
    pool = ip_pool_from_object("whereabouts", {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "192.168.2.224-28", "namespace": "kube-system"},
        "spec": {"range": "192.168.2.224/28", "allocations": {
            "1": {"id": "4f2a", "podref": "ml/train-0", "ifname": "net1"},
            "2": {"id": "9c1b", "podref": "ml/train-1", "ifname": "net1"},
            "x": {"id": "bad"},
        }},
    })  # fmt: skip
    assert pool is not None
    assert pool.allocated == {"192.168.2.225": "ml/train-0", "192.168.2.226": "ml/train-1"}


def test_pool_without_a_name_is_skipped() -> None:
    assert ip_pool_from_object("whereabouts", {"metadata": {}}) is None
