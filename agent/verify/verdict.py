"""Pure judgement of in-pod RDMA evidence: GID↔IP matching, the device plugin's
injection against what is visible, and the verdict with one reason per missing piece
(which pod interfaces are the RDMA ones: agent.verify.identify).

No I/O, no clock, no logging: agent.verify.evidence reads, this decides (docs/verify.md).
"""

from __future__ import annotations

import ipaddress
import posixpath
from collections.abc import Iterable, Mapping

from agent.deviceplugin.plan import ENV_NETDEVS, ENV_PCI_ADDRESSES, ENV_RDMA_DEVICES
from agent.verify import identify, sriovenv
from proto.messages.validation import (
    DeviceEvidence,
    Evidence,
    GidMatch,
    InjectedEvidence,
    InterfaceEvidence,
    Reason,
    Verdict,
)

UVERBS_GLOB = "/dev/infiniband/uverbs*"
PRIMARY_ONLY = "primary-interface-only"


def parse_env_list(value: str | None) -> tuple[str, ...] | None:
    """`"mlx5_0, mlx5_1"` -> ("mlx5_0", "mlx5_1"); None when the variable is unset."""
    if value is None:
        return None
    return tuple(item.strip() for item in value.split(",") if item.strip())


def gid_ip(gid: str) -> str | None:
    """The IP address a RoCE GID stands for: IPv4-mapped (::ffff:a.b.c.d) as IPv4,
    anything else as IPv6 text; None when the text is not a GID."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    mapped = address.ipv4_mapped
    return str(mapped) if mapped is not None else str(address)


def _interface_ips(interfaces: Iterable[InterfaceEvidence]) -> dict[str, str]:
    """Pod IP -> interface name; addresses come as "10.0.0.5/24"."""
    ips: dict[str, str] = {}
    for interface in interfaces:
        for address in interface.addresses:
            try:
                ip = ipaddress.ip_interface(address).ip
            except ValueError:
                continue
            ips[str(ip)] = interface.name
    return ips


def match_gids(
    devices: Iterable[DeviceEvidence], interfaces: Iterable[InterfaceEvidence]
) -> tuple[GidMatch, ...]:
    """Every RoCE GID (Ethernet ports) with the pod interface holding its IP, if any.

    The IP is the proof: the kernel adds a RoCE GID for each address of a netdev on top
    of the port, so a GID equal to a pod address means the pod's interface is RDMA-capable.
    A name in gid_attrs/ndevs alone proves nothing (names are per namespace).
    """
    ips = _interface_ips(interfaces)
    matches: list[GidMatch] = []
    for device in devices:
        for port in device.ports:
            if port.link_layer != "Ethernet":
                continue
            for gid in port.gids:
                ip = gid_ip(gid.gid)
                matches.append(
                    GidMatch(
                        device=device.name,
                        port=port.port,
                        index=gid.index,
                        gid=gid.gid,
                        type=gid.type,
                        ndev=gid.ndev,
                        ip=ip,
                        interface=ips.get(ip) if ip is not None else None,
                    )
                )
    return tuple(matches)


def injected_evidence(
    environ: Mapping[str, str], visible: Iterable[DeviceEvidence]
) -> InjectedEvidence:
    """What NICFLEET_RDMA_DEVICES / NICFLEET_PCI_ADDRESSES promise against the RDMA
    devices the pod sees. NICFLEET_NETDEVS is recorded, never checked: it holds the host's
    names, and a pod's RDMA interface is its own (net1), found by agent.verify.identify."""
    rdma = parse_env_list(environ.get(ENV_RDMA_DEVICES))
    pci = parse_env_list(environ.get(ENV_PCI_ADDRESSES))
    netdevs = parse_env_list(environ.get(ENV_NETDEVS))
    devices = tuple(visible)
    names = {d.name for d in devices}
    functions = {d.pci_address for d in devices if d.pci_address}
    missing_devices = tuple(d for d in rdma or () if d not in names)
    missing_pci = tuple(a for a in pci or () if a not in functions)
    # The SR-IOV network device plugin's PCIDEVICE_<RESOURCE>: its RDMA allocations are
    # adapters the pod was given too (a netdevice-only pool's are not RDMA at all).
    sriov = sriovenv.sriov_evidence(environ, devices)
    sriov_rdma = [e for e in sriov if e.rdma is not False and e.pci_addresses]
    matches = None
    if rdma is not None or pci is not None or netdevs is not None or sriov_rdma:
        matches = (
            not missing_devices
            and not missing_pci
            and not any(e.missing_pci_addresses for e in sriov)
        )
    return InjectedEvidence(
        rdma_devices=rdma,
        netdevs=netdevs,
        missing_devices=missing_devices,
        matches=matches,
        pci_addresses=pci,
        missing_pci_addresses=missing_pci,
        sriov=sriov,
    )


