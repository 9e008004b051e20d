"""Render a lab node spec as a sysfs tree, in the kernel's layout and file formats.

Owns where things live (devices/pci*/..., bus/pci, class/{infiniband,net,...}, module,
devices/system/node), what each file holds (pci-sysfs.c, infiniband/core/sysfs.c,
net-sysfs.c formats) and the kernel's relative symlinks. Writes only below the root it is
given and never reads the host's /sys. Deterministic: same spec, same tree.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
from pathlib import Path

from agent.lab.spec import (
    ADAPTER_MODELS,
    GPU_MODELS,
    HW_COUNTERS,
    HW_COUNTERS_LIFESPAN_MS,
    PHYS_STATES,
    PMA_COUNTERS,
    PORT_STATES,
    ROCE_CONG_COUNTERS,
    ROOT_PORT_IDS,
    Adapter,
    Bridge,
    Link,
    NodeSpec,
    Port,
    bridge_of,
    guid_text,
    parse_cpulist,
)

MARKER = ".nicfleet-lab.json"  # at the tree root; real sysfs has no such file
PCI_SPEEDS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0"}  # GT/s per gen
# Per-lane rate in tenths of Gb/s, as rate_show() in drivers/infiniband/core/sysfs.c has it.
IB_SPEED_TENTHS = {
    "SDR": 25, "DDR": 50, "QDR": 100, "FDR10": 100, "FDR": 140, "EDR": 250, "HDR": 500,
    "NDR": 1000, "XDR": 2000,
}  # fmt: skip
IB_GID_TYPE = "IB/RoCE v1"  # what the kernel prints for IB and RoCE v1 GIDs alike
ROCE_V2_GID_TYPE = "RoCE v2"
UVERBS_DEV = (231, 192)  # IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR
UMAD_DEV = (231, 0, 64)  # IB_UMAD_MAJOR, IB_UMAD_MINOR_BASE, issm minors start after 64 umads


PciIds = tuple[str, str, str, str, str]  # vendor, device, subsystem vendor/device, class


class RenderError(Exception):
    """The tree cannot be written where asked (non-empty directory, not a lab tree)."""


def render(spec: NodeSpec, root: Path, *, overwrite: bool = False) -> None:
    """Write the sysfs tree of `spec` below `root` (created if missing)."""
    root = Path(root)
    _prepare(root, overwrite)
    tree = _Tree(root)
    cpus = {numa: parse_cpulist(text) for numa, text in sorted(spec.numa_nodes.items())}
    all_cpus = sorted(c for group in cpus.values() for c in group)
    nbits = spec.possible_cpus or (all_cpus[-1] + 1 if all_cpus else 1)
    dirs, numas = _layout(spec)

    def pci(address: str, ids: PciIds, link: Link, driver: str) -> None:
        numa = numas[address]
        local = cpus.get(numa, all_cpus) if numa is not None else all_cpus
        _write_pci_function(tree, dirs[address], address, ids, link, driver)
        tree.write(f"{dirs[address]}/numa_node", f"{-1 if numa is None else numa}\n")
        tree.write(f"{dirs[address]}/local_cpulist", cpulist_text(local) + "\n")
        tree.write(f"{dirs[address]}/local_cpus", cpumask_text(local, nbits) + "\n")

    for hb in spec.host_bridges:
        for rp in map(bridge_of, hb.root_ports):
            pci(rp.address, _bridge_ids(rp, *ROOT_PORT_IDS), rp.link, "pcieport")
    for sw in spec.switches:
        for port in [bridge_of(sw.upstream), *map(bridge_of, sw.downstream)]:
            pci(port.address, _bridge_ids(port, sw.vendor, sw.device), port.link, "pcieport")
    for gpu in spec.gpus:
        device, link = GPU_MODELS[gpu.model]
        ids: PciIds = ("0x10de", gpu.device or device, gpu.subsystem_vendor, gpu.subsystem_device,
                       gpu.class_code)  # fmt: skip
        pci(gpu.address, ids, gpu.link or link, gpu.driver)
    ifindex, umad = 2, 0  # ifindex 1 is lo
    for index, adapter in enumerate(spec.adapters):
        model = ADAPTER_MODELS[adapter.model]
        ids = ("0x15b3", adapter.device or model.device, adapter.subsystem_vendor,
               adapter.subsystem_device, adapter.effective_class())  # fmt: skip
        pci(adapter.address, ids, adapter.link or model.link, adapter.driver)
        fn = dirs[adapter.address]
        ifindex, umad = _write_adapter(tree, spec, adapter, fn, index, ifindex, umad)
    for name, version in sorted(spec.modules.items()):
        tree.write(f"module/{name}/initstate", "live\n")
        if version is not None:
            tree.write(f"module/{name}/version", f"{version}\n")
    _write_system(tree, cpus, nbits)
    tree.write(MARKER, json.dumps({"node": spec.name, "format": 1}) + "\n")


def rate_text(rate: str) -> str:
    """`4X NDR` -> `400 Gb/sec (4X NDR)` (the kernel's "%d%s Gb/sec (%dX%s)")."""
    width, speed = rate.split("X ")
    tenths = IB_SPEED_TENTHS[speed] * int(width)
    return f"{tenths // 10}{'.5' if tenths % 10 else ''} Gb/sec ({width}X {speed})"


def cpulist_text(cpus: list[int]) -> str:
    """The kernel's "%*pbl": sorted CPUs folded into ranges, `0-3,8,10-11`."""
    parts: list[tuple[int, int]] = []
    for cpu in sorted(set(cpus)):
        if parts and parts[-1][1] == cpu - 1:
            parts[-1] = (parts[-1][0], cpu)
        else:
            parts.append((cpu, cpu))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def cpumask_text(cpus: list[int], nbits: int) -> str:
    """The kernel's "%*pb": 32-bit hex words, most significant first, comma separated;
    the leading word only has as many digits as the remaining bits need."""
    value = sum(1 << cpu for cpu in cpus)
    words = (nbits + 31) // 32
    out = []
    for i in reversed(range(words)):
        digits = 8 if i < words - 1 or nbits % 32 == 0 else (nbits % 32 + 3) // 4
        out.append(f"{(value >> (32 * i)) & 0xFFFFFFFF:0{digits}x}")
    return ",".join(out)


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


class _Tree:
    """Writes files and kernel-style relative symlinks below one root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: set[str] = set()

    def _parent(self, rel: str) -> Path:
        parent = os.path.dirname(rel)
        if parent not in self._made:
            (self.root / parent).mkdir(parents=True, exist_ok=True)
            self._made.add(parent)
        return self.root / rel

    def write(self, rel: str, text: str) -> None:
        self._parent(rel).write_text(text)

    def mkdir(self, rel: str) -> None:
        (self.root / rel).mkdir(parents=True, exist_ok=True)

    def link(self, rel: str, target: str) -> None:
        # sysfs links climb to the deepest directory above the *target's parent* and descend
        # from there, so a link to an ancestor reads ../../../0000:19:00.0, never "../..".
        link_dir = os.path.dirname(rel)
        up = os.path.relpath(os.path.dirname(target) or ".", link_dir or ".")
        os.symlink(os.path.normpath(os.path.join(up, os.path.basename(target))), self._parent(rel))


def _prepare(root: Path, overwrite: bool) -> None:
    if root.exists() and not root.is_dir():
        raise RenderError(f"{root}: exists and is not a directory")
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise RenderError(f"{root}: directory is not empty (pass overwrite to replace it)")
        if not (root / MARKER).is_file():
            # Never wipe a directory we did not render: --overwrite on a typo must be harmless.
            raise RenderError(f"{root}: not empty and not a lab tree (no {MARKER}); refusing")
        for child in root.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    root.mkdir(parents=True, exist_ok=True)


def _layout(spec: NodeSpec) -> tuple[dict[str, str], dict[str, int | None]]:
    """Directory under the root and NUMA node of every PCI function, from the parent chain."""
    parent: dict[str, str] = {}
    dirs: dict[str, str] = {hb.name: f"devices/{hb.name}" for hb in spec.host_bridges}
    numas: dict[str, int | None] = {hb.name: hb.numa_node for hb in spec.host_bridges}
    for hb in spec.host_bridges:
        parent.update((bridge_of(rp).address, hb.name) for rp in hb.root_ports)
    for sw in spec.switches:
        up = bridge_of(sw.upstream).address
        parent[up] = sw.parent
        parent.update((bridge_of(down).address, up) for down in sw.downstream)
    parent.update((gpu.address, gpu.parent) for gpu in spec.gpus)
    parent.update((adapter.address, adapter.parent) for adapter in spec.adapters)

    def place(address: str) -> None:
        if address not in dirs:
            place(parent[address])
            dirs[address] = f"{dirs[parent[address]]}/{address}"
            numas[address] = numas[parent[address]]

    for address in parent:
        place(address)
    return dirs, numas


def _bridge_ids(bridge: Bridge, vendor: str, device: str) -> PciIds:
    vendor, device = bridge.vendor or vendor, bridge.device or device
    return vendor, device, vendor, device, "0x060400"


def _write_pci_function(
    tree: _Tree, d: str, address: str, ids: PciIds, link: Link, driver: str
) -> None:
    names = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class")
    for name, value in zip(names, ids, strict=True):
        tree.write(f"{d}/{name}", f"{value}\n")
    tree.write(f"{d}/current_link_speed", f"{PCI_SPEEDS[link.gen]} GT/s PCIe\n")
    tree.write(f"{d}/current_link_width", f"{link.width}\n")
    tree.write(f"{d}/max_link_speed", f"{PCI_SPEEDS[link.max_gen or link.gen]} GT/s PCIe\n")
    tree.write(f"{d}/max_link_width", f"{link.max_width or link.width}\n")
    tree.link(f"{d}/driver", f"bus/pci/drivers/{driver}")
    tree.link(f"{d}/subsystem", "bus/pci")
    tree.link(f"bus/pci/drivers/{driver}/{address}", d)
    tree.link(f"bus/pci/devices/{address}", d)


def _write_adapter(
    tree: _Tree, spec: NodeSpec, adapter: Adapter, fn: str, index: int, ifindex: int, umad: int
) -> tuple[int, int]:
    """The RDMA device of one PCI function, its ports, netdevs and char devices; returns
    the next free ifindex and umad number."""
    ib = f"{fn}/infiniband/{adapter.name}"
    for name, value in (
        ("node_guid", guid_text(adapter.node_guid)),
        ("sys_image_guid", guid_text(adapter.sys_image_guid or adapter.node_guid)),
        ("node_type", adapter.node_type),
        ("node_desc", f"{spec.name} {adapter.name}"),  # what rdma-ndd sets: "%h %d"
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


def _write_port(tree: _Tree, adapter: Adapter, p: str, port: Port) -> None:
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
    tree.mkdir(f"{p}/gid_attrs/ndevs")
    counters = dict.fromkeys(PMA_COUNTERS, 0) | port.counters
    for name, value in sorted(counters.items()):
        tree.write(f"{p}/counters/{name}", f"{value}\n")
    hw = dict.fromkeys(HW_COUNTERS, 0)
    if port.link_layer == "Ethernet":
        hw |= dict.fromkeys(ROCE_CONG_COUNTERS, 0)
    hw |= {"lifespan": HW_COUNTERS_LIFESPAN_MS} | port.hw_counters
    for name, value in sorted(hw.items()):
        tree.write(f"{p}/hw_counters/{name}", f"{value}\n")


def _write_system(tree: _Tree, cpus: dict[int, list[int]], nbits: int) -> None:
    for numa, group in cpus.items():
        tree.write(f"devices/system/node/node{numa}/cpulist", cpulist_text(group) + "\n")
        tree.write(f"devices/system/node/node{numa}/cpumap", cpumask_text(group, nbits) + "\n")
    nodes = cpulist_text(list(cpus))
    tree.write("devices/system/node/online", f"{nodes}\n")
    tree.write("devices/system/node/possible", f"{nodes}\n")
    tree.write("devices/system/cpu/possible", f"0-{nbits - 1}\n" if nbits > 1 else "0\n")
    online = [c for group in cpus.values() for c in group]
    tree.write("devices/system/cpu/online", cpulist_text(online) + "\n")
    for cls, abi in (("infiniband_verbs", 6), ("infiniband_mad", 5)):
        tree.write(f"class/{cls}/abi_version", f"{abi}\n")
    tree.mkdir("class/net")
