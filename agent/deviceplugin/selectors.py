"""Which RDMA adapters of a node serve a device-plugin resource, and why the others don't.

Owns selector semantics (values within a selector OR-ed, selectors AND-ed, each resource
on its own) and the char devices a selected adapter hands to containers. Pure: takes a
snapshot (and, optionally, the /dev nodes the caller saw); health is the server's call.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Set
from typing import Final

import msgspec

from proto.dpconfig import (
    normalize_link_layer,
    normalize_link_type,
    normalize_pci_id,
    resource_full_name,
)
from proto.inventory import Device, NodeSnapshot, Port
from proto.messages.config import ResourceConfig, Selectors

RDMA_CM: Final = "rdma_cm"
_OWN_CHAR_DEVICE: Final = re.compile(r"(uverbs|umad|issm)[0-9]+")
# ib_uverbs and ib_umad nodes are what the upstream plugin insists on (issm is optional);
# without them verbs or MAD users in the container fail at open().
_REQUIRED: Final = (("uverbs", "ib_uverbs"), ("umad", "ib_umad"))
# ARPHRD_* in /sys/class/net/<if>/type -> netlink's encapsulation name, which is what the
# upstream plugin compares linkTypes with.
_ARPHRD_LINK_TYPE: Final = {1: "ether", 32: "infiniband"}
_LAYER_LINK_TYPE: Final = {"Ethernet": "ether", "InfiniBand": "infiniband"}


class SelectedDevice(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # RDMA device, mlx5_0
    pci_address: str | None
    numa_node: int | None
    netdevs: tuple[str, ...]
    ports: tuple[int, ...]  # the ports this resource uses (the ones its selectors matched)
    # Host paths: the adapter's uverbs*, umad*, issm*, then the node-wide rdma_cm when the
    # node has it (the same path on every adapter; hand it to a container once).
    char_devices: tuple[str, ...]


class Excluded(msgspec.Struct, frozen=True, kw_only=True):
    device: str  # RDMA device name
    reason: str


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    resource: str  # rdma/hca_shared_devices_a
    selected: tuple[SelectedDevice, ...] = ()
    excluded: tuple[Excluded, ...] = ()  # matched the selectors, cannot be handed out
    unmatched: tuple[Excluded, ...] = ()  # did not match; reason names the selector
    rdma_cm: str | None = None  # /dev/infiniband/rdma_cm when the node has it (rdma_ucm)

    @property
    def char_devices(self) -> tuple[str, ...]:
        """Every node a container of this resource gets: rdma_cm once, then the adapters'."""
        own = [p for d in self.selected for p in d.char_devices if p != self.rdma_cm]
        return (self.rdma_cm, *own) if self.rdma_cm and self.selected else tuple(own)

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({d.numa_node for d in self.selected if d.numa_node is not None}))


class _PortView(msgspec.Struct, frozen=True):
    """One port as the port-level selectors see it."""

    number: int | None
    link_layers: frozenset[str]
    netdevs: frozenset[str]
    link_types: frozenset[str]


def select_devices(
    snapshot: NodeSnapshot, resource: ResourceConfig, *, dev_nodes: Set[str] | None = None
) -> Selection:
    """Filter the snapshot's adapters for one resource.

    `dev_nodes`, when given, is the set of /dev paths the caller found on the host: a char
    device sysfs lists but /dev lacks excludes its adapter (the kubelet would fail the pod).
    """
    selectors, if_names_key = _effective_selectors(resource)
    rdma_cm = _rdma_cm(snapshot, dev_nodes)
    selected: list[SelectedDevice] = []
    excluded: list[Excluded] = []
    unmatched: list[Excluded] = []
    for device in snapshot.devices:
        ports, reason = _match(device, selectors, if_names_key)
        if reason is not None:
            unmatched.append(Excluded(device=device.name, reason=reason))
            continue
        own = tuple(p for p in device.char_devices if _OWN_CHAR_DEVICE.fullmatch(_base(p)))
        problem = _char_device_problem(own, dev_nodes)
        if problem is not None:
            excluded.append(Excluded(device=device.name, reason=problem))
            continue
        selected.append(
            SelectedDevice(
                name=device.name,
                pci_address=device.pci_address,
                numa_node=device.numa_node,
                netdevs=device.netdevs,
                ports=ports,
                char_devices=(*own, rdma_cm) if rdma_cm else own,
            )
        )
    return Selection(
        resource=resource_full_name(resource),
        selected=tuple(selected),
        excluded=tuple(excluded),
        unmatched=tuple(unmatched),
        rdma_cm=rdma_cm,
    )


def selected_ports(selection: Selection, snapshot: NodeSnapshot) -> tuple[tuple[Device, Port], ...]:
    """The (adapter, port) pairs a resource uses, looked up in `snapshot` (a newer one than
    the selection's is fine: adapters or ports that vanished are simply missing)."""
    by_name = {device.name: device for device in snapshot.devices}
    return tuple(
        (device, port)
        for chosen in selection.selected
        if (device := by_name.get(chosen.name)) is not None
        for port in device.ports
        if port.port in chosen.ports
    )


# --- matching ---------------------------------------------------------------------------


