"""Semantic checks of a decoded node spec: what msgspec's types cannot express.

Dangling or wrong-kind parents, duplicate addresses and names, bus conflicts, GUID rules,
ACS registers that contradict their capability, VFs that do not fit their bus or collide
with declared functions. Pure; each problem is (field path, message), in document order.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import NamedTuple

from agent.lab.layout import sriov_plans, vf_address
from agent.lab.models import ROOT_PORT_ACS_CAP, SWITCH_ACS_CAP
from agent.lab.nodespec import (
    AcsSetting,
    NodeSpec,
    bridge_of,
    guid_text,
    parse_cpulist,
    pci_bus,
)
from proto.subjects import InvalidNodeName, validate_node_name

Problem = tuple[str, str]


def problems(spec: NodeSpec) -> Iterator[Problem]:
    try:
        validate_node_name(spec.name)
    except InvalidNodeName as exc:
        yield "$.name", str(exc)
    owner: dict[int, int] = {}
    for numa, cpulist in spec.numa_nodes.items():
        try:
            cpus = parse_cpulist(cpulist)
        except ValueError as exc:
            yield f"$.numa_nodes[{numa}]", str(exc)
            continue
        for cpu in cpus:
            if owner.setdefault(cpu, numa) != numa:
                yield f"$.numa_nodes[{numa}]", f"CPU {cpu} is already in NUMA node {owner[cpu]}"
    if spec.possible_cpus is not None and owner and max(owner) >= spec.possible_cpus:
        yield "$.possible_cpus", f"CPU {max(owner)} is beyond possible_cpus {spec.possible_cpus}"

    seen: dict[str, str] = {}  # address or host bridge name -> field path of its declaration
    kinds: dict[str, str] = {}  # -> host_bridge | root_port | upstream | downstream | endpoint
    links: list[_Edge] = []

    def declare(path: str, address: str, kind: str) -> Iterator[Problem]:
        if address in seen:
            yield path, f"duplicate PCI address {address} (first declared at {seen[address]})"
        seen.setdefault(address, path)
        kinds.setdefault(address, kind)

    for h, hb in enumerate(spec.host_bridges):
        yield from declare(f"$.host_bridges[{h}].name", hb.name, "host_bridge")
        if hb.numa_node is not None and hb.numa_node not in spec.numa_nodes:
            yield f"$.host_bridges[{h}].numa_node", f"NUMA node {hb.numa_node} is not declared"
        yield from _acs_problems(f"$.host_bridges[{h}].acs", hb.acs, ROOT_PORT_ACS_CAP)
        for r, rp in enumerate(map(bridge_of, hb.root_ports)):
            path = f"$.host_bridges[{h}].root_ports[{r}]"
            yield from declare(path, rp.address, "root_port")
            yield from _acs_problems(f"{path}.acs", rp.acs, ROOT_PORT_ACS_CAP)
            links.append(_Edge(path, path, rp.address, hb.name))
    for s, sw in enumerate(spec.switches):
        at = f"$.switches[{s}]"
        up = bridge_of(sw.upstream)
        yield from declare(f"{at}.upstream", up.address, "upstream")
        if up.acs is not None:
            yield f"{at}.upstream.acs", "ACS belongs to downstream ports, not the upstream port"
        links.append(_Edge(f"{at}.upstream", f"{at}.parent", up.address, sw.parent))
        yield from _acs_problems(f"{at}.acs", sw.acs, SWITCH_ACS_CAP)
        for d, down in enumerate(map(bridge_of, sw.downstream)):
            path = f"{at}.downstream[{d}]"
            yield from declare(path, down.address, "downstream")
            yield from _acs_problems(f"{path}.acs", down.acs, SWITCH_ACS_CAP)
            links.append(_Edge(path, path, down.address, up.address))
    endpoints = [("gpus", i, g.address, g.parent) for i, g in enumerate(spec.gpus)]
    endpoints += [("adapters", i, a.address, a.parent) for i, a in enumerate(spec.adapters)]
    for field, i, address, parent in endpoints:
        yield from declare(f"$.{field}[{i}].address", address, "endpoint")
        links.append(_Edge(f"$.{field}[{i}].address", f"$.{field}[{i}].parent", address, parent))
    yield from _tree_problems(links, kinds)
    yield from _adapter_problems(spec)
    yield from _sriov_problems(spec, seen)


class _Edge(NamedTuple):
    path: str  # where the child is declared
    parent_path: str  # where its parent is named
    address: str
    parent: str


# Which kind of node each kind of child may hang below (root ports and downstream ports
# get their parent from where they are declared, so only these two can be wrong).
_ALLOWED_PARENTS = {
    "endpoint": ("host_bridge", "root_port", "downstream"),
    "upstream": ("root_port", "downstream"),
}


def _tree_problems(links: list[_Edge], kinds: dict[str, str]) -> Iterator[Problem]:
    # A bridge forwards one secondary bus and every device on that bus hangs below it, so a
    # bus number claimed below two different parents is a typo in the spec.
    bus_owner = {pci_bus(name): name for name, kind in kinds.items() if kind == "host_bridge"}
    for edge in links:
        parent_kind = kinds.get(edge.parent)
        if parent_kind is None:
            yield edge.parent_path, f"unknown parent {edge.parent!r}: no such host bridge or bridge"
            continue
        allowed = _ALLOWED_PARENTS.get(kinds[edge.address], (parent_kind,))
        if parent_kind not in allowed:
            names = " or ".join(k.replace("_", " ") for k in allowed)
            yield (
                edge.parent_path,
                f"{edge.parent} is a {parent_kind.replace('_', ' ')}; expected {names}",
            )
            continue
        bus = pci_bus(edge.address)
        if parent_kind == "host_bridge" and bus != pci_bus(edge.parent):
            yield edge.path, f"{edge.address} is not on bus {pci_bus(edge.parent)} of {edge.parent}"
        elif bus_owner.setdefault(bus, edge.parent) != edge.parent:
            yield edge.path, f"bus {bus} already hangs below {bus_owner[bus]}, not {edge.parent}"


def _acs_problems(path: str, setting: AcsSetting | None, default_cap: int) -> Iterator[Problem]:
    # Control bits for features the port lacks are hardwired to 0 in real hardware.
    if setting is None or isinstance(setting, str):
        return
    cap = setting.capability if setting.capability is not None else default_cap
    if setting.control & ~cap:
        yield (
            f"{path}.control",
            (f"control 0x{setting.control:02x} sets bits the capability 0x{cap:02x} lacks"),
        )


def _adapter_problems(spec: NodeSpec) -> Iterator[Problem]:
    names: set[str] = set()
    ifnames: set[str] = set()
    card_guid: dict[str, tuple[str, str]] = {}  # bus:device -> (image guid, adapter name)
    for a, adapter in enumerate(spec.adapters):
        at = f"$.adapters[{a}]"
        if adapter.name in names:
            yield f"{at}.name", f"duplicate RDMA device name {adapter.name!r}"
        names.add(adapter.name)
        image = guid_text(adapter.sys_image_guid or adapter.node_guid)
        card = adapter.address[:-2]
        first = card_guid.setdefault(card, (image, adapter.name))
        if first[0] != image:
            yield (
                f"{at}.sys_image_guid",
                (f"functions of one card share sys_image_guid; {first[1]} has {first[0]}"),
            )
        numbers = [n for n, _ in adapter.numbered_ports()]
        for p, (number, port) in enumerate(adapter.numbered_ports()):
            pat = f"{at}.ports[{p}]"
            if numbers.count(number) > 1:
                yield f"{pat}.number", f"duplicate port number {number}"
            if port.link_layer == "Ethernet" and (port.lid or port.sm_lid):
                yield f"{pat}.lid", "an Ethernet (RoCE) port has no LID; leave lid/sm_lid at 0"
            if port.counters_ext and not adapter.counters_ext:
                yield f"{pat}.counters_ext", "set counters_ext: true on the adapter first"
            netdev = port.netdev_spec()
            if netdev is None:
                continue
            if netdev.name in ifnames:
                yield f"{pat}.netdev", f"duplicate netdev name {netdev.name!r}"
            ifnames.add(netdev.name)
            for i, ip in enumerate(netdev.ipv4):
                try:
                    ipaddress.IPv4Address(ip)
                except ValueError:
                    yield f"{pat}.netdev.ipv4[{i}]", f"not an IPv4 address: {ip!r}"
            if netdev.address is not None:
                want = 6 if port.link_layer == "Ethernet" else 20
                if len(netdev.address.split(":")) != want:
                    yield f"{pat}.netdev.address", f"a {port.link_layer} address has {want} bytes"


def _sriov_problems(spec: NodeSpec, seen: dict[str, str]) -> Iterator[Problem]:
    # VF routing IDs are fixed by the PF's SR-IOV capability (offset/stride) for all
    # totalvfs, enabled or not; they must stay on the PF's bus and clear of other functions.
    plans = sriov_plans(spec)
    for a, adapter in enumerate(spec.adapters):
        if adapter.sriov is None:
            continue
        at = f"$.adapters[{a}].sriov"
        sriov, plan = adapter.sriov, plans[adapter.address]
        if sriov.numvfs > sriov.totalvfs:
            yield f"{at}.numvfs", f"numvfs {sriov.numvfs} exceeds totalvfs {sriov.totalvfs}"
        if plan.devfns[-1] > 0xFF:
            yield (
                f"{at}.totalvfs",
                (
                    f"{sriov.totalvfs} VFs from devfn 0x{plan.devfns[0]:02x} do not fit on bus "
                    f"{pci_bus(adapter.address)}"
                ),
            )
            continue
        for devfn in plan.devfns:
            vf = vf_address(adapter.address, devfn)
            if vf in seen:
                yield f"{at}.totalvfs", f"VF routing ID {vf} collides with {seen[vf]}"
                break
        if sriov.rdma and sriov.driver != "mlx5_core":
            yield f"{at}.rdma", "VF RDMA devices need the VFs bound to mlx5_core"
