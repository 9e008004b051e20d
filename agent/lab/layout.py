"""Where every PCI function of a spec lives and what it is: sysfs directory, parent, NUMA
node, kind, ids, bus range, ACS registers, SR-IOV VF placement and IOMMU groups.

Pure: computed from the spec alone; checks.py uses the VF placement, render.py all of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple, cast

from agent.lab.models import (
    ACS_ENABLED,
    ADAPTER_MODELS,
    GPU_MODELS,
    MELLANOX,
    NVIDIA,
    ROOT_PORT_ACS_CAP,
    ROOT_PORT_IDS,
    SWITCH_ACS_CAP,
    LinkDefault,
)
from agent.lab.nodespec import (
    AcsSetting,
    Adapter,
    Bridge,
    Link,
    NodeSpec,
    Width,
    bridge_of,
    pci_bus,
)

Kind = Literal["root_port", "upstream", "downstream", "gpu", "adapter", "vf"]
BRIDGE_CLASS = "0x060400"


class Function(NamedTuple):
    address: str
    kind: Kind
    parent: str  # host bridge name or the upstream bridge's address
    ids: tuple[str, str, str, str, str]  # vendor, device, subsystem vendor/device, class
    link: Link | None  # None: a VF, which has no link of its own
    driver: str | None
    acs: tuple[int, int] | None = None  # (capability, control) of root/downstream ports
    pf: str | None = None  # a VF's physical function


class SriovPlan(NamedTuple):
    """Routing IDs of a PF's VFs: VF n is PF RID + offset + n * stride (SR-IOV spec)."""

    offset: int
    stride: int
    devfns: list[int]  # all totalvfs of them; > 255 means they do not fit on the bus
    vfs: list[str]  # addresses of the numvfs enabled VFs
    vf_device: str  # PCI device id of the VFs
    driver: str | None  # what the VFs are bound to; None: unbound, autoprobe off


class Layout(NamedTuple):
    functions: dict[str, Function]  # in render order: bridges, GPUs, adapters, VFs
    dirs: dict[str, str]  # address or host bridge -> directory below the root
    numas: dict[str, int | None]
    sriov: dict[str, SriovPlan]  # PF address -> plan


def to_link(default: LinkDefault) -> Link:
    return Link(gen=default.gen, width=cast(Width, default.width))


def rid(address: str) -> int:
    """Routing ID bus << 8 | device << 3 | function (the domain is ignored)."""
    bus, dev, fn = int(address[5:7], 16), int(address[8:10], 16), int(address[11])
    return bus << 8 | dev << 3 | fn


def vf_address(pf: str, devfn: int) -> str:
    return f"{pf[:7]}:{devfn >> 3:02x}.{devfn & 7}"


def sriov_plans(spec: NodeSpec) -> dict[str, SriovPlan]:
    """VFs follow the card's last PF, each PF's block after the previous PF's totalvfs
    (a CX-6 Dx at 04:00.0/.1 puts PF0's VFs at 04:00.2, 04:00.3, ...); stride 1, ARI."""
    plans: dict[str, SriovPlan] = {}
    cards: dict[str, list[Adapter]] = {}
    for adapter in spec.adapters:
        cards.setdefault(adapter.address[:-2], []).append(adapter)
    for functions in cards.values():
        functions.sort(key=lambda a: a.address)
        next_rid = rid(functions[-1].address) + 1
        for pf in functions:
            if pf.sriov is None:
                continue
            first = next_rid - (rid(pf.address) & ~0xFF)  # devfn on the PF's bus
            devfns = list(range(first, first + pf.sriov.totalvfs))
            vfs = [vf_address(pf.address, d) for d in devfns[: pf.sriov.numvfs] if d <= 0xFF]
            vf_device = ADAPTER_MODELS[pf.model].vf_device
            offset = next_rid - rid(pf.address)
            plans[pf.address] = SriovPlan(offset, 1, devfns, vfs, vf_device, pf.sriov.driver)
            next_rid += pf.sriov.totalvfs
    return plans


def acs_registers(setting: AcsSetting | None, capability: int) -> tuple[int, int]:
    if setting is None or setting == "disabled":
        return capability, 0
    if setting == "enabled":
        return capability, ACS_ENABLED & capability
    return setting.capability if setting.capability is not None else capability, setting.control


