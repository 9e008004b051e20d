"""Render a lab node spec as a sysfs tree in the kernel's layout and formats: devices/pci*,
bus/pci, class/*, module, kernel/iommu_groups, devices/system; PCI function files (pci-sysfs.c,
the binary `config`, SR-IOV) and relative symlinks (rdma.py writes the RDMA devices).
Writes only below the root it is given, never reads the host's /sys. Deterministic.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from msgspec import UNSET

from agent.errors import AgentError
from agent.lab import pciconfig, rdmakinds
from agent.lab.layout import Function, Layout, buses, iommu_groups, multifunction, plan
from agent.lab.models import srcversion_of
from agent.lab.nodespec import NodeSpec, module_of, parse_cpulist
from agent.lab.procfs import render_proc
from agent.lab.rdma import port_gids, rate_text, vf_adapters, write_adapter, write_rdma_cm

__all__ = [
    "MARKER",
    "RenderError",
    "cpulist_text",
    "cpumask_text",
    "port_gids",
    "rate_text",
    "render",
]

MARKER = ".nicfleet-lab.json"  # at the tree root; real sysfs has no such file
PCI_SPEEDS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0"}  # GT/s per gen
PCIE_PORT_TYPES = {
    "root_port": pciconfig.PCIE_ROOT_PORT,
    "upstream": pciconfig.PCIE_UPSTREAM,
    "downstream": pciconfig.PCIE_DOWNSTREAM,
}
_STYLES: dict[str, pciconfig.Style] = {"gpu": "gpu", "adapter": "nic", "vf": "vf"}


class RenderError(AgentError):
    """The tree cannot be written where asked (non-empty directory, not a lab tree)."""


def render(spec: NodeSpec, root: Path, *, overwrite: bool = False) -> None:
    """Write the sysfs tree of `spec` below `root` (created if missing)."""
    root = Path(root)
    _prepare(root, overwrite)
    tree = _Tree(root)
    cpus = {numa: parse_cpulist(text) for numa, text in sorted(spec.numa_nodes.items())}
    all_cpus = sorted(c for group in cpus.values() for c in group)
    nbits = spec.possible_cpus or (all_cpus[-1] + 1 if all_cpus else 1)
    layout = rdmakinds.with_data_direct(spec, plan(spec))
    for address, fn in layout.functions.items():
        d = layout.dirs[address]
        _write_pci_function(tree, layout, fn)
        numa = layout.numas[address]
        local = cpus.get(numa, all_cpus) if numa is not None else all_cpus
        tree.write(f"{d}/numa_node", f"{-1 if numa is None else numa}\n")
        tree.write(f"{d}/local_cpulist", cpulist_text(local) + "\n")
        tree.write(f"{d}/local_cpus", cpumask_text(local, nbits) + "\n")
    ifindex, umad = 2, 0  # ifindex 1 is lo
    rdma_adapters = rdmakinds.rdma_adapters(spec, [*spec.adapters, *vf_adapters(spec, layout)])
    for index, adapter in enumerate(rdma_adapters):
        fn_dir = layout.dirs[adapter.address]
        ifindex, umad = write_adapter(tree, spec.name, adapter, fn_dir, index, ifindex, umad)
    ifindex, umad = rdmakinds.write_kinds(tree, spec, layout, len(rdma_adapters), ifindex, umad)
    write_rdma_cm(tree)
    for name, value in sorted(spec.modules.items()):
        module = module_of(value)
        tree.write(f"module/{name}/initstate", "live\n")
        if module.version is not None:
            tree.write(f"module/{name}/version", f"{module.version}\n")
        srcversion = module.srcversion
        if srcversion is UNSET:  # distro kernels build with CONFIG_MODULE_SRCVERSION_ALL
            srcversion = srcversion_of(name, module.version)
        if isinstance(srcversion, str):
            tree.write(f"module/{name}/srcversion", f"{srcversion}\n")
        tree.write(f"module/{name}/taint", f"{module_taint(spec, name, module.version)}\n")
    if "ib_core" in spec.modules and spec.rdma_netns_mode is not None:
        tree.write("module/ib_core/parameters/netns_mode", netns_mode_text(spec.rdma_netns_mode))
    _write_iommu(tree, spec, layout)
    _write_system(tree, cpus, nbits)
    render_proc(spec, root)  # proc/ beside the sysfs files: the kernel facts
    tree.write(MARKER, json.dumps({"node": spec.name, "format": 1}) + "\n")


def module_taint(spec: NodeSpec, name: str, version: str | None) -> str:
    """module/<name>/taint as the kernel writes it: P for a non-GPL licence (the
    proprietary nvidia.ko, licensed "NVIDIA"; the open one is "Dual MIT/GPL", as is
    nvidia_peermem in both), O out of tree (here: anything with a MODULE_VERSION, the
    NVIDIA and MLNX_OFED modules), nothing for an in-tree module."""
    if name == "nvidia" and spec.nvidia_kernel_module == "proprietary":
        return "PO"
    return "O" if version is not None or name.startswith("nvidia") else ""


def netns_mode_text(mode: str) -> str:
    """ib_core's netns_mode as param_get_bool writes it: Y (shared) or N (exclusive)."""
    return "Y\n" if mode == "shared" else "N\n"


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