def _effective_selectors(resource: ResourceConfig) -> tuple[Selectors, str]:
    """The selectors to apply, and what to call the interface-name one in reasons."""
    selectors = resource.selectors or Selectors()
    if resource.devices and not any(
        getattr(selectors, f.name) for f in msgspec.structs.fields(Selectors)
    ):
        # Upstream: the deprecated `devices` list is the ifNames selector under another name.
        return msgspec.structs.replace(selectors, if_names=resource.devices), "devices"
    return selectors, "ifNames"


def _match(device: Device, s: Selectors, if_names_key: str) -> tuple[tuple[int, ...], str | None]:
    """The port numbers the resource uses on `device`, or the reason it does not match."""
    pci = device.pci_address.lower() if device.pci_address else None
    device_level: tuple[tuple[str, Iterable[object], object, str], ...] = (
        ("vendors", map(normalize_pci_id, s.vendors), _pci_id(device.vendor_id), "vendor"),
        ("deviceIDs", map(normalize_pci_id, s.device_ids), _pci_id(device.device_id), "device ID"),
        ("drivers", s.drivers, device.driver, "driver"),
        ("pciAddresses", (a.lower() for a in s.pci_addresses), pci, "PCI address"),
        ("rdmaDevices", s.rdma_devices, device.name, "RDMA device"),
        ("numaNodes", s.numa_nodes, device.numa_node, "NUMA node"),
    )
    for key, wanted, have, what in device_level:
        allowed = set(wanted)
        if allowed and have not in allowed:
            shown = "unknown" if have is None else have
            return (), f"{key}: {what} {shown} not in {_listing(allowed)}"
    # Port-level selectors: at least one port must pass all of them, and the resource uses
    # the ports that do (so a dual-port adapter can serve ib0 and ib1 to two resources).
    port_level: tuple[tuple[str, set[str], Callable[[_PortView], Iterable[str]], str], ...] = (
        (if_names_key, set(s.if_names), lambda p: p.netdevs, "netdevs"),
        ("linkTypes", set(map(normalize_link_type, s.link_types)), lambda p: p.link_types,
         "link types"),
        ("linkLayers", set(map(normalize_link_layer, s.link_layers)), lambda p: p.link_layers,
         "link layers"),
    )  # fmt: skip
    views = _port_views(device)
    passing = views
    for key, accepted, values, what in port_level:
        if not accepted:
            continue
        if not any(accepted & set(values(view)) for view in views):
            found = {value for view in views for value in values(view)}
            shown = _listing(found) if found else "none"
            return (), f"{key}: {what} {shown} not in {_listing(accepted)}"
        passing = [view for view in passing if accepted & set(values(view))]
    if not passing:
        return (), "no single port matches ifNames/devices, linkTypes and linkLayers together"
    return tuple(view.number for view in passing if view.number is not None), None


def _port_views(device: Device) -> list[_PortView]:
    interfaces = {i.name: i for i in device.interfaces}
    # A netdev whose port is unknown (no interface record, or no dev_port) is on every port.
    anywhere = {n for n in device.netdevs if n not in interfaces or interfaces[n].port is None}
    anywhere |= {i.name for i in device.interfaces if i.port is None}

    def view(number: int | None, link_layer: str | None) -> _PortView:
        names = anywhere | {i.name for i in device.interfaces if i.port == number}
        types = {
            _ARPHRD_LINK_TYPE[t]
            for name in names
            if name in interfaces and (t := interfaces[name].type) in _ARPHRD_LINK_TYPE
        }
        # Upstream takes the link type from the netdev; a port without one (IB without
        # IPoIB) falls back to its link layer here instead of never matching.
        if not types and link_layer in _LAYER_LINK_TYPE:
            types = {_LAYER_LINK_TYPE[link_layer]}
        layers = frozenset({link_layer} if link_layer else set())
        return _PortView(number, layers, frozenset(names), frozenset(types))

    if not device.ports:
        return [view(None, None)]
    return [view(p.port, p.link_layer if p.link_layer != "Unknown" else None) for p in device.ports]


def _char_device_problem(own: tuple[str, ...], dev_nodes: Set[str] | None) -> str | None:
    kinds = {m.group(1) for p in own if (m := _OWN_CHAR_DEVICE.fullmatch(_base(p)))}
    for kind, module in _REQUIRED:
        if kind not in kinds:
            return f"no {kind} char device (is {module} loaded?)"
    if dev_nodes is not None:
        missing = [p for p in own if p not in dev_nodes]
        if missing:
            return f"missing {missing[0]}"
    return None


def _rdma_cm(snapshot: NodeSnapshot, dev_nodes: Set[str] | None) -> str | None:
    for device in snapshot.devices:
        for path in device.char_devices:
            if _base(path) == RDMA_CM and (dev_nodes is None or path in dev_nodes):
                return path
    return None


def _pci_id(value: str | None) -> str | None:
    return normalize_pci_id(value) if value else None


def _base(path: str) -> str:
    return posixpath.basename(path)


def _listing(values: Iterable[object]) -> str:
    return "[" + ", ".join(sorted(map(str, values))) + "]"
