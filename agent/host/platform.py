"""Host facts around the adapters: kernel modules, GPUDirect peer memory and dma-buf,
IOMMU (registered units, the adapters' and GPUs' group types, the command line), ACS,
the RDMA subsystem's netns mode.

Reads /sys/module, /sys/kernel/mm/memory_peers, /sys/class/iommu, /sys/kernel/iommu_groups,
the PCI config space of the bridges between GPUs and NICs (decoded by the pure
agent.host.pciconfig) and, given a Procfs, the kernel command line and release (parsed by
agent.host.kernelparse). Failures go to the host-level error log; nothing here knows RDMA
ports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from agent.errors import ParseError, ReadErrorLog, ReadFailed
from agent.host import kernelparse, pciconfig, rdmanetns, topology
from agent.host.parse import parse_string
from agent.host.pci import PciFunction
from agent.host.procfs import Procfs
from agent.host.sysfs import ABSENT, Sysfs, read_value
from proto.inventory import IommuGroup, ModuleInfo, NvidiaModuleFlavour, Platform, RdmaNetnsMode

T = TypeVar("T")

# The RDMA stack (core, verbs, umad, CM, mlx5) and the GPU side of GPUDirect RDMA.
MODULES: Final = (
    "mlx5_core",
    "mlx5_ib",
    "ib_core",
    "ib_uverbs",
    "ib_umad",
    "rdma_ucm",
    "nvidia",
    "nvidia_peermem",
    "nv_peer_mem",
)
# nvidia_peermem ships with the NVIDIA driver (470+); nv_peer_mem is the legacy
# Mellanox module, which registers with MLNX_OFED's peer-memory API as nv_mem (nv_mem_nc
# for its non-contiguous variant): a directory under kernel/mm/memory_peers each.
PEERMEM_MODULES: Final = ("nvidia_peermem", "nv_peer_mem")
MEMORY_PEERS: Final = ("kernel/mm/memory_peers/nv_mem", "kernel/mm/memory_peers/nv_mem_nc")


def read_modules(sysfs: Sysfs, errors: ReadErrorLog) -> dict[str, ModuleInfo]:
    """The modules of `MODULES` that are loaded (present under module/).

    An in-tree module has no `version` (MODULE_VERSION) and often no `srcversion`: null,
    and normal, so not recorded. A module that is not loaded is not listed.
    """
    modules: dict[str, ModuleInfo] = {}
    for name in MODULES:
        try:
            d = sysfs.dir(f"module/{name}")
        except ReadFailed as failure:
            if failure.error != "ENOENT":
                errors.add(failure)
            continue
        modules[name] = ModuleInfo(
            version=read_value(d, "version", parse_string, errors, quiet=ABSENT),
            srcversion=read_value(d, "srcversion", parse_string, errors, quiet=ABSENT),
        )
    return modules


def has_peermem(sysfs: Sysfs, modules: dict[str, ModuleInfo]) -> bool:
    """A GPU peer-memory client is loaded: what GPUDirect RDMA needs on the host side."""
    if any(name in modules for name in PEERMEM_MODULES):
        return True
    return any(sysfs.exists(f"{peer}/version") for peer in MEMORY_PEERS)


def read_iommu(sysfs: Sysfs, errors: ReadErrorLog) -> bool | None:
    """Whether an IOMMU is registered: /sys/class/iommu has an entry (dmar0, ivhd0, ...).

    The class exists only in kernels built with IOMMU support; without it, no IOMMU.
    None (and a recorded error) when the class cannot be read.
    """
    try:
        return bool(sysfs.list_dir("class/iommu"))
    except ReadFailed as failure:
        if failure.error == "ENOENT":
            return False
        errors.add(failure)
        return None


def acs_enabled_bridges(
    gpus: Sequence[PciFunction], nics: Sequence[PciFunction], errors: ReadErrorLog
) -> tuple[str, ...]:
    """Bridges on a GPU<->NIC peer-to-peer path whose ACS control redirects or validates
    that traffic (SV, RR or CR set), which sends GPUDirect RDMA up to the root complex.

    Each bridge's config space is read once. Unreadable or truncated config is recorded
    and the bridge is not listed; a header-only read (the agent lacks CAP_SYS_ADMIN) is
    recorded as exactly that, so "no ACS seen" is never mistaken for "no ACS".
    """
    bridges: dict[str, PciFunction] = {}
    for gpu in gpus:
        for nic in nics:
            for address in topology.path_bridges(gpu.path, nic.path):
                bridges.setdefault(address, gpu if address in gpu.chain else nic)
    enabled: list[str] = []
    for address, below in sorted(bridges.items()):
        d = below.bridge_dir(address)
        if d is None:
            continue
        try:
            config = d.read_bytes("config", pciconfig.EXT_CONFIG_SPACE_SIZE)
            control = pciconfig.parse_acs_control(config)
        except ReadFailed as failure:
            errors.add(failure)
            continue
        except pciconfig.HeaderOnly as exc:
            errors.record(f"{d.path}/config", exc.reason)
            continue
        except ParseError as exc:
            errors.record(f"{d.path}/config", f"unparsable: {exc.reason}")
            continue
        if control is not None and pciconfig.acs_redirects(control):
            enabled.append(address)
    return tuple(enabled)


def read_iommu_groups(
    sysfs: Sysfs, functions: Sequence[PciFunction], errors: ReadErrorLog
) -> tuple[IommuGroup, ...]:
    """The group and its default domain type of each function with an `iommu_group`
    link (none without an IOMMU), in address order, each function once.

    The type is the real DMA mode: `iommu=pt` makes it identity, `intel_iommu=on` alone
    DMA or DMA-FQ, and it can be changed per group at run time. A kernel before 5.4 has
    no `type` file: null, not recorded.
    """
    found: dict[str, IommuGroup] = {}
    for fn in sorted(functions, key=lambda f: f.address):
        if fn.address in found:
            continue
        try:
            group = fn.dir.link_name("iommu_group")
        except ReadFailed as failure:
            if failure.error != "ENOENT":
                errors.add(failure)
            continue
        try:
            d = sysfs.dir(f"kernel/iommu_groups/{group}")
        except ReadFailed as failure:
            errors.add(failure)
            kind = None
        else:
            kind = read_value(d, "type", kernelparse.parse_group_type, errors, quiet=ABSENT)
        found[fn.address] = IommuGroup(pci_address=fn.address, group=group, type=kind)
    return tuple(found.values())


def read_nvidia_flavour(
    sysfs: Sysfs,
    modules: dict[str, ModuleInfo],
    procfs: Procfs | None,
    errors: ReadErrorLog,
) -> NvidiaModuleFlavour | None:
    """Open or proprietary nvidia.ko, None when it is not loaded or neither source tells.

    module/nvidia/taint first (always there for a loaded module, Linux 3.x+), then the
    driver's own /proc/driver/nvidia/version line.
    """
    if "nvidia" not in modules:
        return None
    try:
        d = sysfs.dir("module/nvidia")
    except ReadFailed as failure:
        errors.add(failure)
    else:
        flavour = read_value(d, "taint", kernelparse.parse_module_taint, errors, quiet=ABSENT)
        if flavour is not None:
            return flavour
    if procfs is None:
        return None
    return _proc_value(procfs, "driver/nvidia/version", kernelparse.parse_nvidia_version, errors)


def read_rdma_netns_mode(sysfs: Sysfs, errors: ReadErrorLog) -> RdmaNetnsMode | None:
    """ib_core's netns_mode parameter; None when ib_core is not loaded or predates the
    parameter (Linux 5.2): both are answers, not failures, so neither is recorded.

    Read from sysfs, not over RDMA netlink (what `rdma system show netns` asks): the mode
    is global, the agent reads nothing else over NETLINK_RDMA, and the file follows
    run-time changes.
    """
    parent, _, name = rdmanetns.PARAMETER.rpartition("/")
    try:
        d = sysfs.dir(parent)
    except ReadFailed as failure:
        if failure.error != "ENOENT":
            errors.add(failure)
        return None
    return read_value(d, name, rdmanetns.parse_netns_mode, errors, quiet=ABSENT)


def _proc_value(
    procfs: Procfs, rel: str, parser: Callable[[str], T], errors: ReadErrorLog
) -> T | None:
    try:
        text = procfs.read_text(rel)
    except ReadFailed as failure:
        errors.add(failure)
        return None
    try:
        return parser(text)
    except ParseError as exc:
        errors.record(f"/proc/{rel}", exc.short())
        return None


def read_platform(
    sysfs: Sysfs,
    modules: dict[str, ModuleInfo],
    gpus: Sequence[PciFunction],
    nics: Sequence[PciFunction],
    errors: ReadErrorLog,
    procfs: Procfs | None = None,
) -> Platform:
    """`procfs` None (a lab or captured tree, no --proc-root): the command line and
    kernel release stay null, since the agent's own kernel would misreport that tree."""
    cmdline = release = None
    if procfs is not None:
        cmdline = _proc_value(procfs, "cmdline", kernelparse.parse_cmdline_iommu, errors)
        release = _proc_value(procfs, "sys/kernel/osrelease", kernelparse.parse_osrelease, errors)
    return Platform(
        iommu=read_iommu(sysfs, errors),
        peermem=has_peermem(sysfs, modules),
        acs_enabled_bridges=acs_enabled_bridges(gpus, nics, errors),
        iommu_groups=read_iommu_groups(sysfs, [*nics, *gpus], errors),
        kernel_cmdline_iommu=cmdline,
        kernel_release=release,
        nvidia_kernel_module=read_nvidia_flavour(sysfs, modules, procfs, errors),
        rdma_netns_mode=read_rdma_netns_mode(sysfs, errors),
    )
