"""Render the RDMA side of a lab node: infiniband/<dev> with its ports, GIDs, counters
(counters/, counters_ext/, hw_counters/), the function's netdevs, its uverbs/umad char
devices and the node-wide rdma_cm misc device, in the formats of the kernel's
drivers/infiniband/core/{sysfs,uverbs_main,user_mad,ucma}.c and net-sysfs.c.

Also derives the RDMA devices of SR-IOV VFs (spec `sriov.rdma`). Called by render.py.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Protocol

from agent.lab.layout import Layout
from agent.lab.models import (
    ADAPTER_MODELS,
    COUNTERS_EXT,
    HW_COUNTERS,
    HW_COUNTERS_LIFESPAN_MS,
    LEGACY_COUNTERS,
    PMA_COUNTERS,
    ROCE_CONG_COUNTERS,
    hca_type_of,
)
from agent.lab.nodespec import Adapter, NodeSpec, Port, guid_text
from proto.ibta import PHYS_STATES, PORT_STATES

# Per-lane rate in tenths of Gb/s, as rate_show() in drivers/infiniband/core/sysfs.c has it.
IB_SPEED_TENTHS = {
    "SDR": 25, "DDR": 50, "QDR": 100, "FDR10": 100, "FDR": 140, "EDR": 250, "HDR": 500,
    "NDR": 1000, "XDR": 2000,
}  # fmt: skip
IB_GID_TYPE = "IB/RoCE v1"  # what the kernel prints for IB and RoCE v1 GIDs alike
ROCE_V2_GID_TYPE = "RoCE v2"
UVERBS_DEV = (231, 192)  # IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR
UMAD_DEV = (231, 0, 64)  # IB_UMAD_MAJOR, IB_UMAD_MINOR_BASE, issm minors start after 64 umads
# rdma_ucm's misc device: MISC_MAJOR 10, a dynamic minor (any free one; this is the lab's),
# mode 0666 and node name infiniband/rdma_cm, RDMA_USER_CM_ABI_VERSION 4.
RDMA_CM_DIR = "devices/virtual/misc/rdma_cm"
RDMA_CM_DEV = (10, 58)
RDMA_CM_ABI = 4


class Tree(Protocol):
    def write(self, rel: str, text: str) -> None: ...
    def mkdir(self, rel: str) -> None: ...
    def link(self, rel: str, target: str) -> None: ...


def rate_text(rate: str) -> str:
    """`4X NDR` -> `400 Gb/sec (4X NDR)` (the kernel's "%d%s Gb/sec (%dX%s)")."""
    width, speed = rate.split("X ")
    tenths = IB_SPEED_TENTHS[speed] * int(width)
    return f"{tenths // 10}{'.5' if tenths % 10 else ''} Gb/sec ({width}X {speed})"


def port_gids(adapter: Adapter, port: Port) -> list[tuple[str, str]]:
    """(gid, type) in table order. IB: the link-local GID of the port GUID. RoCE: every
    address once as v1 and once as v2, which is how roce_gid_mgmt fills the table."""
    if port.link_layer == "InfiniBand":
        gids = port.gids or ["fe80:0000:0000:0000:" + guid_text(adapter.node_guid)]
        return [(gid, IB_GID_TYPE) for gid in gids]
    if port.gids is not None:
        addrs = port.gids
    else:
        netdev = port.netdev_spec()
        mac = bytearray(bytes.fromhex(netdev_address(adapter, port).replace(":", "")))
        mac[0] ^= 0x02  # EUI-64 flips the universal/local bit and inserts ff:fe
        eui = bytes(mac[:3]) + b"\xff\xfe" + bytes(mac[3:])
        raw = [b"\xfe\x80" + bytes(6) + eui]
        mapped = bytes(10) + b"\xff\xff"  # ::ffff:a.b.c.d
        raw += [mapped + ipaddress.IPv4Address(ip).packed for ip in (netdev.ipv4 if netdev else [])]
        addrs = [":".join(r.hex()[i : i + 4] for i in range(0, 32, 4)) for r in raw]
    return [(gid, kind) for gid in addrs for kind in (IB_GID_TYPE, ROCE_V2_GID_TYPE)]


def netdev_address(adapter: Adapter, port: Port) -> str:
    """Spec address, else derived: mlx5 Ethernet MACs are the GUID minus its `03:00` middle;
    an IPoIB hardware address is 4 bytes of flags/QPN followed by the port GID."""
    netdev = port.netdev_spec()
    if netdev is not None and netdev.address is not None:
        return netdev.address
    guid = bytes.fromhex(guid_text(adapter.node_guid).replace(":", ""))
    if port.link_layer == "Ethernet":
        raw = guid[:3] + guid[5:]
    else:
        raw = bytes.fromhex("00001049fe80000000000000") + guid
    return ":".join(f"{b:02x}" for b in raw)


def counter_sets(adapter: Adapter, port: Port) -> dict[str, dict[str, int]]:
    """Directory -> {file: value} of one port. Modern kernels: counters/ (21 PMA files,
    64-bit data) + hw_counters/. `counters_ext: true` on the adapter: the pre-4.5 layout,
    32-bit counters/ (17 files) plus the 64-bit counters_ext/ (8 files)."""
    default = LEGACY_COUNTERS if adapter.counters_ext else PMA_COUNTERS
    names = port.counter_names if port.counter_names is not None else list(default)
    hw_names = port.hw_counter_names
    if hw_names is None:
        cong = ROCE_CONG_COUNTERS if port.link_layer == "Ethernet" else ()
        hw_names = [*HW_COUNTERS, *cong, "lifespan"]
    hw = dict.fromkeys(hw_names, 0)
    if "lifespan" in hw:  # not a counter: how long (ms) the driver caches hw_counters reads
        hw["lifespan"] = HW_COUNTERS_LIFESPAN_MS
    sets = {
        "counters": dict.fromkeys(names, 0) | port.counters,
        "hw_counters": hw | port.hw_counters,
    }
    if adapter.counters_ext:
        sets["counters_ext"] = dict.fromkeys(COUNTERS_EXT, 0) | port.counters_ext
    return {d: values for d, values in sets.items() if values}


def vf_adapters(spec: NodeSpec, layout: Layout) -> list[Adapter]:
    """RDMA devices of the VFs of PFs with `sriov.rdma`, named after the PFs' (the kernel
    probes VFs after their PFs): one port like the PF's first, a GUID derived from the
    PF's (byte 4 = VF number + 1, as an admin would assign), no netdev."""
    numbers = [int(m[1]) for a in spec.adapters if (m := re.fullmatch(r"mlx5_(\d+)", a.name))]
    next_number = max(numbers, default=len(spec.adapters) - 1) + 1
    out: list[Adapter] = []
    for pf in spec.adapters:
        if pf.sriov is None or not pf.sriov.rdma:
            continue
        port = pf.ports[0]
        vf_device = ADAPTER_MODELS[pf.model].vf_device
        for n, address in enumerate(layout.sriov[pf.address].vfs):
            guid = bytearray.fromhex(guid_text(pf.node_guid).replace(":", ""))
            guid[4] = (n + 1) & 0xFF
            vf_port = Port(
                link_layer=port.link_layer,
                state=port.state,
                phys_state=port.phys_state,
                rate=port.rate,
                lid=port.lid,
                sm_lid=port.sm_lid,
                gids=None if port.link_layer == "InfiniBand" else [],
            )
            out.append(
                Adapter(
                    name=f"mlx5_{next_number}",
                    model=pf.model,
                    address=address,
                    parent=pf.parent,
                    node_guid="0x" + guid.hex(),
                    sys_image_guid=pf.sys_image_guid or pf.node_guid,
                    fw_ver=pf.fw_ver,
                    board_id=pf.board_id,
                    hca_type=hca_type_of(vf_device),
                    device=vf_device,
                    class_code=pf.effective_class(),
                    ports=[vf_port],
                )
            )
            next_number += 1
    return out


def write_adapter(
    tree: Tree, node: str, adapter: Adapter, fn: str, index: int, ifindex: int, umad: int
) -> tuple[int, int]:
    """The RDMA device of one PCI function, its ports, netdevs and char devices; returns
    the next free ifindex and umad number."""
    ib = f"{fn}/infiniband/{adapter.name}"
    for name, value in (
        ("node_guid", guid_text(adapter.node_guid)),
        ("sys_image_guid", guid_text(adapter.sys_image_guid or adapter.node_guid)),
        ("node_type", adapter.node_type),
        ("node_desc", f"{node} {adapter.name}"),  # what rdma-ndd sets: "%h %d"
        ("fw_ver", adapter.fw_ver),
        ("board_id", adapter.board_id),
        ("hca_type", adapter.hca_type or ADAPTER_MODELS[adapter.model].hca_type),
        ("hw_rev", adapter.hw_rev),
    ):
        tree.write(f"{ib}/{name}", f"{value}\n")
    tree.link(f"{ib}/device", fn)
    tree.link(f"{ib}/subsystem", "class/infiniband")
    tree.link(f"class/infiniband/{adapter.name}", ib)
    for number, port in adapter.numbered_ports():
        _write_port(tree, adapter, f"{ib}/ports/{number}", port)
        netdev = port.netdev_spec()
        if netdev is not None:
            up = port.state == "ACTIVE"
            carrier = netdev.carrier if netdev.carrier is not None else up
            n = f"{fn}/net/{netdev.name}"
            for attr, value_ in (
                ("mtu", netdev.mtu or (1500 if port.link_layer == "Ethernet" else 4092)),
                ("operstate", netdev.operstate or ("up" if up else "down")),
                ("carrier", int(carrier)),
                ("address", netdev_address(adapter, port)),
                ("type", 1 if port.link_layer == "Ethernet" else 32),  # ARPHRD_ETHER/INFINIBAND
                ("dev_port", number - 1),
                ("dev_id", "0x0"),
                ("ifindex", netdev.ifindex or ifindex),
                ("iflink", netdev.ifindex or ifindex),
            ):
                tree.write(f"{n}/{attr}", f"{value_}\n")
            tree.link(f"{n}/device", fn)
            tree.link(f"{n}/subsystem", "class/net")
            tree.link(f"class/net/{netdev.name}", n)
            ifindex += 1
        for kind, minor in (("umad", UMAD_DEV[1] + umad), ("issm", UMAD_DEV[2] + umad)):
            d = f"{fn}/infiniband_mad/{kind}{umad}"
            tree.write(f"{d}/ibdev", f"{adapter.name}\n")
            tree.write(f"{d}/port", f"{number}\n")
            tree.write(f"{d}/dev", f"{UMAD_DEV[0]}:{minor}\n")
            tree.link(f"{d}/device", fn)
            tree.link(f"class/infiniband_mad/{kind}{umad}", d)
        umad += 1
    d = f"{fn}/infiniband_verbs/uverbs{index}"
    tree.write(f"{d}/ibdev", f"{adapter.name}\n")
    tree.write(f"{d}/abi_version", "1\n")
    tree.write(f"{d}/dev", f"{UVERBS_DEV[0]}:{UVERBS_DEV[1] + index}\n")
    tree.link(f"{d}/device", fn)
    tree.link(f"class/infiniband_verbs/uverbs{index}", d)
    return ifindex, umad


def write_rdma_cm(tree: Tree) -> None:
    """The node-wide /dev/infiniband/rdma_cm as sysfs shows it: a virtual misc device,
    linked from class/misc, with the uevent udev names the node from."""
    major, minor = RDMA_CM_DEV
    tree.write(f"{RDMA_CM_DIR}/dev", f"{major}:{minor}\n")
    tree.write(f"{RDMA_CM_DIR}/abi_version", f"{RDMA_CM_ABI}\n")
    uevent = f"MAJOR={major}\nMINOR={minor}\nDEVNAME=infiniband/rdma_cm\nDEVMODE=0666\n"
    tree.write(f"{RDMA_CM_DIR}/uevent", uevent)
    tree.link(f"{RDMA_CM_DIR}/subsystem", "class/misc")
    tree.link("class/misc/rdma_cm", RDMA_CM_DIR)


def _write_port(tree: Tree, adapter: Adapter, p: str, port: Port) -> None:
    phys = port.effective_phys_state()
    for name, value in (
        ("state", f"{PORT_STATES[port.state]}: {port.state}"),
        ("phys_state", f"{PHYS_STATES[phys]}: {phys}"),
        ("rate", rate_text(port.rate)),
        ("link_layer", port.link_layer),
        ("lid", f"0x{port.lid:x}"),
        ("sm_lid", f"0x{port.sm_lid:x}"),
        ("lid_mask_count", port.lid_mask_count),
        ("sm_sl", port.sm_sl),
        ("cap_mask", port.effective_cap_mask()),
    ):
        tree.write(f"{p}/{name}", f"{value}\n")
    netdev = port.netdev_spec()
    for i, (gid, kind) in enumerate(port_gids(adapter, port)):
        tree.write(f"{p}/gids/{i}", f"{gid}\n")
        tree.write(f"{p}/gid_attrs/types/{i}", f"{kind}\n")
        # IB GIDs have no netdev: the kernel's read fails (EINVAL), so we leave it absent.
        if port.link_layer == "Ethernet" and netdev is not None:
            tree.write(f"{p}/gid_attrs/ndevs/{i}", f"{netdev.name}\n")
    for i, pkey in enumerate(port.pkeys):
        tree.write(f"{p}/pkeys/{i}", f"{pkey}\n")
    tree.mkdir(f"{p}/gids")
    tree.mkdir(f"{p}/gid_attrs/types")
    tree.mkdir(f"{p}/gid_attrs/ndevs")
    for directory, values in counter_sets(adapter, port).items():
        for name, value in sorted(values.items()):
            tree.write(f"{p}/{directory}/{name}", f"{value}\n")
