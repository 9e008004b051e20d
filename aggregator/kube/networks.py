"""Secondary-network objects -> the cluster model: a NetworkAttachmentDefinition's CNI
config, a pod's Multus `network-status` (and the addresses it holds), NV-IPAM
IPPool/CIDRPool, whereabouts IPPool and NodeSlicePool.

Pure: `aggregator.kube.client` lists the objects. The shapes are the ones the upstream
controllers write (Multus, k8snetworkplumbingwg device-info-spec, Mellanox/nvidia-k8s-ipam
api/v1alpha1, whereabouts.cni.cncf.io/v1alpha1 and its pkg/config). A malformed object
never raises: it is skipped, or carries the reason it could not be read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from aggregator.cluster import (
    HeldAddresses,
    IpamRange,
    IpPool,
    NetworkStatus,
    PoolBlock,
    PoolKind,
)
from aggregator.placement import required_affinity_from

NETWORK_STATUS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/network-status"
OLD_NETWORK_STATUS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks-status"  # Multus < 3.7
# A finished pod's sandbox is torn down (CNI DEL): its network-status outlives its addresses.
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


class CniConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the trace reads of a NAD's `spec.config` (a CNI config or conflist)."""

    cni_type: str | None = None
    master: str | None = None
    pci_address: str | None = None
    ipam_type: str | None = None
    ipam_pools: tuple[str, ...] = ()
    ipam_pool_type: str | None = None
    ipam_range: str | None = None
    ipam_ranges: tuple[IpamRange, ...] = ()  # whereabouts
    ipam_network_name: str | None = None
    ipam_node_slice_size: str | None = None
    config_name: str | None = None  # the config's (conflist's) "name"
    error: str | None = None


def parse_cni_config(raw: object) -> CniConfig:
    """`spec.config` of a NetworkAttachmentDefinition: a JSON string holding one CNI config
    or a conflist (`plugins`); the first plugin with a type/master/ipam supplies each."""
    if raw is None or raw == "":
        return CniConfig(error="spec.config is empty (Multus then reads a file on the node)")
    if not isinstance(raw, str):
        return CniConfig(error="spec.config is not a string")
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as exc:
        return CniConfig(error=f"spec.config is not JSON ({exc.msg} at char {exc.pos})")
    if not isinstance(decoded, Mapping):
        return CniConfig(error="spec.config is not a JSON object")
    plugins = [decoded] if "plugins" not in decoded else _list(decoded.get("plugins"))
    plugins = [p for p in plugins if isinstance(p, Mapping)]
    if not plugins:
        return CniConfig(error="spec.config has no plugins")
    cni_type = _first_text(plugins, "type")
    if cni_type is None:
        return CniConfig(error="spec.config has no CNI type")
    ipam: Mapping[str, Any] = next(
        (p["ipam"] for p in plugins if isinstance(p.get("ipam"), Mapping)), {}
    )
    pools = _text(ipam.get("poolName"))
    # host-device moves a netdev named "device" (or the one at "pciBusID") into the pod: it
    # plays the part macvlan's and ipoib's "master" plays.
    master = _first_text(plugins, "master")
    if cni_type == "host-device" and master is None:
        master = _first_text(plugins, "device")
    return CniConfig(
        cni_type=cni_type,
        master=master,
        pci_address=_first_text(plugins, "pciBusID") if cni_type == "host-device" else None,
        ipam_type=_text(ipam.get("type")),
        ipam_pools=tuple(p.strip() for p in (pools or "").split(",") if p.strip()),
        ipam_pool_type=_text(ipam.get("poolType")),
        ipam_range=_text(ipam.get("range")),
        ipam_ranges=_whereabouts_ranges(ipam),
        ipam_network_name=_text(ipam.get("network_name")),
        ipam_node_slice_size=_text(ipam.get("node_slice_size")),
        # libcni hands each plugin of a conflist the list's name: whereabouts (and its
        # NodeSlicePool lookup) sees that one.
        config_name=_text(decoded.get("name")),
    )