def _is_uverbs(path: str) -> bool:
    return posixpath.basename(path).startswith("uverbs")


def target_devices(evidence: Evidence) -> tuple[str, ...]:
    """The devices this pod is meant to use: what the plugin injected (by name, else by
    PCI address), else the devices whose uverbs node the pod holds (sysfs maps uverbsN to
    its device)."""
    injected = evidence.injected
    if injected.rdma_devices is not None:
        return injected.rdma_devices
    wanted = identify.injected_pci(injected)
    if wanted:
        return tuple(d.name for d in evidence.devices if d.pci_address in wanted)
    present = {c.path for c in evidence.char_devices if _is_uverbs(c.path)}
    return tuple(d.name for d in evidence.devices if any(c in present for c in d.char_devices))


def judge(evidence: Evidence) -> tuple[Verdict, tuple[Reason, ...]]:
    """rdma-path only when every piece is there; ordinary-interface-only when the pod
    got nothing RDMA at all; broken otherwise. Every reason names the missing evidence."""
    uverbs = [c for c in evidence.char_devices if _is_uverbs(c.path)]
    injected = evidence.injected
    if not uverbs and injected.matches is None:
        names = ", ".join(i.name for i in evidence.interfaces) or "none"
        return "ordinary-interface-only", (
            Reason(
                code="no-rdma-device-in-pod",
                missing=UVERBS_GLOB,
                message="the pod holds no RDMA char device and the device plugin injected "
                f"nothing ({ENV_RDMA_DEVICES} unset); its interfaces ({names}) are "
                "ordinary network interfaces",
            ),
        )
    reasons = list(_char_reasons(evidence, bool(uverbs)))
    reasons += _injection_reasons(injected)
    reasons += identify.attachment_reasons(
        evidence.attachments, evidence.interfaces, injected, evidence.devices
    )
    by_name = {d.name: d for d in evidence.devices}
    targets = target_devices(evidence)
    if not evidence.devices:
        reasons.append(
            Reason(
                code="no-rdma-devices",
                missing="/sys/class/infiniband/*",
                message="no RDMA device is visible in /sys/class/infiniband",
            )
        )
    present = {c.path for c in evidence.char_devices}
    for name in targets:
        device = by_name.get(name)
        if device is not None:
            reasons += _device_reasons(device, present, evidence)
    reasons += _verbs_reasons(evidence, targets)
    if not reasons:
        return "rdma-path", ()
    if all(r.code == PRIMARY_ONLY for r in reasons):
        return "ordinary-interface-only", tuple(reasons)
    return "broken", tuple(reasons)


def _char_reasons(evidence: Evidence, has_uverbs: bool) -> Iterable[Reason]:
    if not has_uverbs:
        yield Reason(
            code="no-uverbs-device",
            missing=UVERBS_GLOB,
            message="RDMA was injected but no /dev/infiniband/uverbs* node is in the pod",
        )
    for char in evidence.char_devices:
        if not char.openable:
            yield Reason(
                code="char-device-unopenable",
                missing=f"{char.path} openable",
                message=f"{char.path} cannot be opened read-write: {char.error or 'unknown'}",
            )


