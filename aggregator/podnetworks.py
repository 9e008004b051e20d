"""Pods' secondary networks, judged: which NetworkAttachmentDefinitions a resource's pods on
a node use, whether each attaches a netdev of the adapters the resource selects, and how
many addresses their IP pools have left for the node.

Pure: a function of the cluster view and the node's adapters; the trace links
(`aggregator.trace.attachment`, `.ippool`) and the rules (`aggregator.rules.podnetworks`)
both read it. What the API cannot show (host-local's files on the node, NV-IPAM's per-node
state) is reported as not observable, never guessed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Final, Literal

import msgspec

from aggregator.cluster import ClusterView, IpPool, NetworkAttachment, PodRequest, PoolKind
from proto.inventory import Device

# The CNI plugins that give a pod an RDMA adapter's netdev (or a VF of it).
RDMA_CNI_TYPES: Final = frozenset({"macvlan", "ipoib", "host-device", "sriov"})
NOT_OBSERVABLE_IPAM: Final = {
    "host-local": "host-local keeps its allocations in files on each node "
    "(/var/lib/cni/networks): not observable from the API",
    "dhcp": "dhcp leases live in the DHCP server: not observable from the API",
}
PoolState = Literal["ok", "exhausted", "missing", "no-block", "not-observable", "no-pool"]


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
) -> list[PoolUse]:
    """What the NAD's IPAM has left for pods on `node` (one entry per pool it names)."""
    key = f"{nad.namespace}/{nad.name}"
    ipam = nad.ipam_type
    if ipam is None:
        return [PoolUse(nad=key, ipam=None, state="no-pool", detail="no IPAM: no addresses")]
    if ipam in NOT_OBSERVABLE_IPAM:
        return [PoolUse(nad=key, ipam=ipam, state="not-observable",
                        detail=NOT_OBSERVABLE_IPAM[ipam])]  # fmt: skip
    if ipam == "static":
        return [PoolUse(nad=key, ipam=ipam, state="no-pool", detail="static addresses")]
    if ipam == "nv-ipam":
        if not nad.ipam_pools:
            return [PoolUse(nad=key, ipam=ipam, state="missing", detail="ipam.poolName unset")]
        cidr = (nad.ipam_pool_type or "ippool").lower() == "cidrpool"
        kind: PoolKind = "nv-ipam-cidrpool" if cidr else "nv-ipam-ippool"
        here = node_pods if node_pods is not None else pods_on(node, cluster.pods)
        return [_nv_ipam(key, name, kind, node, cluster, here) for name in nad.ipam_pools]
    if ipam == "whereabouts":
        return [_whereabouts(key, nad.ipam_range, cluster)]
    return [PoolUse(nad=key, ipam=ipam, state="not-observable",
                    detail=f"nicfleet does not read {ipam}'s allocations")]  # fmt: skip


def _nv_ipam(
    key: str, name: str, kind: PoolKind, node: str, cluster: ClusterView,
    here: Sequence[PodRequest],
) -> PoolUse:  # fmt: skip
    label = "CIDRPool" if kind == "nv-ipam-cidrpool" else "IPPool"
    pool = next((p for p in cluster.ip_pools if p.kind == kind and p.name == name), None)
    if pool is None:
        return PoolUse(nad=key, ipam="nv-ipam", state="missing", pool=name, kind=kind,
                       detail=f"no NV-IPAM {label} named {name!r}")  # fmt: skip
    ref = f"{pool.namespace}/{pool.name}"
    block = pool.blocks.get(node)
    total = _blocks_total(pool)
    if block is None:
        taken = len(pool.blocks)
        full = total is not None and taken >= total
        detail = (
            f"{label} {ref} has no block for {node}: "
            + (f"all {total} blocks of {pool.network} are taken" if full
               else f"{taken} of {total if total is not None else '?'} blocks taken; "
               "its nodeSelector may not select the node")
        )  # fmt: skip
        return PoolUse(nad=key, ipam="nv-ipam", state="no-block", pool=ref, kind=kind,
                       capacity=0, used=0, free=0, detail=detail)  # fmt: skip
    addresses = _block_addresses(pool, block.first, block.last, block.prefix, block.gateway)
    if addresses is None:
        return PoolUse(nad=key, ipam="nv-ipam", state="not-observable", pool=ref, kind=kind,
                       detail=f"{label} {ref}: the block of {node} does not parse")  # fmt: skip
    used = _used(addresses, here)
    free = len(addresses) - used
    label_block = block.prefix or f"{block.first}-{block.last}"
    return PoolUse(
        nad=key, ipam="nv-ipam", state="exhausted" if free <= 0 else "ok", pool=ref, kind=kind,
        block=label_block, capacity=len(addresses), used=used, free=max(free, 0),
        # NV-IPAM records a node's allocations on the node itself; the API shows the block.
        detail="used = addresses of the block held by RDMA pods' network-status on the node",
    )  # fmt: skip


