"""Pods' secondary networks, judged: which NetworkAttachmentDefinitions a resource's pods on
a node use, whether each attaches a netdev of the adapters the resource selects, and how
many addresses their IP pools have left for the node.

Pure: a function of the cluster view and the node's adapters; the trace links
(`aggregator.trace.attachment`, `.ippool`) and the rules (`aggregator.rules.podnetworks`)
both read it; the address arithmetic is `aggregator.ipam`. What the API cannot show
(host-local's files on the node, NV-IPAM's per-node store) is reported as not observable or
as a lower bound ("at least N used", from the pods' network-status), never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Literal

import msgspec
from msgspec.structs import replace

from aggregator import ipam
from aggregator.cluster import (
    ClusterView,
    HeldAddresses,
    IpamRange,
    IpPool,
    NetworkAttachment,
    PodRequest,
    PoolKind,
)
from aggregator.placement import affinity_matches
from proto.inventory import Device

# The CNI plugins that give a pod an RDMA adapter's netdev (or a VF of it).
RDMA_CNI_TYPES: Final = frozenset({"macvlan", "ipoib", "host-device", "sriov"})
NOT_OBSERVABLE_IPAM: Final = {
    "host-local": "host-local keeps its allocations in files on each node "
    "(/var/lib/cni/networks): not observable from the API",
    "dhcp": "dhcp leases live in the DHCP server: not observable from the API",
}
PoolState = Literal[
    "ok", "exhausted", "missing", "no-block", "not-selected", "invalid", "not-observable",
    "no-pool",
]  # fmt: skip
# The states in which the node's next pod gets no address, whatever the count says.
NO_ADDRESS_STATES: Final = frozenset({"no-block", "not-selected", "invalid"})
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})  # sandbox gone, addresses freed


class NadUse(msgspec.Struct, frozen=True, kw_only=True):
    """One NAD a resource's pods request (or that names the resource), found or not."""

    key: str  # "ns/name"
    attachment: NetworkAttachment | None  # None: no such NAD
    requested_by: tuple[str, ...] = ()  # pods "ns/name" asking for it
    elsewhere: tuple[str, ...] = ()  # missing: NADs of that name in other namespaces


class PoolUse(msgspec.Struct, frozen=True, kw_only=True):
    """What one NAD's IPAM has left for one node."""

    nad: str  # "ns/name"
    ipam: str | None  # ipam.type
    state: PoolState
    pool: str | None = None  # "ns/name" of the pool object, or the pool name asked for
    kind: PoolKind | None = None
    block: str | None = None  # the node's block ("first-last" or a prefix); None: pool-wide
    capacity: int | None = None
    used: int | None = None
    free: int | None = None
    # "pool": used is the pool object's own allocations (whereabouts); "network-status":
    # a lower bound, the block's addresses in the network-status of the node's pods
    # (NV-IPAM keeps its reservations on the node, out of the API's sight).
    counted: Literal["pool", "network-status"] | None = None
    detail: str = ""


def requesting(resource: str, node: str | None, pods: Iterable[PodRequest]) -> list[PodRequest]:
    """The pods asking for `resource` (on `node`, when given)."""
    return [p for p in pods if p.requests.get(resource, 0) > 0 and (node is None or p.node == node)]


def nad_uses(resource: str, pods: Iterable[PodRequest], cluster: ClusterView) -> list[NadUse]:
    """The NADs `pods` request, then those annotated with `resource` nobody requests."""
    by_key = {f"{a.namespace}/{a.name}": a for a in cluster.attachments}
    asked: dict[str, list[str]] = {}
    for pod in pods:
        for key in pod.networks:
            asked.setdefault(key, []).append(f"{pod.namespace}/{pod.name}")
    uses = []
    for key, by in asked.items():
        name = key.split("/", 1)[-1]
        elsewhere = tuple(k for k, a in by_key.items() if a.name == name and k != key)
        uses.append(NadUse(key=key, attachment=by_key.get(key), requested_by=tuple(by),
                           elsewhere=elsewhere if key not in by_key else ()))  # fmt: skip
    uses.extend(
        NadUse(key=key, attachment=a)
        for key, a in by_key.items()
        if a.resource_name == resource and key not in asked
    )
    return uses