def plan(spec: NodeSpec) -> Layout:
    """Every PCI function of the spec, placed (assumes the spec passed checks.py)."""
    functions: dict[str, Function] = {}

    def bridge(
        b: Bridge,
        kind: Kind,
        parent: str,
        ids: tuple[str, str],
        acs: int | None,
        inherited: AcsSetting | None,
    ) -> None:
        vendor, device = b.vendor or ids[0], b.device or ids[1]
        regs = acs_registers(b.acs or inherited, acs) if acs is not None else None
        functions[b.address] = Function(
            b.address,
            kind,
            parent,
            (vendor, device, vendor, device, BRIDGE_CLASS),
            b.link,
            "pcieport",
            regs,
        )

    for hb in spec.host_bridges:
        for rp in map(bridge_of, hb.root_ports):
            bridge(rp, "root_port", hb.name, ROOT_PORT_IDS, ROOT_PORT_ACS_CAP, hb.acs)
    for sw in spec.switches:
        up = bridge_of(sw.upstream)
        bridge(up, "upstream", sw.parent, (sw.vendor, sw.device), None, None)
        for down in map(bridge_of, sw.downstream):
            bridge(down, "downstream", up.address, (sw.vendor, sw.device), SWITCH_ACS_CAP, sw.acs)
    for gpu in spec.gpus:
        device, default = GPU_MODELS[gpu.model]
        ids = (
            NVIDIA,
            gpu.device or device,
            gpu.subsystem_vendor,
            gpu.subsystem_device,
            gpu.class_code,
        )
        functions[gpu.address] = Function(
            gpu.address, "gpu", gpu.parent, ids, gpu.link or to_link(default), gpu.driver
        )
    for a in spec.adapters:
        ids = (
            MELLANOX,
            a.pci_device(),
            a.subsystem_vendor,
            a.subsystem_device,
            a.effective_class(),
        )
        link = a.link or to_link(ADAPTER_MODELS[a.model].link)
        functions[a.address] = Function(a.address, "adapter", a.parent, ids, link, a.driver)
    plans = sriov_plans(spec)
    for a in spec.adapters:
        if a.sriov is None:
            continue
        pf, vfs = functions[a.address], plans[a.address]
        ids = (MELLANOX, vfs.vf_device, *pf.ids[2:])
        for vf in vfs.vfs:
            functions[vf] = Function(vf, "vf", a.parent, ids, None, vfs.driver, pf=a.address)
    dirs: dict[str, str] = {hb.name: f"devices/{hb.name}" for hb in spec.host_bridges}
    numas: dict[str, int | None] = {hb.name: hb.numa_node for hb in spec.host_bridges}

    def place(address: str) -> None:
        if address not in dirs:
            parent = functions[address].parent
            place(parent)
            dirs[address] = f"{dirs[parent]}/{address}"
            numas[address] = numas[parent]

    for address in functions:
        place(address)
    return Layout(functions, dirs, numas, plans)


def chain(layout: Layout, address: str) -> list[str]:
    """The bridges above a function, nearest first."""
    out = []
    parent = layout.functions[address].parent
    while parent in layout.functions:
        out.append(parent)
        parent = layout.functions[parent].parent
    return out


def buses(layout: Layout, address: str) -> tuple[int, int, int]:
    """(primary, secondary, subordinate) bus numbers of a bridge, from what hangs below."""
    below = [int(pci_bus(a)[5:], 16) for a in layout.functions if address in chain(layout, a)]
    children = [a for a, f in layout.functions.items() if f.parent == address]
    secondary = min((int(pci_bus(a)[5:], 16) for a in children), default=0)
    return int(pci_bus(address)[5:], 16), secondary, max(below, default=0)


def multifunction(layout: Layout, address: str) -> bool:
    """Header type bit 7: the device has functions besides .0 (VFs do not count)."""
    if layout.functions[address].kind == "vf":
        return False
    slot = address[:-2]
    return address[-1] != "0" or any(
        a != address and a[:-2] == slot and f.kind != "vf" for a, f in layout.functions.items()
    )


def _isolated(layout: Layout, bridge: str) -> bool:
    """pci_acs_path_enabled: every root/downstream port from here up redirects P2P."""
    for address in [bridge, *chain(layout, bridge)]:
        regs = layout.functions[address].acs
        if layout.functions[address].kind != "upstream" and (
            regs is None or regs[1] & ACS_ENABLED != ACS_ENABLED
        ):
            return False
    return True


def iommu_groups(layout: Layout) -> dict[str, int]:
    """Group number per function, after the kernel's pci_device_group: a function shares
    its parent bridge's group unless ACS isolates the path to the root complex, and the
    functions of one multi-function device (no ACS of their own) share one group."""
    keys: dict[str, str] = {}

    def key(address: str) -> str:
        if address not in keys:
            parent = layout.functions[address].parent
            if parent in layout.functions and not _isolated(layout, parent):
                keys[address] = key(parent)
            elif layout.functions[address].kind in ("gpu", "adapter") and multifunction(
                layout, address
            ):
                keys[address] = address[:-2]
            else:
                keys[address] = address
        return keys[address]

    numbers: dict[str, int] = {}
    return {a: numbers.setdefault(key(a), len(numbers)) for a in _tree_order(layout)}


def _tree_order(layout: Layout) -> Iterator[str]:
    """Depth-first by address below each host bridge: the kernel's bus scan order."""
    children: dict[str, list[str]] = {}
    for address, f in layout.functions.items():
        children.setdefault(f.parent, []).append(address)
    roots = [d.removeprefix("devices/") for d in layout.dirs.values() if d.count("/") == 1]

    def walk(node: str) -> Iterator[str]:
        for child in sorted(children.get(node, [])):
            yield child
            yield from walk(child)

    for root in roots:
        yield from walk(root)
