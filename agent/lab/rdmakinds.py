"""Render the RDMA device kinds beyond PFs and VFs: ConnectX-8 Data Direct functions
(PCI 15b3:2100, placed like adapters, no RDMA device), PCI VPD images, mlx5 sub-functions
(auxiliary devices mlx5_core.sf.<n> below their PF, each with an RDMA device) and RoCE LAG
bonds (mlx5_bond_<n> on the first member PF, a bond netdev over the members' netdevs),
in the layouts of the kernel's mlx5 SF, bonding and pci-sysfs code. Called by render.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from agent.lab.layout import Function, Layout, to_link
from agent.lab.models import ADAPTER_MODELS, MELLANOX
from agent.lab.nodespec import Adapter, Bond, NodeSpec, Port, Vpd
from agent.lab.rdma import Tree, netdev_address, vf_adapters, write_adapter

DATA_DIRECT_IDS = (MELLANOX, "0x2100", MELLANOX, "0x0000", "0x020000")
_VIRTUAL_NET = "devices/virtual/net"


class BinaryTree(Tree, Protocol):
    def write_bytes(self, rel: str, data: bytes) -> None: ...


def with_data_direct(spec: NodeSpec, layout: Layout) -> Layout:
    """The layout plus the Data Direct functions, placed below their parents like any
    endpoint (kind "adapter": same config space style and IOMMU grouping)."""
    if not spec.data_direct:
        return layout
    functions, dirs, numas = dict(layout.functions), dict(layout.dirs), dict(layout.numas)
    link = to_link(ADAPTER_MODELS["ConnectX-8"].link)
    for dd in spec.data_direct:
        functions[dd.address] = Function(
            dd.address, "adapter", dd.parent, DATA_DIRECT_IDS, dd.link or link, dd.driver
        )
        dirs[dd.address] = f"{dirs[dd.parent]}/{dd.address}"
        numas[dd.address] = numas[dd.parent]
    return Layout(functions, dirs, numas, layout.sriov)


def rdma_adapters(spec: NodeSpec, adapters: Sequence[Adapter]) -> list[Adapter]:
    """The adapters that get an RDMA device: a bond's first member under the bond's name,
    its other members none (mlx5_lag unregisters their devices)."""
    first = {b.members[0]: b for b in spec.bonds}
    others = {m for b in spec.bonds for m in b.members[1:]}
    out = []
    for adapter in adapters:
        if adapter.address in others:
            continue
        bond = first.get(adapter.address)
        out.append(adapter if bond is None else msgspec.structs.replace(adapter, name=bond.name))
    return out


def rdma_devices(spec: NodeSpec, layout: Layout) -> list[Adapter]:
    """Every RDMA device the tree will have, as adapters (PFs, bonds, VFs, then SFs)."""
    devices = rdma_adapters(spec, [*spec.adapters, *vf_adapters(spec, layout)])
    for adapter in spec.adapters:
        for n, sf in enumerate(adapter.sub_functions):
            devices.append(_sf_adapter(adapter, sf.name, sf.netdev, n))
    return devices


def write_kinds(
    tree: BinaryTree, spec: NodeSpec, layout: Layout, index: int, ifindex: int, umad: int
) -> tuple[int, int]:
    """VPD files, sub-functions and bonds; `index` is the next uverbs number. Returns the
    next free ifindex and umad number."""
    for adapter in spec.adapters:
        if adapter.vpd is not None:
            write_vpd(tree, layout.dirs[adapter.address], adapter.vpd)
    for dd in spec.data_direct:
        write_vpd(tree, layout.dirs[dd.address], dd.vpd)
    for adapter in spec.adapters:
        fn = layout.dirs[adapter.address]
        for n, sf in enumerate(adapter.sub_functions):
            aux = f"{fn}/mlx5_core.sf.{n + 2}"  # the PF's own aux devices take the first ids
            tree.write(f"{aux}/sfnum", f"{sf.sfnum}\n")
            tree.link(f"{aux}/subsystem", "bus/auxiliary")
            tree.link(f"bus/auxiliary/devices/mlx5_core.sf.{n + 2}", aux)
            ifindex, umad = write_adapter(
                tree, spec.name, _sf_adapter(adapter, sf.name, sf.netdev, n), aux, index,
                ifindex, umad,
            )  # fmt: skip
            index += 1
    for bond in spec.bonds:
        ifindex = _write_bond(tree, spec, layout, bond, ifindex)
    return ifindex, umad


def write_vpd(tree: BinaryTree, fn: str, data: Vpd) -> None:
    keywords = {"PN": data.part_number, "SN": data.serial}
    if data.vuid is not None:
        keywords["VU"] = data.vuid
    tree.write_bytes(f"{fn}/vpd", vpd_image(data.identifier, keywords))


def _sf_adapter(pf: Adapter, name: str, netdev: str | None, n: int) -> Adapter:
    guid = bytearray.fromhex(pf.node_guid.removeprefix("0x").replace(":", ""))
    guid[3] = (0x80 + n) & 0xFF  # an SF's GUID as the PF's with a distinct byte
    port = pf.ports[0]
    sf_port = Port(
        link_layer=port.link_layer,
        state=port.state,
        phys_state=port.phys_state,
        rate=port.rate,
        netdev=netdev,
        gids=None if port.link_layer == "InfiniBand" or netdev is not None else [],
    )
    return msgspec.structs.replace(
        pf,
        name=name,
        node_guid="0x" + guid.hex(),
        sys_image_guid=pf.sys_image_guid or pf.node_guid,
        ports=[sf_port],
        sub_functions=[],
        vpd=None,
    )


def _write_bond(tree: Tree, spec: NodeSpec, layout: Layout, bond: Bond, ifindex: int) -> int:
    """The bond netdev (devices/virtual/net/<bond>) with lower_<if> links to the members'
    netdevs, each member's `master` link back; members after the first get their netdev
    written here, since they have no RDMA device to carry it."""
    master = f"{_VIRTUAL_NET}/{bond.netdev}"
    by_address = {a.address: a for a in spec.adapters}
    first = by_address[bond.members[0]]
    for name, value in (
        ("mtu", 1500),
        ("operstate", "up"),
        ("carrier", 1),
        ("type", 1),
        ("address", netdev_address(first, first.ports[0])),
        ("ifindex", ifindex),
        ("iflink", ifindex),
    ):
        tree.write(f"{master}/{name}", f"{value}\n")
    tree.mkdir(f"{master}/bonding")
    tree.write(f"{master}/bonding/mode", "802.3ad 4\n")
    tree.link(f"{master}/subsystem", "class/net")
    tree.link(f"class/net/{bond.netdev}", master)
    ifindex += 1
    slaves = []
    for i, address in enumerate(bond.members):
        adapter = by_address[address]
        netdev = adapter.ports[0].netdev_spec()
        if netdev is None:
            continue
        nd = f"{layout.dirs[address]}/net/{netdev.name}"
        if i > 0:
            for name, value in (
                ("mtu", netdev.mtu or 1500),
                ("operstate", "up"),
                ("carrier", 1),
                ("type", 1),
                ("address", netdev_address(adapter, adapter.ports[0])),
                ("dev_port", 0),
                ("ifindex", netdev.ifindex or ifindex),
                ("iflink", netdev.ifindex or ifindex),
            ):
                tree.write(f"{nd}/{name}", f"{value}\n")
            tree.link(f"{nd}/device", layout.dirs[address])
            tree.link(f"{nd}/subsystem", "class/net")
            tree.link(f"class/net/{netdev.name}", nd)
            ifindex += 1
        tree.link(f"{nd}/master", master)
        tree.link(f"{master}/lower_{netdev.name}", nd)
        slaves.append(netdev.name)
    tree.write(f"{master}/bonding/slaves", " ".join(slaves) + "\n")
    return ifindex


def vpd_image(identifier: str, keywords: dict[str, str]) -> bytes:
    """A well-formed VPD image (identifier string, VPD-R with `keywords` and RV, end):
    what the lab renders and tests feed the parser."""
    ident = identifier.encode()
    body = b"".join(k.encode() + bytes([len(v)]) + v.encode() for k, v in keywords.items())
    # PCI VPD resource tags: 0x82 identifier string, 0x90 VPD-R, 0x78 end.
    image = bytes([0x82]) + len(ident).to_bytes(2, "little") + ident
    rv_body = body + b"RV\x01"
    ro = bytes([0x90]) + (len(rv_body) + 1).to_bytes(2, "little") + rv_body
    partial = image + ro
    rv = (-sum(partial)) & 0xFF  # every byte from the start through RV sums to zero
    return partial + bytes([rv, 0x78])