def _injection_reasons(injected: InjectedEvidence) -> Iterable[Reason]:
    for name in injected.missing_devices:
        yield Reason(
            code="injected-device-not-visible",
            missing=f"/sys/class/infiniband/{name}",
            message=f"{ENV_RDMA_DEVICES} names {name}, which the pod cannot see",
        )
    for address in injected.missing_pci_addresses:
        yield Reason(
            code="injected-pci-not-visible",
            missing=f"RDMA device at PCI {address}",
            message=f"{ENV_PCI_ADDRESSES} names {address}, and no RDMA device the pod can "
            "see is that PCI function",
        )
    for entry in injected.sriov:
        for address in entry.missing_pci_addresses:
            yield Reason(
                code="injected-pci-not-visible",
                missing=f"RDMA device at PCI {address}",
                message=f"{entry.variable} (the SR-IOV device plugin's) names {address}, and "
                "no RDMA device the pod can see is that PCI function",
            )


def _device_reasons(
    device: DeviceEvidence, present: set[str], evidence: Evidence
) -> Iterable[Reason]:
    for path in device.char_devices:
        if _is_uverbs(path) and path not in present:
            yield Reason(
                code="device-uverbs-missing",
                missing=path,
                message=f"{device.name}'s verbs node {path} is not in the pod",
            )
    active = [p for p in device.ports if p.state == "ACTIVE"]
    if not active:
        states = ", ".join(f"port {p.port}: {p.state}/{p.phys_state}" for p in device.ports)
        yield Reason(
            code="port-down",
            missing=f"{device.name} port ACTIVE",
            message=f"no port of {device.name} is ACTIVE ({states or 'no ports'})",
        )
        return
    if any(p.link_layer == "Ethernet" for p in active):
        yield from _roce_reasons(device, evidence)


def _roce_reasons(device: DeviceEvidence, evidence: Evidence) -> Iterable[Reason]:
    """RoCE traffic leaves from the GID of an address the pod uses: no such GID is
    ordinary-interface-only when the pod has nothing but its primary interface (no
    secondary network attached), broken when a secondary interface is there but wrong."""
    mine = [m for m in evidence.gid_matches if m.device == device.name]
    if any(m.interface for m in mine):
        return
    secondary = identify.secondary_interfaces(evidence.interfaces, evidence.attachments)
    gid_ips = sorted({m.ip for m in mine if m.ip is not None})
    missing = f"RoCE GID of {device.name} equal to a pod interface address"
    if not secondary:
        primary = identify.primary_interface(evidence.attachments)
        yield Reason(
            code=PRIMARY_ONLY,
            missing=missing,
            message=f"the pod has only its primary interface ({primary}) and no RoCE GID of "
            f"{device.name} carries its address: no secondary (RDMA) network is attached",
        )
        return
    held = "; ".join(f"{i.name} ({', '.join(i.addresses) or 'no address'})" for i in secondary)
    yield Reason(
        code="gid-not-on-pod-interface",
        missing=missing,
        message=f"no RoCE GID of {device.name} carries an address of a pod interface "
        f"({held}); the GIDs hold {', '.join(gid_ips) or 'no address'}: the pod's "
        "secondary network is not on this RDMA port",
    )


def _verbs_reasons(evidence: Evidence, targets: tuple[str, ...]) -> Iterable[Reason]:
    verbs = evidence.verbs
    if not verbs.checked:
        return
    if not verbs.available:
        yield Reason(
            code="verbs-unavailable",
            missing="pyverbs device context",
            message=verbs.detail or "libibverbs cannot be used",
        )
        return
    for name in targets:
        if name in verbs.failed:
            yield Reason(
                code="verbs-open-failed",
                missing=f"{name} device context and port query",
                message=f"pyverbs could not use {name}: {verbs.failed[name]}",
            )


def choose_port(evidence: Evidence) -> tuple[str, int, int] | None:
    """(device, port, GID index) for the pair test: the first target device's first
    ACTIVE port; on RoCE the GID of a pod address (RoCE v2 first), on IB index 0."""
    by_name = {d.name: d for d in evidence.devices}
    for name in target_devices(evidence):
        device = by_name.get(name)
        for port in device.ports if device is not None else ():
            if port.state != "ACTIVE":
                continue
            if port.link_layer != "Ethernet":
                return name, port.port, 0
            matches = [
                m for m in evidence.gid_matches
                if m.device == name and m.port == port.port and m.interface
            ]  # fmt: skip
            matches.sort(key=lambda m: (m.type != "RoCE v2", m.index))
            if matches:
                return name, port.port, matches[0].index
    return None
