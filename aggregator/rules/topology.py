"""Topology rules: GPU<->NIC placement, PCIe link training, ACS, peer memory, IOMMU, NUMA.

Pure functions of the fleet view (no I/O, no clock); each returns the findings of one
rule id. Evidence carries the values read from the snapshot.
"""

from __future__ import annotations

from typing import Final, Literal

from aggregator.rules.descriptor import SNAPSHOT, Rule, RuleInput
from aggregator.rules.finding import Finding
from aggregator.rules.fleetfacts import (
    DEFAULT_MAX_RELATION,
    RELATION_ORDER,
    expectations,
    is_vf,
    snapshots,
)
from proto.inventory import GpuNicRelation, NodeSnapshot
from proto.policy import Expect


def check_gpu_nic_affinity(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        limit = expect[node].max_gpu_nic_relation or DEFAULT_MAX_RELATION
        if not snap.devices:
            continue
        by_gpu: dict[str, list[GpuNicRelation]] = {}
        for row in snap.gpu_nic_topology:
            by_gpu.setdefault(row.gpu, []).append(row)
        for gpu in snap.gpus:
            rows = by_gpu.get(gpu.pci_address, [])
            if not rows:
                continue  # no topology for this GPU: reported by data-quality
            best = min(rows, key=lambda r: (RELATION_ORDER[r.relation], r.nic))
            if RELATION_ORDER[best.relation] <= RELATION_ORDER[limit]:
                continue
            found.append(
                Finding(
                    rule="gpu-nic-affinity",
                    severity="warning",
                    node=node,
                    subject=gpu.pci_address,
                    message=f"GPU {gpu.pci_address}'s nearest RDMA adapter {best.nic} is "
                    f"{best.relation}, worse than {limit}: GPUDirect RDMA will not be used "
                    "for it; move the NIC or GPU under a common PCIe switch or relax "
                    "maxGpuNicRelation.",
                    evidence={
                        "best_nic": best.nic,
                        "relation": best.relation,
                        "max_relation": limit,
                        "gpu_numa_node": gpu.numa_node,
                    },
                )
            )
    return found


def check_pcie_degraded(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        for device in snap.devices:
            pcie = device.pcie
            if pcie is None:
                continue
            slow = _below(pcie.current_speed_gts, pcie.max_speed_gts)
            narrow = _below(pcie.current_width, pcie.max_width)
            if not (pcie.degraded or slow or narrow):
                continue
            found.append(
                Finding(
                    rule="pcie-degraded",
                    severity="warning",
                    node=node,
                    subject=device.name,
                    message=f"{device.name} trained its PCIe link at {pcie.current_speed_gts} "
                    f"GT/s x{pcie.current_width}, below the possible {pcie.max_speed_gts} GT/s "
                    f"x{pcie.max_width}; reseat the card or check the slot/riser and BIOS "
                    "PCIe settings.",
                    evidence={
                        "current_speed_gts": pcie.current_speed_gts,
                        "current_width": pcie.current_width,
                        "max_speed_gts": pcie.max_speed_gts,
                        "max_width": pcie.max_width,
                        "pci_address": device.pci_address,
                    },
                )
            )
    return found


def _below(current: float | None, maximum: float | None) -> bool:
    return current is not None and maximum is not None and current < maximum


def check_acs_enabled(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        for bridge in sorted(set(snap.platform.acs_enabled_bridges)):
            found.append(
                Finding(
                    rule="acs-enabled",
                    severity="warning",
                    node=node,
                    subject=bridge,
                    message=f"Bridge {bridge} on a GPU<->NIC path has ACS redirect enabled, so "
                    "GPUDirect peer-to-peer traffic detours through the root complex; clear it "
                    f"at every boot (setpci -s {bridge} ECAP_ACS+6.w=0) or turn the BIOS ACS "
                    "option off (iommu=pt does not: Linux enables ACS whenever an IOMMU is on).",
                    evidence={"bridge": bridge, "iommu": snap.platform.iommu},
                )
            )
    return found


def _gpudirect_expected(snap: NodeSnapshot, expect: Expect) -> bool:
    if expect.gpu_direct is not None:
        return expect.gpu_direct
    nvidia = any(g.driver in (None, "nvidia") for g in snap.gpus)
    return bool(snap.gpus) and nvidia and bool(snap.devices)


# Linux 5.12 added dma-buf memory registration to RDMA (ib_umem_dmabuf, used by mlx5_ib);
# rdma-core 34 added ibv_reg_dmabuf_mr. The NVIDIA driver exports GPU memory as dma-buf
# only from its open kernel modules; NCCL 2.13+ uses it by default (NCCL_DMABUF_ENABLE=1).
DMABUF_KERNEL: Final = (5, 12)
GpuDirectPath = Literal["peermem", "dma-buf"]


def kernel_version(release: str | None) -> tuple[int, int] | None:
    """(major, minor) of a kernel release such as "6.8.0-45-generic"; None if not one."""
    if release is None:
        return None
    parts = release.split(".", 2)
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = parts[1].split("-", 1)[0]
    return (int(parts[0]), int(minor)) if minor.isdigit() else None


def dmabuf_support(snap: NodeSnapshot) -> bool | None:
    """Whether GPUDirect RDMA over dma-buf can work here; None: the snapshot cannot tell
    (an agent that does not report the module flavour or the kernel release)."""
    if "nvidia" not in snap.modules:
        return False  # no NVIDIA kernel module loaded: no GPUDirect path at all
    flavour = snap.platform.nvidia_kernel_module
    if flavour is None:
        return None
    if flavour == "proprietary":
        return False
    version = kernel_version(snap.platform.kernel_release)
    return None if version is None else version >= DMABUF_KERNEL


def gpudirect_paths(snap: NodeSnapshot) -> tuple[GpuDirectPath, ...]:
    """The GPUDirect RDMA memory-registration paths the node can use, preferred first."""
    paths: list[GpuDirectPath] = []
    if dmabuf_support(snap) is True:
        paths.append("dma-buf")
    if snap.platform.peermem:
        paths.append("peermem")
    return tuple(paths)


def _missing_message(snap: NodeSnapshot) -> str:
    platform = snap.platform
    version = kernel_version(platform.kernel_release)
    new_kernel = version is not None and version >= DMABUF_KERNEL
    if "nvidia" not in snap.modules:
        return (
            "GPUs and RDMA adapters are present but no NVIDIA kernel module is loaded, so "
            "GPUDirect RDMA has no path; load the NVIDIA driver, preferably its open "
            "kernel modules (dma-buf, on Linux 5.12+), or nvidia_peermem with it."
        )
    kernel = f"Linux {platform.kernel_release}" if platform.kernel_release else "this kernel"
    if platform.nvidia_kernel_module == "open":  # then only the kernel is too old
        dmabuf = (
            f"dma-buf needs Linux 5.12+ and this node runs {kernel}: upgrade the kernel, "
            "or load nvidia_peermem (modprobe nvidia_peermem; needs MLNX_OFED/DOCA "
            "peer-memory support) and make it persistent."
        )
    elif new_kernel:
        dmabuf = (
            f"dma-buf would work on {kernel} with the open NVIDIA kernel modules (R515+, "
            "the default from R560; GPU Operator driver.kernelModuleType=open) instead "
            "of the proprietary ones, with no nvidia_peermem; or load nvidia_peermem "
            "(modprobe nvidia_peermem) and make it persistent."
        )
    else:
        dmabuf = (
            "load nvidia_peermem (modprobe nvidia_peermem) and make it persistent; "
            "dma-buf instead needs the open NVIDIA kernel modules on Linux 5.12+."
        )
    return ("GPUs and RDMA adapters are present but neither GPUDirect RDMA path is available "
            "(nvidia_peermem is not loaded; dma-buf is not possible with the "
            f"{platform.nvidia_kernel_module or 'loaded'} NVIDIA kernel module on {kernel}), "
            f"so GPUDirect RDMA silently falls back to host memory; {dmabuf}")  # fmt: skip


def check_peermem_missing(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        if snap.platform.peermem or not _gpudirect_expected(snap, expect[node]):
            continue
        dmabuf = dmabuf_support(snap)
        if dmabuf is not False:
            continue  # dma-buf works (no peer-memory module needed), or cannot be told
        required = expect[node].gpu_direct is True
        found.append(
            Finding(
                rule="peermem-missing",
                severity="critical" if required else "warning",
                node=node,
                subject="nvidia_peermem",
                message=_missing_message(snap),
                evidence={
                    "gpus": len(snap.gpus),
                    "rdma_devices": len(snap.devices),
                    "gpu_direct_required": required,
                    "nvidia_kernel_module": snap.platform.nvidia_kernel_module,
                    "kernel_release": snap.platform.kernel_release,
                },
            )
        )
    return found


# Default domain types in which every DMA of the group goes through IOMMU translation
# (Documentation/ABI/testing/sysfs-kernel-iommu_groups). identity is pass-through;
# blocked/unmanaged groups are not doing host DMA through the DMA API at all.
TRANSLATED: Final = frozenset({"DMA", "DMA-FQ"})
CmdlineMode = Literal["passthrough", "translated", "off"]


def cmdline_iommu_mode(params: tuple[str, ...] | None) -> CmdlineMode | None:
    """The DMA mode the kernel command line asks for; None when it does not say (the
    build's default decides) or was not read. The last word wins, as in the kernel."""
    if params is None:
        return None
    mode: CmdlineMode | None = None
    for token in params:
        key, _, value = token.partition("=")
        if key == "iommu" and value == "pt":
            mode = "passthrough"
        elif key == "iommu" and value == "nopt":
            mode = "translated"
        elif key == "iommu.passthrough":
            mode = "passthrough" if value in ("1", "y", "Y", "on") else "translated"
        elif key in ("iommu", "intel_iommu", "amd_iommu") and value.split(",")[0] == "off":
            mode = "off"
        elif key == "intel_iommu" and "on" in value.split(",") and mode is None:
            mode = "translated"  # VT-d on without iommu=pt: DMA domains by default
    return mode


def _translated(snap: NodeSnapshot) -> tuple[list[str], str, str] | None:
    """(names, mode, source) of the GPUDirect functions whose DMA is translated, adapters
    (by RDMA device name) before GPUs (by PCI address); None when the snapshot cannot
    tell (an older agent, a kernel without group types, no command line)."""
    names = [(d.pci_address, d.name) for d in sorted(snap.devices, key=lambda d: d.name)]
    names += [
        (g.pci_address, g.pci_address) for g in sorted(snap.gpus, key=lambda g: g.pci_address)
    ]
    types = {g.pci_address: g.type for g in snap.platform.iommu_groups}
    ours = [(address, name) for address, name in names if address in types]
    hit = [(address, name) for address, name in ours if types[address] in TRANSLATED]
    if hit:
        modes = sorted({str(types[address]) for address, _ in hit})
        return [name for _, name in hit], "/".join(modes), "iommu_groups"
    if ours and all(types[address] is not None for address, _ in ours):
        return [], "", "iommu_groups"  # every group typed, none translated (identity)
    params = snap.platform.kernel_cmdline_iommu
    if cmdline_iommu_mode(params) == "translated":
        return [name for _, name in names], "DMA (kernel command line)", "cmdline"
    return None if cmdline_iommu_mode(params) is None else ([], "", "cmdline")


def check_iommu_translated(given: RuleInput) -> list[Finding]:
    expect = expectations(given.fleet, given.policies, given.cluster)
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        if snap.platform.iommu is not True or not _gpudirect_expected(snap, expect[node]):
            continue
        judged = _translated(snap)
        if judged is None or not judged[0]:
            continue  # pass-through (identity), or the snapshot cannot tell: no alarm
        names, mode, source = judged
        cmdline = " ".join(snap.platform.kernel_cmdline_iommu or ())
        despite = (f" although the kernel command line has {cmdline}"
                   if cmdline_iommu_mode(snap.platform.kernel_cmdline_iommu) == "passthrough"
                   else "")  # fmt: skip
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        found.append(
            Finding(
                rule="iommu-translated",
                severity="warning",
                node=node,
                subject="iommu",
                message=f"{shown} run with IOMMU translation ({mode}){despite}: GPUDirect "
                "peer-to-peer DMA between them is translated or blocked; boot with iommu=pt "
                "(e.g. intel_iommu=on iommu=pt) so their groups are identity, or set a "
                "group's kernel/iommu_groups/<N>/type to identity, or disable the IOMMU.",
                evidence={
                    "translated": ",".join(names),
                    "mode": mode,
                    "source": source,
                    "cmdline": cmdline or None,
                    "gpus": len(snap.gpus),
                    "rdma_devices": len(snap.devices),
                },
            )
        )
    return found


def check_numa_unknown(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node, snap in snapshots(given.fleet):
        known = {d.numa_node for d in snap.devices if d.numa_node is not None}
        known |= {g.numa_node for g in snap.gpus if g.numa_node is not None}
        # Multi-socket when two NUMA nodes are seen, or any id above 0 is.
        if len(known) < 2 and not any(n > 0 for n in known):
            continue
        for device in snap.devices:
            if device.numa_node is not None or is_vf(device):
                continue
            found.append(
                Finding(
                    rule="numa-unknown",
                    severity="warning",
                    node=node,
                    subject=device.name,
                    message=f"{device.name} reports no NUMA node on a multi-socket host, so "
                    "the device plugin and NCCL cannot place work next to it; enable "
                    "ACPI SRAT/NUMA in the BIOS or fix the platform firmware.",
                    evidence={"numa_node": None, "numa_nodes_seen": len(known)},
                )
            )
    return found


RULES: Final[tuple[Rule, ...]] = (
    Rule(id="gpu-nic-affinity", family="topology", severity="warning",
         check=check_gpu_nic_affinity, reads=SNAPSHOT),
    Rule(id="pcie-degraded", family="topology", severity="warning",
         check=check_pcie_degraded, reads=SNAPSHOT, for_s=30.0),
    Rule(id="acs-enabled", family="topology", severity="warning",
         check=check_acs_enabled, reads=SNAPSHOT),
    # Escalates to critical when the policy requires GPUDirect.
    Rule(id="peermem-missing", family="topology", severity="warning",
         check=check_peermem_missing, reads=SNAPSHOT),
    Rule(id="iommu-translated", family="topology", severity="warning",
         check=check_iommu_translated, reads=SNAPSHOT),
    Rule(id="numa-unknown", family="topology", severity="warning",
         check=check_numa_unknown, reads=SNAPSHOT),
)  # fmt: skip
