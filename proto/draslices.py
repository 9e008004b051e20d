"""ResourceSlices (resource.k8s.io/v1) of one node, built from its snapshot: pure, shared
by the agent (`nicfleet-agent dra slices`, publishing) and the aggregator.

One device per RDMA device (PF, VF, sub-function, RoCE LAG bond), one pool per node named
after it, split over several slices of at most 128 devices. Plain dicts in the exact
1.37 schema; no I/O, no clock (the pool generation is the caller's). docs/dra.md,
"ResourceSlices", lists the attributes and how a Data Direct function is paired.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from proto import dranames
from proto.errors import ProtoError
from proto.inventory import DataDirectFunction, Device, NodeSnapshot, PortStateName

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceSlice"
MAX_DEVICES: Final = 128  # ResourceSliceSpec.devices (64 with taints or counters: none here)
MAX_ATTRIBUTES: Final = 32  # attributes + capacities of one device
MAX_STRING: Final = 64  # DeviceAttribute.string / .version
STANDARD: Final = "resource.kubernetes.io"
# The shared-use capacity (consumable mode): how many allocations may hold the device.
SHARES: Final = "shares"
# PCI device id -> adapter model (vendor 0x15b3); VFs take their PF's model.
MODEL_NAMES: Final[Mapping[str, str]] = {
    "0x1017": "ConnectX-5", "0x1019": "ConnectX-5 Ex", "0x101b": "ConnectX-6",
    "0x101d": "ConnectX-6 Dx", "0x101f": "ConnectX-6 Lx", "0x1021": "ConnectX-7",
    "0x1023": "ConnectX-8", "0xa2d6": "BlueField-2", "0xa2dc": "BlueField-3",
}  # fmt: skip
# semver.org 2.0.0 core version without leading zeros: what `version` accepts.
_SEMVER: Final = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
_PCI_ID: Final = re.compile(r"0x([0-9a-f]{4})")

DeviceKind = Literal["pf", "vf", "sf", "bond"]
# exclusive: one plain device per RDMA device. copies: N devices per RDMA device
# (`<name>-s<i>`), for clusters without consumable capacity. consumable: one device with
# allowMultipleAllocations and a `shares` capacity of N (DRAConsumableCapacity: alpha in
# Kubernetes 1.34, beta and on by default since 1.36).
Sharing = Literal["exclusive", "copies", "consumable"]
PortStates = Mapping[tuple[str, int], tuple[PortStateName, str | None]]
Attribute = dict[str, str | int | bool]


class InvalidSliceSettings(ProtoError, ValueError):
    """Settings that cannot describe a pool (share count below 1, bad generation)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceSettings:
    """How the node's devices are published. `share`: N of `copies`/`consumable`
    (the shared device plugin's rdmaHcaMax); `rails`: RDMA device -> rail, where known."""

    driver: str = dranames.DRIVER
    sharing: Sharing = "exclusive"
    share: int = 1
    rails: Mapping[str, int] = field(default_factory=dict)
    generation: int = 1
    max_devices: int = MAX_DEVICES

    def __post_init__(self) -> None:
        if self.share < 1:
            raise InvalidSliceSettings(f"share must be at least 1, not {self.share}")
        if self.generation < 0:
            raise InvalidSliceSettings(f"generation must not be negative: {self.generation}")
        if not 1 <= self.max_devices <= MAX_DEVICES:
            raise InvalidSliceSettings(f"max_devices must be 1..{MAX_DEVICES}")


def device_kind(device: Device) -> DeviceKind:
    """bond (a LAG name or lower functions), sf (an auxiliary parent), vf (a physfn), pf."""
    if device.lag_functions or "_bond_" in device.name:
        return "bond"
    if device.auxiliary_device is not None:
        return "sf"
    if device.sriov is not None and device.sriov.physfn is not None:
        return "vf"
    return "pf"


def pcie_root(pci_path: Sequence[str]) -> str | None:
    """`pci<domain>:<bus>` of the host bridge a function hangs from (its path's first)."""
    return pci_path[0] if pci_path and pci_path[0].startswith("pci") else None


def data_direct_of(
    device: Device, functions: Sequence[DataDirectFunction]
) -> DataDirectFunction | None:
    """The Data Direct function of a NIC, by VPD: the VU keyword (the VUID the kernel's
    mlx5 data_direct code matches) when both have one, else the board serial (SN) when
    exactly one Data Direct function carries it. Ambiguous or unknown: None."""
    if device.vpd_vuid is not None:
        by_vuid = [f for f in functions if f.vpd_vuid == device.vpd_vuid]
        if len(by_vuid) == 1:
            return by_vuid[0]
        if by_vuid:
            return None
    if device.vpd_serial is None:
        return None
    by_serial = [
        f
        for f in functions
        if f.vpd_serial == device.vpd_serial and (f.vpd_vuid is None or device.vpd_vuid is None)
    ]
    return by_serial[0] if len(by_serial) == 1 else None