def _whereabouts_ranges(ipam: Mapping[str, Any]) -> tuple[IpamRange, ...]:
    """whereabouts' pkg/config: the top-level range (with its range_start, range_end and
    exclude) first, then every ipRanges entry; "first-last/prefix" sets both ends."""
    raw = [ipam] if _text(ipam.get("range")) else []
    raw += [r for r in _list(ipam.get("ipRanges")) if isinstance(r, Mapping)]
    found = []
    for entry in raw:
        text = _text(entry.get("range"))
        if text is None:
            continue
        start, end = _text(entry.get("range_start")), _text(entry.get("range_end"))
        if "-" in text:
            first, _, cidr = text.partition("-")
            start, end, text = first, cidr.split("/", 1)[0], cidr
        # One that does not parse is kept as written: refused where the range is counted.
        with contextlib.suppress(ValueError):
            text = str(ipaddress.ip_network(text, strict=False))
        exclude = tuple(e for e in _list(entry.get("exclude")) if isinstance(e, str))
        found.append(IpamRange(range=text, range_start=start, range_end=end, exclude=exclude))
    return tuple(found)


def held_addresses_from_object(obj: Mapping[str, Any]) -> HeldAddresses | None:
    """The secondary-network addresses of a pod bound to a node and not finished; None for
    any other pod (NV-IPAM's per-node reservations are counted from these)."""
    metadata = _mapping(obj.get("metadata"))
    node = _text(_mapping(obj.get("spec")).get("nodeName"))
    name = _text(metadata.get("name"))
    if node is None or name is None:
        return None
    if _mapping(obj.get("status")).get("phase") in FINISHED_PHASES:
        return None
    annotations = _mapping(metadata.get("annotations"))
    raw = annotations.get(NETWORK_STATUS_ANNOTATION) or annotations.get(
        OLD_NETWORK_STATUS_ANNOTATION
    )
    statuses = parse_network_status(raw if isinstance(raw, str) else None)
    ips = tuple(ip for status in statuses for ip in status.ips)
    if not ips:
        return None
    namespace = _text(metadata.get("namespace")) or "default"
    return HeldAddresses(namespace=namespace, name=name, node=node, ips=ips)


def parse_network_status(annotation: str | None) -> tuple[NetworkStatus, ...]:
    """Multus' `network-status`: a JSON list of {name, interface, ips, mac, default,
    device-info}. The default (cluster) network is left out: no NAD stands behind it."""
    if not annotation:
        return ()
    try:
        items = json.loads(annotation)
    except json.JSONDecodeError:
        return ()
    found = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping) or item.get("default") is True:
            continue
        name = _text(item.get("name"))
        if name is None:
            continue
        pci = _mapping(_mapping(item.get("device-info")).get("pci"))
        found.append(
            NetworkStatus(
                name=name,
                interface=_text(item.get("interface")),
                ips=tuple(ip for ip in _list(item.get("ips")) if isinstance(ip, str)),
                mac=_text(item.get("mac")),
                pci_address=_text(pci.get("pci-address")),
                rdma_device=_text(pci.get("rdma-device")),
            )
        )
    return tuple(found)


