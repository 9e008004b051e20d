"""Pure identification of the pod's RDMA interfaces from what the pod itself can see: GID
addresses equal to a pod address, the netdevs an RDMA device lists in the pod's namespace,
and Multus network-status device-info. Host netdev names are never looked for (a pod's
secondary interface is net1, not the host's enp26s0f0np0). No I/O (docs/verify.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from proto.messages.validation import (
    AttachmentEvidence,
    DeviceEvidence,
    GidMatch,
    InjectedEvidence,
    InterfaceEvidence,
    PodInterfaceSource,
    RdmaInterface,
    Reason,
)

# The CNI convention for the cluster network's interface, used only when no network-status
# says which attachment is the default one.
PRIMARY_INTERFACE: Final = "eth0"
# Evidence that proves an interface is the device's; gid-ndev only corroborates, because
# gid_attrs/ndevs prints a name from whichever namespace holds the netdev.
PROVING: Final[frozenset[PodInterfaceSource]] = frozenset(
    {"gid-address", "device-net", "device-info"}
)


def identify_interfaces(
    devices: Iterable[DeviceEvidence],
    interfaces: Iterable[InterfaceEvidence],
    gid_matches: Iterable[GidMatch],
    attachments: Iterable[AttachmentEvidence],
) -> tuple[RdmaInterface, ...]:
    """(interface, device) pairs with at least one proving source, sorted by interface.

    gid-address: a RoCE GID of the device is an address of the interface; device-net: the
    device's device/net lists it (sysfs shows the pod's namespace only; IPoIB and netns-
    exclusive RoCE); device-info: network-status names the device for it; gid-ndev: a GID's
    gid_attrs/ndevs names it (recorded beside a proving source, never alone).
    """
    pod = {i.name for i in interfaces}
    matches = tuple(gid_matches)
    by_interface = {a.interface: a for a in attachments if a.interface is not None}
    found: list[RdmaInterface] = []
    for name in sorted(pod):
        for device in devices:
            sources: list[PodInterfaceSource] = []
            if any(m.device == device.name and m.interface == name for m in matches):
                sources.append("gid-address")
            if name in device.netdevs:
                sources.append("device-net")
            attachment = by_interface.get(name)
            if attachment is not None and names_device(attachment, device):
                sources.append("device-info")
            if not sources:
                continue
            if any(m.device == device.name and m.ndev == name for m in matches):
                sources.append("gid-ndev")
            found.append(RdmaInterface(interface=name, device=device.name, sources=tuple(sources)))
    return tuple(found)


def names_device(attachment: AttachmentEvidence, device: DeviceEvidence) -> bool:
    """The attachment's device-info names this RDMA device (by name or PCI function)."""
    if attachment.rdma_device is not None and attachment.rdma_device == device.name:
        return True
    return device.pci_address is not None and attachment.pci_address == device.pci_address


def primary_interface(attachments: Sequence[AttachmentEvidence]) -> str:
    """The pod's cluster-network interface: the default network-status entry's, else eth0."""
    default = next((a.interface for a in attachments if a.default and a.interface), None)
    return default or PRIMARY_INTERFACE


def secondary_interfaces(
    interfaces: Sequence[InterfaceEvidence], attachments: Sequence[AttachmentEvidence]
) -> tuple[InterfaceEvidence, ...]:
    """Every pod interface but the primary one (Multus' net1, ...)."""
    primary = primary_interface(attachments)
    return tuple(i for i in interfaces if i.name != primary)


def injected_pci(injected: InjectedEvidence) -> set[str]:
    """The PCI functions a device plugin says it gave the pod: NICFLEET_PCI_ADDRESSES and
    the SR-IOV device plugin's RDMA allocations (PCIDEVICE_<RESOURCE>)."""
    found = set(injected.pci_addresses or ())
    found |= {a for e in injected.sriov if e.rdma is not False for a in e.pci_addresses}
    return found


def allocated_pci(injected: InjectedEvidence, devices: Iterable[DeviceEvidence]) -> set[str]:
    """PCI functions the pod was given: the injected ones, else those of the injected
    devices as the pod's sysfs shows them; empty when neither is known."""
    if pci := injected_pci(injected):
        return pci
    wanted = set(injected.rdma_devices or ())
    return {d.pci_address for d in devices if d.name in wanted and d.pci_address}


def attachment_reasons(
    attachments: Sequence[AttachmentEvidence],
    interfaces: Sequence[InterfaceEvidence],
    injected: InjectedEvidence,
    devices: Sequence[DeviceEvidence],
) -> Iterable[Reason]:
    """A wrong attachment: a secondary network whose device-info names an adapter the pod
    was not allocated, or one whose interface is not in the pod."""
    pod = {i.name for i in interfaces}
    pci = allocated_pci(injected, devices)
    rdma = set(injected.rdma_devices or ())
    for a in attachments:
        if a.default:
            continue
        where = f"network-status {a.name} ({a.interface or 'no interface'})"
        if a.interface is not None and a.interface not in pod:
            yield Reason(
                code="attachment-interface-missing",
                missing=f"pod interface {a.interface}",
                message=f"{where} names interface {a.interface}, which the pod does not have",
            )
        functions = [f for f in (a.pci_address, a.pf_pci_address) if f is not None]
        if pci and functions and not any(f in pci for f in functions):
            yield Reason(
                code="attachment-not-allocated",
                missing=f"device-info PCI address in {','.join(sorted(pci))}",
                message=f"{where} is on PCI function {'/'.join(functions)}, not one of the "
                f"pod's allocated adapters ({', '.join(sorted(pci))})",
            )
        elif rdma and a.rdma_device is not None and a.rdma_device not in rdma and not functions:
            yield Reason(
                code="attachment-not-allocated",
                missing=f"device-info rdma-device in {','.join(sorted(rdma))}",
                message=f"{where} is on RDMA device {a.rdma_device}, not one of the pod's "
                f"allocated devices ({', '.join(sorted(rdma))})",
            )