def device_entries(
    snapshot: NodeSnapshot, port_states: PortStates, settings: SliceSettings
) -> list[dict[str, Any]]:
    """The `spec.devices` entries of the whole pool, in snapshot order."""
    by_address = {d.pci_address: d for d in snapshot.devices if d.pci_address is not None}
    out: list[dict[str, Any]] = []
    for device in snapshot.devices:
        copies = settings.sharing == "copies" and settings.share > 1
        try:
            names = [
                dranames.device_name(device.name, i)
                if copies
                else dranames.device_name(device.name)
                for i in range(settings.share if copies else 1)
            ]
        except dranames.InvalidDeviceName:
            continue  # a name no DRA device can carry is not published
        attributes = _attributes(device, snapshot, by_address, port_states, settings)
        if copies:
            # Own dicts per copy: YAML would otherwise print shared ones as anchors.
            out.extend({"name": n, "attributes": _copy(attributes)} for n in names)
            continue
        entry: dict[str, Any] = {"name": names[0], "attributes": attributes}
        if settings.sharing == "consumable":
            n = str(settings.share)
            entry["allowMultipleAllocations"] = True
            entry["capacity"] = {
                SHARES: {
                    "value": n,
                    "requestPolicy": {
                        "default": "1",
                        "validRange": {"min": "1", "max": n, "step": "1"},
                    },
                }
            }
        out.append(entry)
    return out


def build_slices(
    snapshot: NodeSnapshot, port_states: PortStates, settings: SliceSettings
) -> list[dict[str, Any]]:
    """The node's ResourceSlices: the pool split in order into slices of at most
    `max_devices`, each named `<node>-<driver>-<i>` and counting the pool's slices. A node
    without devices publishes one empty slice, so its pool still exists (generation)."""
    devices = device_entries(snapshot, port_states, settings)
    step = settings.max_devices
    chunks = [devices[i : i + step] for i in range(0, len(devices), step)] or [[]]
    node = snapshot.node
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": slice_name(node, settings.driver, i)},
            "spec": {
                "driver": settings.driver,
                "nodeName": node,
                "pool": {
                    "name": node,
                    "generation": settings.generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def slice_name(node: str, driver: str, index: int) -> str:
    """`<node>-<driver with dots as dashes>-<index>`, cut to a 253-character DNS subdomain."""
    suffix = f"-{driver.replace('.', '-')}-{index}"
    return node[: 253 - len(suffix)].rstrip("-.") + suffix


def _attributes(
    device: Device,
    snapshot: NodeSnapshot,
    by_address: Mapping[str, Device],
    port_states: PortStates,
    settings: SliceSettings,
) -> dict[str, Attribute]:
    kind = device_kind(device)
    # A VF's identity beyond its own function (model, VPD) is its PF's; an SF's and a
    # bond's PCI fields already are the (first) PF's.
    physfn = device.sriov.physfn if kind == "vf" and device.sriov else None
    pf = by_address.get(physfn) if physfn is not None else None
    nic_root = pcie_root(device.pci_path)
    dd = data_direct_of(pf or device, snapshot.data_direct)
    root = pcie_root(dd.pci_path) if dd is not None else None
    found: dict[str, Attribute | None] = {
        f"{STANDARD}/pcieRoot": _string(root or nic_root),
        f"{STANDARD}/pciBusID": _string(device.pci_address),
        f"{STANDARD}/numaNode": _int(device.numa_node),
        "kind": _string(kind),
        "rdmaDevice": _string(device.name),
        "netdevs": _string(",".join(device.netdevs)),
        "firmware": _firmware(device.fw_ver),
        "nodeGUID": _string(device.node_guid),
        "sysImageGUID": _string(device.sys_image_guid),
        "vendorID": _string(_hex4(device.vendor_id)),
        "deviceID": _string(_hex4(device.device_id)),
        "model": _string(_model(pf or device)),
        "rail": _int(settings.rails.get(device.name)),
        "nicPcieRoot": _string(nic_root) if root is not None and root != nic_root else None,
        "pfPciBusID": _string(_pf_address(device, kind)),
        "bondPciBusIDs": _string(",".join(device.lag_functions)) if kind == "bond" else None,
        "sfNumber": _int(device.sf_number) if kind == "sf" else None,
    }
    if device.ports:
        port = min(device.ports, key=lambda p: p.port)
        state = port_states.get((device.name, port.port), (port.state, port.phys_state))[0]
        found["linkLayer"] = _string(port.link_layer)
        found["rateGbps"] = _int(round(port.rate_gbps) if port.rate_gbps is not None else None)
        found["portState"] = _string(state)
    return {name: value for name, value in sorted(found.items()) if value is not None}


def _copy(attributes: dict[str, Attribute]) -> dict[str, Attribute]:
    return {name: dict(value) for name, value in attributes.items()}


def _pf_address(device: Device, kind: DeviceKind) -> str | None:
    if kind == "vf" and device.sriov is not None:
        return device.sriov.physfn
    if kind == "sf":
        return device.pci_address  # an SF's PCI function is its PF
    return None


def _string(value: str | None) -> Attribute | None:
    # The API server rejects the whole slice for one string over 64 characters: such a
    # value (a long netdev list) is left out rather than cut into something false.
    if value is None or len(value) > MAX_STRING:
        return None
    return {"string": value}


def _int(value: int | None) -> Attribute | None:
    return None if value is None else {"int": value}


def _firmware(text: str | None) -> Attribute | None:
    if text is None:
        return None
    if _SEMVER.fullmatch(text):
        return {"version": text}
    return _string(text)


def _hex4(text: str | None) -> str | None:
    match = _PCI_ID.fullmatch(text or "")
    return match[1] if match else None


def _model(device: Device) -> str | None:
    return MODEL_NAMES.get(device.device_id or "")
