"""What the aggregator knows of the Kubernetes cluster, as plain data, and which nodes
each policy selects.

Pure: `aggregator.kube.client` fills a `ClusterView` from the API server; planners, rules and
the trace read it. Without a cluster (`present=False`) every node the fleet knows is
selected by every policy — there are no labels to select by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from aggregator.placement import SelectorTerm, Taint, Toleration
from proto.policy import LabelSelector, Policy


class NodeCondition(msgspec.Struct, frozen=True, kw_only=True):
    """One of a Node's status.conditions, without its heartbeat times (they change every
    few seconds and would make every node look changed)."""

    type: str  # Ready, NetworkUnavailable, MemoryPressure, KernelDeadlock (node-problem-detector)
    status: str  # "True", "False", "Unknown"
    reason: str | None = None
    message: str | None = None


class ClusterNode(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    uid: str | None = None  # metadata.uid: the owner of the node's ResourceSlices
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # status.allocatable / status.capacity as the API server reports them ("8", "1Gi").
    allocatable: dict[str, str] = msgspec.field(default_factory=dict)
    capacity: dict[str, str] = msgspec.field(default_factory=dict)
    conditions: tuple[NodeCondition, ...] = ()
    taints: tuple[Taint, ...] = ()  # spec.taints (DaemonSet placement, aggregator.placement)


class NetworkStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a pod's `network-status`: what the CNI actually attached."""

    name: str  # "ns/name" of the NetworkAttachmentDefinition
    interface: str | None = None
    ips: tuple[str, ...] = ()
    mac: str | None = None
    pci_address: str | None = None  # device-info.pci["pci-address"]
    rdma_device: str | None = None  # device-info.pci["rdma-device"]