def pods_on(node: str, pods: Iterable[PodRequest]) -> list[PodRequest]:
    return [p for p in pods if p.node == node]


def pods_by_node(pods: Iterable[PodRequest]) -> dict[str, list[PodRequest]]:
    """node -> its pods, so per-node rules read each pod once, not once per node."""
    found: dict[str, list[PodRequest]] = {}
    for pod in pods:
        if pod.node is not None:
            found.setdefault(pod.node, []).append(pod)
    return found


def selected_netdevs(devices: Iterable[Device]) -> set[str]:
    return {n for d in devices for n in d.netdevs}


def master_selected(nad: NetworkAttachment, devices: tuple[Device, ...]) -> bool | None:
    """Whether the NAD attaches a netdev (or a PCI function) of `devices`; None when its
    config names none (sriov: the device comes from the device plugin's allocation)."""
    if nad.pci_address is not None:
        return nad.pci_address in _pci_addresses(devices)
    if nad.master is None:
        return None
    netdevs = selected_netdevs(devices)
    # A VLAN on the adapter's netdev ("ens1f0.100") is still that adapter.
    return nad.master in netdevs or nad.master.rsplit(".", 1)[0] in netdevs


def device_matches(
    pci_address: str | None, rdma_device: str | None, devices: tuple[Device, ...]
) -> bool | None:
    """Whether a network-status device-info names one of `devices` (or one of their VFs);
    None when it names nothing."""
    if rdma_device is not None and rdma_device in {d.name for d in devices}:
        return True
    if pci_address is not None:
        return pci_address in _pci_addresses(devices)
    return None if rdma_device is None else False


def _pci_addresses(devices: tuple[Device, ...]) -> set[str]:
    found = {d.pci_address for d in devices if d.pci_address}
    found |= {vf for d in devices if d.sriov is not None for vf in d.sriov.vfs}
    return found


# --- IP pools ------------------------------------------------------------------------------


def pool_uses(
    nad: NetworkAttachment,
    node: str,
    cluster: ClusterView,
    node_pods: Sequence[PodRequest] | None = None,  # the pods on `node`, when indexed
    node_held: Sequence[HeldAddresses] | None = None,  # every pod's addresses on `node`
) -> list[PoolUse]:
    """What the NAD's IPAM has left for pods on `node` (one entry per pool or range)."""
    key = f"{nad.namespace}/{nad.name}"
    kind_ = nad.ipam_type
    if kind_ is None:
        return [PoolUse(nad=key, ipam=None, state="no-pool", detail="no IPAM: no addresses")]
    if kind_ in NOT_OBSERVABLE_IPAM:
        return [PoolUse(nad=key, ipam=kind_, state="not-observable",
                        detail=NOT_OBSERVABLE_IPAM[kind_])]  # fmt: skip
    if kind_ == "static":
        return [PoolUse(nad=key, ipam=kind_, state="no-pool", detail="static addresses")]
    if kind_ == "nv-ipam":
        if not nad.ipam_pools:
            return [PoolUse(nad=key, ipam=kind_, state="missing", detail="ipam.poolName unset")]
        cidr = (nad.ipam_pool_type or "ippool").lower() == "cidrpool"
        kind: PoolKind = "nv-ipam-cidrpool" if cidr else "nv-ipam-ippool"
        pods = node_pods if node_pods is not None else pods_on(node, cluster.pods)
        held = node_held if node_held is not None else held_on(node, cluster.held_addresses)
        addresses = _held(pods, held)
        return [_nv_ipam(key, name, kind, node, cluster, addresses) for name in nad.ipam_pools]
    if kind_ == "whereabouts":
        return _whereabouts(key, nad, node, cluster)
    return [PoolUse(nad=key, ipam=kind_, state="not-observable",
                    detail=f"nicfleet does not read {kind_}'s allocations")]  # fmt: skip


def held_on(node: str, held: Iterable[HeldAddresses]) -> list[HeldAddresses]:
    return [h for h in held if h.node == node]


def held_by_node(held: Iterable[HeldAddresses]) -> dict[str, list[HeldAddresses]]:
    found: dict[str, list[HeldAddresses]] = {}
    for entry in held:
        found.setdefault(entry.node, []).append(entry)
    return found