def config_of(layout: Layout, fn: Function) -> pciconfig.Config:
    """The config-space registers of one planned function."""
    vendor, device, sub_vendor, sub_device, class_code = (int(x, 16) for x in fn.ids)
    style = _STYLES.get(fn.kind, "bridge")
    link = None
    if fn.link is not None:
        max_gen, max_width = fn.link.max_gen or fn.link.gen, fn.link.max_width or fn.link.width
        link = (fn.link.gen, fn.link.width, max_gen, max_width)
    sriov, ari_next = None, 0
    if fn.kind == "adapter":
        slot = sorted(
            a
            for a, f in layout.functions.items()
            if f.kind == "adapter" and a[:-2] == fn.address[:-2]
        )
        later = slot[slot.index(fn.address) + 1 :]
        ari_next = int(later[0][-1]) if later else 0
        vfs = layout.sriov.get(fn.address)
        if vfs is not None:
            sriov = pciconfig.Sriov(
                total=len(vfs.devfns),
                num=len(vfs.vfs),
                offset=vfs.offset,
                stride=vfs.stride,
                vf_device=int(vfs.vf_device, 16),
                function=int(fn.address[-1]),
            )
    return pciconfig.Config(
        style=style,
        vendor=vendor,
        device=device,
        subsystem_vendor=sub_vendor,
        subsystem_device=sub_device,
        class_code=class_code,
        port_type=PCIE_PORT_TYPES.get(fn.kind, pciconfig.PCIE_ENDPOINT),
        link=link,
        multifunction=multifunction(layout, fn.address),
        buses=buses(layout, fn.address) if style == "bridge" else (0, 0, 0),
        acs=fn.acs,
        sriov=sriov,
        ari_next=ari_next,
    )


class _Tree:
    """Writes files and kernel-style relative symlinks below one root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: set[str] = set()

    def _parent(self, rel: str) -> str:
        parent = os.path.dirname(rel)
        if parent not in self._made:
            os.makedirs(os.path.join(self.root, parent), exist_ok=True)
            self._made.add(parent)
        return os.path.join(self.root, rel)

    def write(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def write_bytes(self, rel: str, data: bytes) -> None:
        fd = os.open(self._parent(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def mkdir(self, rel: str) -> None:
        if rel not in self._made:
            os.makedirs(os.path.join(self.root, rel), exist_ok=True)
            self._made.add(rel)

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


def _write_pci_function(tree: _Tree, layout: Layout, fn: Function) -> None:
    d, address = layout.dirs[fn.address], fn.address
    names = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class")
    for name, value in zip(names, fn.ids, strict=True):
        tree.write(f"{d}/{name}", f"{value}\n")
    tree.write(f"{d}/revision", "0x00\n")
    tree.write_bytes(f"{d}/config", pciconfig.build(config_of(layout, fn)))
    if fn.link is None:  # a VF: its link registers are reserved, the kernel reads zeros
        speed = max_speed = "Unknown"
        width = max_width = 0
    else:
        speed = f"{PCI_SPEEDS[fn.link.gen]} GT/s PCIe"
        max_speed = f"{PCI_SPEEDS[fn.link.max_gen or fn.link.gen]} GT/s PCIe"
        width, max_width = fn.link.width, fn.link.max_width or fn.link.width
    tree.write(f"{d}/current_link_speed", f"{speed}\n")
    tree.write(f"{d}/current_link_width", f"{width}\n")
    tree.write(f"{d}/max_link_speed", f"{max_speed}\n")
    tree.write(f"{d}/max_link_width", f"{max_width}\n")
    if fn.driver is not None:
        tree.link(f"{d}/driver", f"bus/pci/drivers/{fn.driver}")
        tree.link(f"bus/pci/drivers/{fn.driver}/{address}", d)
    tree.link(f"{d}/subsystem", "bus/pci")
    tree.link(f"bus/pci/devices/{address}", d)
    if fn.pf is not None:
        tree.link(f"{d}/physfn", layout.dirs[fn.pf])
    sriov = layout.sriov.get(address)
    if sriov is not None:  # pci/iov.c: decimal counts, the VF device id as bare hex
        for name, value in (
            ("sriov_totalvfs", str(len(sriov.devfns))),
            ("sriov_numvfs", str(len(sriov.vfs))),
            ("sriov_offset", str(sriov.offset)),
            ("sriov_stride", str(sriov.stride)),
            ("sriov_vf_device", f"{int(sriov.vf_device, 16):x}"),
            ("sriov_drivers_autoprobe", str(int(sriov.driver is not None))),
        ):
            tree.write(f"{d}/{name}", f"{value}\n")
        for n, vf in enumerate(sriov.vfs):
            tree.link(f"{d}/virtfn{n}", layout.dirs[vf])


def _write_iommu(tree: _Tree, spec: NodeSpec, layout: Layout) -> None:
    """Intel VT-d: one DMAR unit per host bridge (devices/virtual/iommu/dmarN, linked from
    class/iommu), each function's `iommu` and `iommu_group` links, kernel/iommu_groups/N.
    Without an IOMMU both class/iommu and kernel/iommu_groups exist and are empty."""
    tree.mkdir("class/iommu")
    tree.mkdir("kernel/iommu_groups")
    if not spec.iommu:
        return
    units = {hb.name: f"devices/virtual/iommu/dmar{i}" for i, hb in enumerate(spec.host_bridges)}
    for unit in units.values():
        for name, value in (("version", "1:0"), ("cap", "d2008c40660462"), ("ecap", "f050da")):
            tree.write(f"{unit}/intel-iommu/{name}", f"{value}\n")
        tree.link(f"{unit}/subsystem", "class/iommu")
        tree.link(f"class/iommu/{os.path.basename(unit)}", unit)
    for address, group in iommu_groups(layout).items():
        d = layout.dirs[address]
        unit = units[d.split("/")[1]]
        tree.link(f"{d}/iommu", unit)
        tree.link(f"{unit}/devices/{address}", d)
        tree.link(f"{d}/iommu_group", f"kernel/iommu_groups/{group}")
        tree.link(f"kernel/iommu_groups/{group}/devices/{address}", d)
        tree.write(f"kernel/iommu_groups/{group}/type", f"{spec.iommu_group_type}\n")


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