def ip_pool_from_object(kind: PoolKind, obj: Mapping[str, Any]) -> IpPool | None:
    """An NV-IPAM IPPool / CIDRPool, a whereabouts IPPool or NodeSlicePool; None without a
    name."""
    metadata = _mapping(obj.get("metadata"))
    name = _text(metadata.get("name"))
    if name is None:
        return None
    namespace = _text(metadata.get("namespace")) or "default"
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    exclusions = tuple(
        (start, end)
        for e in _list(spec.get("exclusions"))
        if (start := _text(_mapping(e).get("startIP"))) and (end := _text(_mapping(e).get("endIP")))
    )
    per_node = tuple(
        (first, last)
        for e in map(_mapping, _list(spec.get("perNodeExclusions")))
        if (first := _int(e.get("startIndex"))) is not None
        and (last := _int(e.get("endIndex"))) is not None
    )
    # spec.nodeSelector is a core/v1 NodeSelector; absent (null) selects every node.
    raw_selector = spec.get("nodeSelector")
    selector = (
        required_affinity_from({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": raw_selector}})
        if isinstance(raw_selector, Mapping) else None
    )  # fmt: skip
    if kind == "nv-ipam-ippool":
        blocks = _by_node(
            PoolBlock(node=node, first=_text(a.get("startIP")), last=_text(a.get("endIP")))
            for a in map(_mapping, _list(status.get("allocations")))
            if (node := _text(a.get("nodeName")))
        )
        return IpPool(
            kind=kind, namespace=namespace, name=name, network=_text(spec.get("subnet")),
            block_size=_int(spec.get("perNodeBlockSize")), gateway=_text(spec.get("gateway")),
            exclusions=exclusions, blocks=blocks, node_selector=selector,
            per_node_exclusions=per_node,
        )  # fmt: skip
    if kind == "nv-ipam-cidrpool":
        blocks = _by_node(
            PoolBlock(node=node, prefix=_text(a.get("prefix")), gateway=_text(a.get("gateway")))
            for a in map(_mapping, _list(status.get("allocations")))
            if (node := _text(a.get("nodeName")))
        )
        return IpPool(
            kind=kind, namespace=namespace, name=name, network=_text(spec.get("cidr")),
            node_prefix=_int(spec.get("perNodeNetworkPrefix")),
            gateway_index=_int(spec.get("gatewayIndex")), exclusions=exclusions, blocks=blocks,
            node_selector=selector, per_node_exclusions=per_node,
            static_prefixes=tuple(
                p for a in map(_mapping, _list(spec.get("staticAllocations")))
                if (p := _text(a.get("prefix")))
            ),
        )  # fmt: skip
    if kind == "whereabouts-nodeslice":
        # status.allocations lists every slice; an empty nodeName is a slice still free.
        blocks = _by_node(
            PoolBlock(node=node, prefix=_text(a.get("sliceRange")))
            for a in map(_mapping, _list(status.get("allocations")))
            if (node := _text(a.get("nodeName")))
        )
        size = (_text(spec.get("sliceSize")) or "").removeprefix("/")
        return IpPool(
            kind=kind, namespace=namespace, name=name, network=_text(spec.get("range")),
            node_prefix=int(size) if size.isdigit() else None, blocks=blocks,
        )  # fmt: skip
    network = _text(spec.get("range"))
    return IpPool(
        kind=kind, namespace=namespace, name=name, network=network,
        allocated=_whereabouts_allocations(network, _mapping(spec.get("allocations"))),
    )  # fmt: skip


def _by_node(blocks: Iterable[PoolBlock]) -> dict[str, PoolBlock]:
    """status.allocations by node (a node has one block per pool; the first one wins)."""
    found: dict[str, PoolBlock] = {}
    for block in blocks:
        found.setdefault(block.node, block)
    return found


def _whereabouts_allocations(network: str | None, raw: Mapping[str, Any]) -> dict[str, str]:
    """whereabouts keys allocations by the offset (decimal string) from the range's network
    address; the address itself is not stored."""
    try:
        base = ipaddress.ip_network(network or "", strict=False).network_address
    except ValueError:
        return {}
    found: dict[str, str] = {}
    for offset, allocation in raw.items():
        if not str(offset).isdigit():
            continue
        podref = _text(_mapping(allocation).get("podref")) or "?"
        found[str(base + int(offset))] = podref
    return found


def _first_text(plugins: list[Mapping[str, Any]], key: str) -> str | None:
    return next((v for p in plugins if (v := _text(p.get(key))) is not None), None)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