def _held(pods: Sequence[PodRequest], held: Sequence[HeldAddresses]) -> set[tuple[int, int]]:
    """(version, address) of every secondary-network address the node's unfinished pods
    hold: the RDMA pods' network-status and every other pod's."""
    texts = [ip for p in pods if p.phase not in FINISHED_PHASES
             for status in p.network_status for ip in status.ips]  # fmt: skip
    texts += [ip for h in held for ip in h.ips]
    return {a for a in map(ipam.parse_ip, texts) if a is not None}


def _nv_ipam(
    key: str, name: str, kind: PoolKind, node: str, cluster: ClusterView,
    held: set[tuple[int, int]],
) -> PoolUse:  # fmt: skip
    label = "CIDRPool" if kind == "nv-ipam-cidrpool" else "IPPool"
    pool = next((p for p in cluster.ip_pools if p.kind == kind and p.name == name), None)
    if pool is None:
        return PoolUse(nad=key, ipam="nv-ipam", state="missing", pool=name, kind=kind,
                       detail=f"no NV-IPAM {label} named {name!r}")  # fmt: skip
    ref = f"{pool.namespace}/{pool.name}"
    base = PoolUse(nad=key, ipam="nv-ipam", state="ok", pool=ref, kind=kind)
    known = cluster.nodes.get(node)
    if known is not None and not affinity_matches(pool.node_selector, node, known.labels):
        # The controller gives (and keeps) blocks only on the nodes its selector matches;
        # the node agent then has no config for the pool: "configuration ... not found".
        return replace(base, state="not-selected", capacity=0, used=0, free=0,
                       detail=f"{label} {ref}'s nodeSelector does not select {node}: it is "
                       "not this node's pool, its pods get no address from it")  # fmt: skip
    block = pool.blocks.get(node)
    if block is None:
        return replace(base, state="no-block", capacity=0, used=0, free=0,
                       detail=_no_block(pool, label, ref, node))  # fmt: skip
    try:
        if kind == "nv-ipam-cidrpool":
            addresses = ipam.nv_cidrpool_block(
                block.prefix or "", gateway=block.gateway, exclusions=pool.exclusions,
                per_node=pool.per_node_exclusions,
            )  # fmt: skip
        else:
            addresses = ipam.nv_ippool_block(
                block.first or "", block.last or "", gateway=pool.gateway,
                exclusions=pool.exclusions, per_node=pool.per_node_exclusions,
            )  # fmt: skip
    except ipam.IpamError as exc:
        return replace(base, state="invalid", block=block.prefix or block.first,
                       detail=f"{label} {ref} on {node}: {exc}")  # fmt: skip
    used = sum(1 for v, a in held if v == addresses.version and a in addresses)
    free = len(addresses) - used
    return replace(
        base, state="exhausted" if free <= 0 else "ok",
        block=block.prefix or addresses.label(), capacity=len(addresses), used=used,
        free=max(free, 0), counted="network-status",
        detail=f"at least {used} used (the block's addresses in the network-status of the "
        f"pods on {node}; NV-IPAM keeps its reservations on the node)",
    )  # fmt: skip


def _no_block(pool: IpPool, label: str, ref: str, node: str) -> str:
    if pool.kind == "nv-ipam-cidrpool":
        total = (
            ipam.nv_cidrpool_prefix_count(
                pool.network or "", pool.node_prefix, exclusions=pool.exclusions,
                per_node=pool.per_node_exclusions,
            ) if pool.node_prefix is not None else None
        )  # fmt: skip
        # Static allocations reserve their prefixes, for their node or for none.
        taken = len({b.prefix for b in pool.blocks.values()} | set(pool.static_prefixes))
    else:
        total = (
            ipam.nv_ippool_block_count(
                pool.network or "", pool.block_size, gateway=pool.gateway,
                exclusions=pool.exclusions, per_node=pool.per_node_exclusions,
            ) if pool.block_size else None
        )  # fmt: skip
        taken = len(pool.blocks)
    if total is not None and taken >= total:
        return (
            f"{label} {ref} has no block for {node}: all {total} blocks of {pool.network} are taken"
        )
    return (
        f"{label} {ref} has no block for {node}: {taken} of "
        f"{total if total is not None else '?'} blocks taken (the controller has not "
        "allocated one yet, or the node is not in its nodeSelector's view)"
    )


