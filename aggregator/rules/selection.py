"""Which adapters of a snapshot a device-plugin resource's selectors match — the
aggregator's view for `selector-matches-nothing` when no agent status says it.

Pure. Follows the agent's selector semantics (agent/deviceplugin/selectors.py,
docs/device-plugin-config.md) on the snapshot alone: device-level selectors, and at least
one port passing the port-level ones; char-device health is not judged here (that is the
agent's `excluded`).
"""

from __future__ import annotations

import msgspec

from proto.dpconfig import normalize_link_layer, normalize_link_type, normalize_pci_id
from proto.inventory import Device, NodeSnapshot
from proto.messages.config import ResourceConfig, Selectors

_ARPHRD_LINK_TYPE = {1: "ether", 32: "infiniband"}
_LAYER_LINK_TYPE = {"Ethernet": "ether", "InfiniBand": "infiniband"}


def matching_adapters(resource: ResourceConfig, snap: NodeSnapshot) -> tuple[str, ...]:
    s = resource.selectors or Selectors()
    if resource.devices and not s.if_names:
        s = msgspec.structs.replace(s, if_names=resource.devices)
    return tuple(d.name for d in snap.devices if _matches(d, s))


def _pci_id(value: str | None) -> str | None:
    return normalize_pci_id(value) if value else None


def _matches(device: Device, s: Selectors) -> bool:
    checks: tuple[tuple[set[object], object], ...] = (
        ({normalize_pci_id(v) for v in s.vendors}, _pci_id(device.vendor_id)),
        ({normalize_pci_id(v) for v in s.device_ids}, _pci_id(device.device_id)),
        (set(s.drivers), device.driver),
        ({a.lower() for a in s.pci_addresses}, (device.pci_address or "").lower() or None),
        (set(s.rdma_devices), device.name),
        (set(s.numa_nodes), device.numa_node),
    )
    if any(allowed and have not in allowed for allowed, have in checks):
        return False
    if_names = set(s.if_names)
    link_types = {normalize_link_type(t) for t in s.link_types}
    link_layers = {normalize_link_layer(v) for v in s.link_layers}
    interfaces = {i.name: i for i in device.interfaces}
    anywhere = {n for n in device.netdevs if n not in interfaces or interfaces[n].port is None}
    for port in device.ports or ():
        names = anywhere | {i.name for i in device.interfaces if i.port == port.port}
        types = {
            _ARPHRD_LINK_TYPE[t]
            for n in names
            if n in interfaces and (t := interfaces[n].type) in _ARPHRD_LINK_TYPE
        }
        if not types and port.link_layer in _LAYER_LINK_TYPE:
            types = {_LAYER_LINK_TYPE[port.link_layer]}
        if if_names and not if_names & names:
            continue
        if link_types and not link_types & types:
            continue
        if link_layers and port.link_layer not in link_layers:
            continue
        return True
    return not device.ports and not (if_names or link_types or link_layers)