class PodClaim(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a pod's spec.resourceClaims and the ResourceClaim it resolved to."""

    name: str  # the entry's name (what containers' resources.claims[].name refer to)
    # The ResourceClaim in the pod's namespace: spec.resourceClaims[].resourceClaimName, or
    # for a template the generated name from status.resourceClaimStatuses; None: not yet
    # generated (the resourceclaim controller has not made it).
    claim: str | None = None
    template: str | None = None  # resourceClaimTemplateName


class ClaimHealth(msgspec.Struct, frozen=True, kw_only=True):
    """One device of a container's status.allocatedResourcesStatus that names a claim
    (`claim:<entry>` or `claim:<entry>/<request>`), as the kubelet reports DRA health."""

    container: str
    entry: str  # the pod's resourceClaims entry name
    request: str | None = None
    resource_id: str  # "<driver>/<pool>/<device>" (the kubelet's ResourceID)
    health: str  # Healthy | Unhealthy | Unknown


class PodRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A pod that requests an extended resource, and the networks it attaches."""

    namespace: str
    name: str
    node: str | None = None  # spec.nodeName; None while pending
    phase: str | None = None
    requests: dict[str, int] = msgspec.field(default_factory=dict)  # resource -> count
    networks: tuple[str, ...] = ()  # "ns/name" from k8s.v1.cni.cncf.io/networks
    # The scheduler's PodScheduled=False condition message (kept when its Events expired).
    unschedulable: str | None = None
    networks_error: str | None = None  # the networks annotation did not parse
    # k8s.v1.cni.cncf.io/network-status as Multus wrote it (secondary networks only).
    network_status: tuple[NetworkStatus, ...] = ()
    # DRA: spec.resourceClaims (a pod with only these is listed too) and the kubelet's
    # per-device health of them (containerStatuses[].allocatedResourcesStatus).
    claims: tuple[PodClaim, ...] = ()
    claim_health: tuple[ClaimHealth, ...] = ()


class NetworkAttachment(msgspec.Struct, frozen=True, kw_only=True):
    """A NetworkAttachmentDefinition and what it binds to (its CNI config, parsed)."""

    namespace: str
    name: str
    resource_name: str | None = None  # annotation k8s.v1.cni.cncf.io/resourceName
    master: str | None = None  # "master" of the CNI config (host-device: its "device")
    pci_address: str | None = None  # host-device "pciBusID"
    cni_type: str | None = None  # "type" of the config (of the conflist's first plugin)
    ipam_type: str | None = None  # ipam.type: nv-ipam, whereabouts, host-local, ...
    ipam_pools: tuple[str, ...] = ()  # nv-ipam ipam.poolName ("a,b": IPv4 and IPv6)
    ipam_pool_type: str | None = None  # nv-ipam ipam.poolType: ippool (default), cidrpool
    ipam_range: str | None = None  # whereabouts ipam.range
    config_error: str | None = None  # spec.config missing or not a CNI config
    # whereabouts: ipam.range (with range_start/range_end/exclude) then ipam.ipRanges;
    # network_name and node_slice_size (Fast IPAM); the config's name names the NodeSlicePool.
    ipam_ranges: tuple[IpamRange, ...] = ()
    ipam_network_name: str | None = None
    ipam_node_slice_size: str | None = None
    config_name: str | None = None


class IpamRange(msgspec.Struct, frozen=True, kw_only=True):
    """One whereabouts range: a CIDR, its optional first/last address, excluded CIDRs/IPs."""

    range: str
    range_start: str | None = None
    range_end: str | None = None
    exclude: tuple[str, ...] = ()


class HeldAddresses(msgspec.Struct, frozen=True, kw_only=True):
    """The secondary-network addresses Multus' network-status records for one pod on a node
    that is not finished (any pod, not only those requesting RDMA resources)."""

    namespace: str
    name: str
    node: str
    ips: tuple[str, ...]


PoolKind = Literal["nv-ipam-ippool", "nv-ipam-cidrpool", "whereabouts", "whereabouts-nodeslice"]


class PoolBlock(msgspec.Struct, frozen=True, kw_only=True):
    """The addresses an NV-IPAM pool gave one node: IPPool first..last, CIDRPool a prefix."""

    node: str
    first: str | None = None
    last: str | None = None
    prefix: str | None = None
    gateway: str | None = None


class IpPool(msgspec.Struct, frozen=True, kw_only=True):
    """An NV-IPAM IPPool/CIDRPool or a whereabouts IPPool, as its controller wrote it."""

    kind: PoolKind
    namespace: str
    name: str
    network: str | None = None  # IPPool spec.subnet, CIDRPool spec.cidr, whereabouts range
    block_size: int | None = None  # IPPool perNodeBlockSize
    node_prefix: int | None = None  # CIDRPool perNodeNetworkPrefix
    gateway: str | None = None  # IPPool spec.gateway
    gateway_index: int | None = None  # CIDRPool spec.gatewayIndex
    exclusions: tuple[tuple[str, str], ...] = ()  # (startIP, endIP)
    blocks: dict[str, PoolBlock] = msgspec.field(default_factory=dict)  # node -> its block
    allocated: dict[str, str] = msgspec.field(default_factory=dict)  # whereabouts ip -> podref
    # NV-IPAM spec.nodeSelector's terms (None: every node); perNodeExclusions as
    # (startIndex, endIndex); CIDRPool spec.staticAllocations' prefixes. A NodeSlicePool
    # (whereabouts-nodeslice) keeps spec.range in network, sliceSize in node_prefix.
    node_selector: tuple[SelectorTerm, ...] | None = None
    per_node_exclusions: tuple[tuple[int, int], ...] = ()
    static_prefixes: tuple[str, ...] = ()


class SchedulingEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A `FailedScheduling` Event the scheduler wrote about a pod (core/v1 or events.k8s.io)."""

    namespace: str
    pod: str
    message: str
    count: int = 1  # count, or series.count of an events.k8s.io/v1 Event
    last_seen: str | None = None  # lastTimestamp / series.lastObservedTime / eventTime


ComponentRole = Literal[
    "driver", "multus", "nv-ipam", "whereabouts", "cni-plugins", "rdma-shared-dp"
]


class DaemonSetState(msgspec.Struct, frozen=True, kw_only=True):
    """A DaemonSet the chain needs (or, for `rdma-shared-dp`, must not have twice), with its
    controller's counts and the nodes its pods run on, ready or not."""

    namespace: str
    name: str
    role: ComponentRole
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)  # spec.template's
    # The template's required node affinity (None: unset), tolerations, hostNetwork and
    # nodeName: with node_selector, where the controller runs a pod (aggregator.placement).
    affinity: tuple[SelectorTerm, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    host_network: bool = False
    template_node: str | None = None
    desired: int = 0  # status.desiredNumberScheduled
    ready: int = 0  # status.numberReady
    available: int = 0  # status.numberAvailable
    updated: int = 0  # status.updatedNumberScheduled
    ready_nodes: tuple[str, ...] = ()
    unready_nodes: tuple[str, ...] = ()  # a pod of the DaemonSet there, not Ready


class AppliedState(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # e.g. state-multus-cni, state-OFED
    state: str  # ready, notReady, ignore, error
    message: str | None = None


class OperatorStatus(msgspec.Struct, frozen=True, kw_only=True):
    """`status` of NVIDIA's NicClusterPolicy (written by the Network Operator)."""

    state: str | None = None  # ready, notReady, ignore, error
    reason: str | None = None
    applied: tuple[AppliedState, ...] = ()


class DraResult(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a ResourceClaim's status.allocation.devices.results (any driver)."""

    request: str  # "nic", or "nic/ib" for a firstAvailable subrequest
    driver: str
    pool: str
    device: str
    share_id: str | None = None


class DraClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A ResourceClaim (resource.k8s.io/v1) whose spec or allocation names a device of any
    driver; the trace and the DRA rules read it."""

    namespace: str
    name: str
    uid: str
    # The object's spec as the API server returned it (aggregator.dra.objects.parse_claim
    # reads {"metadata": {"name"}, "spec": spec}); kept to explain a pending claim.
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    allocated: bool = False  # status.allocation is set
    results: tuple[DraResult, ...] = ()  # every driver's
    node: str | None = None  # the node the allocation's nodeSelector pins (metadata.name In)
    reserved_for: tuple[str, ...] = ()  # status.reservedFor pods, "ns/name"
    deleting: bool = False  # metadata.deletionTimestamp set


class DraDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One device of a ResourceSlice of any driver (aggregator.dra.objects.Device as data)."""

    driver: str
    pool: str
    node: str  # spec.nodeName ("" for a slice that is not node-local)
    name: str
    slice: str  # the ResourceSlice's name
    attributes: dict[str, bool | int | str] = msgspec.field(default_factory=dict)  # qualified
    capacity: dict[str, str] = msgspec.field(default_factory=dict)  # qualified -> quantity


class DraDeviceClass(msgspec.Struct, frozen=True, kw_only=True):
    """A DeviceClass (resource.k8s.io/v1): its name and CEL selectors."""

    name: str
    selectors: tuple[str, ...] = ()


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    present: bool = False  # False: no API server (policy from --policy FILE)
    nodes: dict[str, ClusterNode] = msgspec.field(default_factory=dict)
    pods: tuple[PodRequest, ...] = ()
    attachments: tuple[NetworkAttachment, ...] = ()
    scheduling_events: tuple[SchedulingEvent, ...] = ()  # FailedScheduling, pending pods'
    daemonsets: tuple[DaemonSetState, ...] = ()
    nic_cluster_policy: OperatorStatus | None = None  # None: absent or not readable
    ip_pools: tuple[IpPool, ...] = ()
    held_addresses: tuple[HeldAddresses, ...] = ()  # every unfinished pod's, by network-status
    # DRA (resource.k8s.io/v1), listed with the pods; `dra_present` False: the API server
    # serves no resource.k8s.io/v1 (or the aggregator may not list it): links say unknown.
    dra_present: bool = False
    claims: tuple[DraClaim, ...] = ()
    dra_devices: tuple[DraDevice, ...] = ()  # every driver's, from ResourceSlices
    device_classes: tuple[DraDeviceClass, ...] = ()


NO_CLUSTER = ClusterView()


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: every matchLabels pair and every expression."""
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        value = labels.get(requirement.key)
        if requirement.operator == "In" and value not in requirement.values:
            return False
        if requirement.operator == "NotIn" and present and value in requirement.values:
            return False
        if requirement.operator == "Exists" and not present:
            return False
        if requirement.operator == "DoesNotExist" and present:
            return False
    return True


def selected_nodes(policy: Policy, fleet_nodes: Iterable[str], cluster: ClusterView) -> set[str]:
    """The nodes `policy` covers: by labels in a cluster, every known node without one."""
    names = set(fleet_nodes)
    if not cluster.present:
        return names
    return {
        name
        for name, node in cluster.nodes.items()
        if selector_matches(policy.spec.node_selector, node.labels)
    }


def policies_by_node(
    policies: Iterable[Policy], fleet_nodes: Iterable[str], cluster: ClusterView
) -> dict[str, tuple[Policy, ...]]:
    """node -> every policy selecting it (more than one is a conflict, never merged)."""
    names = list(fleet_nodes)
    result: dict[str, list[Policy]] = {}
    for policy in policies:
        for node in selected_nodes(policy, names, cluster):
            result.setdefault(node, []).append(policy)
    return {node: tuple(found) for node, found in result.items()}