def _whereabouts(
    key: str, nad: NetworkAttachment, node: str, cluster: ClusterView
) -> list[PoolUse]:
    ranges = nad.ipam_ranges or (
        (IpamRange(range=nad.ipam_range),) if nad.ipam_range is not None else ()
    )
    if not ranges:
        return [PoolUse(nad=key, ipam="whereabouts", state="missing", detail="ipam.range unset")]
    if nad.ipam_node_slice_size:
        return [_whereabouts_slice(key, nad, ranges[0], node, cluster)]
    return [_whereabouts_range(key, nad, r, cluster) for r in ranges]


def _whereabouts_range(
    key: str, nad: NetworkAttachment, wanted: IpamRange, cluster: ClusterView
) -> PoolUse:
    base = PoolUse(nad=key, ipam="whereabouts", state="ok", kind="whereabouts")
    try:
        addresses = ipam.whereabouts_range(
            wanted.range, wanted.range_start, wanted.range_end, wanted.exclude
        )
    except ipam.IpamError as exc:
        return replace(base, state="invalid", detail=str(exc))
    name = ipam.whereabouts_pool_name(wanted.range, nad.ipam_network_name, None)
    return _whereabouts_count(base, name, addresses, None, cluster,
                              "pool-wide (whereabouts allocates cluster-wide)")  # fmt: skip


def _whereabouts_slice(
    key: str, nad: NetworkAttachment, wanted: IpamRange, node: str, cluster: ClusterView
) -> PoolUse:
    """Fast IPAM: the node's slice of the NodeSlicePool named after network_name (else the
    config's name), and the node's own IPPool for it."""
    base = PoolUse(nad=key, ipam="whereabouts", state="ok", kind="whereabouts")
    slice_name = nad.ipam_network_name or nad.config_name or ""
    pools = [p for p in cluster.ip_pools if p.kind == "whereabouts-nodeslice"]
    slices = next((p for p in pools if p.name == slice_name), None)
    if slices is None:
        return replace(base, state="missing", pool=slice_name or None,
                       detail=f"no whereabouts NodeSlicePool named {slice_name!r} "
                       "(node_slice_size is set: the node controller creates it)")  # fmt: skip
    ref = f"{slices.namespace}/{slices.name}"
    block = slices.blocks.get(node)
    if block is None or block.prefix is None:
        total = (
            ipam.whereabouts_slice_count(slices.network or "", slices.node_prefix)
            if slices.node_prefix is not None else None
        )  # fmt: skip
        taken = len(slices.blocks)
        why = (
            f"all {total} slices of {slices.network} are taken"
            if total is not None and taken >= total
            else f"{taken} of {total if total is not None else '?'} slices taken"
        )
        return replace(base, state="no-block", pool=ref, capacity=0, used=0, free=0,
                       detail=f"NodeSlicePool {ref} has no slice for {node}: {why}")  # fmt: skip
    try:
        addresses = ipam.whereabouts_slice(wanted.range, block.prefix)
    except ipam.IpamError as exc:
        return replace(base, state="invalid", pool=ref, detail=str(exc))
    name = ipam.whereabouts_pool_name(block.prefix, nad.ipam_network_name, node)
    return _whereabouts_count(base, name, addresses, block.prefix, cluster,
                              f"the slice {block.prefix} of {ref} (exclude does not apply "
                              "to node slices)")  # fmt: skip


def _whereabouts_count(
    base: PoolUse, name: str, addresses: ipam.AddressSet, block: str | None,
    cluster: ClusterView, scope: str,
) -> PoolUse:  # fmt: skip
    pool = next((p for p in cluster.ip_pools if p.kind == "whereabouts" and p.name == name), None)
    # whereabouts creates its IPPool at the first allocation: none yet is an empty pool.
    held = (ipam.parse_ip(ip) for ip in (pool.allocated if pool is not None else {}))
    used = sum(1 for a in held if a is not None and a[0] == addresses.version and a[1] in addresses)
    free = len(addresses) - used
    return replace(
        base, state="exhausted" if free <= 0 else "ok",
        pool=f"{pool.namespace}/{pool.name}" if pool else name, block=block,
        capacity=len(addresses), used=used, free=max(free, 0), counted="pool",
        detail=f"{scope}; range_start/range_end/exclude applied",
    )  # fmt: skip