def _whereabouts(key: str, network: str | None, cluster: ClusterView) -> PoolUse:
    if network is None:
        return PoolUse(nad=key, ipam="whereabouts", state="missing", detail="ipam.range unset")
    try:
        wanted = ipaddress.ip_network(network, strict=False)
    except ValueError:
        return PoolUse(nad=key, ipam="whereabouts", state="missing",
                       detail=f"ipam.range {network!r} is not a CIDR")  # fmt: skip
    capacity = _host_count(wanted)
    pool = next(
        (p for p in cluster.ip_pools if p.kind == "whereabouts" and _same_network(p, wanted)),
        None,
    )
    # whereabouts creates its IPPool at the first allocation: none yet is an empty pool.
    used = len(pool.allocated) if pool is not None else 0
    free = capacity - used
    return PoolUse(
        nad=key, ipam="whereabouts", state="exhausted" if free <= 0 else "ok",
        pool=f"{pool.namespace}/{pool.name}" if pool else None, kind="whereabouts",
        capacity=capacity, used=used, free=max(free, 0),
        detail="pool-wide (whereabouts allocates cluster-wide); ipam.exclude not subtracted",
    )  # fmt: skip


def _same_network(pool: IpPool, wanted: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        return ipaddress.ip_network(pool.network or "", strict=False) == wanted
    except ValueError:
        return False


def _host_count(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> int:
    if net.version == 4 and net.prefixlen < 31:
        return max(net.num_addresses - 2, 0)  # network and broadcast
    return net.num_addresses


def _blocks_total(pool: IpPool) -> int | None:
    try:
        net = ipaddress.ip_network(pool.network or "", strict=False)
    except ValueError:
        return None
    if pool.kind == "nv-ipam-ippool" and pool.block_size:
        return net.num_addresses // pool.block_size
    if pool.kind == "nv-ipam-cidrpool" and pool.node_prefix is not None:
        return 1 << max(pool.node_prefix - net.prefixlen, 0)
    return None


class _Block(msgspec.Struct, frozen=True):
    """A node's addresses as an interval minus what a pod never gets."""

    lo: int
    hi: int
    taken_out: tuple[tuple[int, int], ...]  # exclusions and the gateway, merged, in the block

    def __contains__(self, address: int) -> bool:
        return self.lo <= address <= self.hi and not any(
            a <= address <= b for a, b in self.taken_out
        )

    def __len__(self) -> int:
        return self.hi - self.lo + 1 - sum(b - a + 1 for a, b in self.taken_out)


def _block_addresses(
    pool: IpPool, first: str | None, last: str | None, prefix: str | None, gateway: str | None
) -> _Block | None:
    """The addresses of a node's block a pod may get: without the gateway and exclusions
    (and, for an IPv4 CIDRPool prefix, without its network and broadcast address)."""
    try:
        if prefix is not None:
            net = ipaddress.ip_network(prefix, strict=False)
            lo, hi = int(net.network_address), int(net.broadcast_address)
            if net.version == 4 and net.prefixlen < 31:
                lo, hi = lo + 1, hi - 1
        elif first is not None and last is not None:
            lo, hi = int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last))
        else:
            return None
        out = [
            (int(ipaddress.ip_address(a)), int(ipaddress.ip_address(b))) for a, b in pool.exclusions
        ]
        out += [(int(ipaddress.ip_address(g)),) * 2 for g in (gateway, pool.gateway) if g]
    except ValueError:
        return None
    if hi < lo:
        return None
    merged: list[tuple[int, int]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in out if a <= hi and b >= lo):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return _Block(lo, hi, tuple(merged))


def _used(addresses: _Block, pods: Sequence[PodRequest]) -> int:
    held: set[int] = set()
    for pod in pods:
        for status in pod.network_status:
            for ip in status.ips:
                try:
                    address = int(ipaddress.ip_address(ip.split("/", 1)[0]))
                except ValueError:
                    continue
                if address in addresses:
                    held.add(address)
    return len(held)
