"""A node's GPUDirect RDMA facts as one view: which memory-registration path(s) it can use
(dma-buf, peermem, both, none, unknown, with why) and the IOMMU's DMA mode for its GPUs
and adapters. Built on the definitions the tuned-host rules use (aggregator.rules.topology:
dmabuf_support, gpudirect_paths, cmdline_iommu_mode, TRANSLATED), so the node view, the API
and the peermem-missing / iommu-translated findings cannot disagree.

Pure: a snapshot in, a proto.http.GpuDirect out; the API adds it to the node detail.
"""

from __future__ import annotations

from aggregator.rules.topology import (
    DMABUF_KERNEL,
    TRANSLATED,
    GpuDirectPath,
    cmdline_iommu_mode,
    dmabuf_support,
    gpudirect_paths,
    kernel_version,
)
from proto.http import GpuDirect, GpuDirectPathState, IommuMode
from proto.inventory import NodeSnapshot

_MAX_NAMES = 4


def gpudirect_of(snap: NodeSnapshot) -> GpuDirect:
    """The node's GPUDirect paths and IOMMU mode, each with the sentence behind it."""
    path, paths, reason = _path(snap)
    iommu, iommu_reason = iommu_mode(snap)
    return GpuDirect(
        path=path,
        paths=paths,
        path_reason=reason,
        iommu=iommu,
        iommu_reason=iommu_reason,
        nvidia_kernel_module=snap.platform.nvidia_kernel_module,
        kernel_release=snap.platform.kernel_release,
    )


def _path(
    snap: NodeSnapshot,
) -> tuple[GpuDirectPathState, tuple[GpuDirectPath, ...], str]:
    if not snap.gpus or not snap.devices:
        missing = "no GPUs" if not snap.gpus else "no RDMA devices"
        return "none", (), f"GPUDirect RDMA needs GPUs and RDMA adapters; this node has {missing}."
    paths = gpudirect_paths(snap)
    reason = f"{_dmabuf_reason(snap)}; {_peermem_reason(snap)}."
    if len(paths) == 2:
        return "both", paths, reason
    if paths:
        return paths[0], paths, reason
    return ("unknown" if dmabuf_support(snap) is None else "none"), (), reason


def _dmabuf_reason(snap: NodeSnapshot) -> str:
    platform = snap.platform
    release = platform.kernel_release
    if "nvidia" not in snap.modules:
        return "dma-buf: no NVIDIA kernel module loaded"
    if platform.nvidia_kernel_module is None:
        return "dma-buf: unknown, the agent does not report the NVIDIA kernel module flavour"
    if platform.nvidia_kernel_module == "proprietary":
        return "dma-buf: not with the proprietary NVIDIA kernel modules, only the open ones"
    version = kernel_version(release)
    if release is None:
        return (
            "dma-buf: unknown, open NVIDIA kernel modules but the kernel release is not "
            "reported: an agent without --proc-root"
        )
    if version is None:
        return f"dma-buf: unknown, kernel release {release!r} not understood"
    if version < DMABUF_KERNEL:
        return f"dma-buf: not on Linux {release}, needs 5.12+"
    return f"dma-buf: open NVIDIA kernel modules on Linux {release}"


def _peermem_reason(snap: NodeSnapshot) -> str:
    if not snap.platform.peermem:
        return "peermem: nvidia_peermem not loaded"
    for name in ("nvidia_peermem", "nv_peer_mem"):
        if name in snap.modules:
            return f"peermem: {name} loaded"
    return "peermem: a GPU peer-memory client is registered"


def iommu_mode(snap: NodeSnapshot) -> tuple[IommuMode, str]:
    """The DMA mode of the node's GPUs and adapters and where it comes from, decided in
    the order iommu-translated uses: group types first, the command line only where a
    function's group has no type."""
    platform = snap.platform
    if platform.iommu is None:
        return "unknown", "the agent could not read /sys/class/iommu"
    if platform.iommu is False:
        return "off", "no IOMMU unit registered: /sys/class/iommu is empty"
    names = [(d.pci_address, d.name) for d in sorted(snap.devices, key=lambda d: d.name)]
    names += [
        (g.pci_address, g.pci_address) for g in sorted(snap.gpus, key=lambda g: g.pci_address)
    ]
    types = {g.pci_address: g.type for g in platform.iommu_groups}
    ours = [(address, name) for address, name in names if address in types]
    cmdline = " ".join(platform.kernel_cmdline_iommu or ())
    hit = [name for address, name in ours if types[address] in TRANSLATED]
    if hit:
        modes = "/".join(sorted({str(types[a]) for a, _ in ours if types[a] in TRANSLATED}))
        shown = ", ".join(hit[:_MAX_NAMES]) + (
            f" and {len(hit) - _MAX_NAMES} more" if len(hit) > _MAX_NAMES else ""
        )
        despite = f", although the command line has {cmdline}" if cmdline else ""
        return "translated", f"{modes} IOMMU groups: {shown}{despite}"
    if ours and all(types[address] is not None for address, _ in ours):
        kinds = sorted({str(types[address]) for address, _ in ours})
        if kinds == ["identity"]:
            return "passthrough", "every GPU and adapter IOMMU group is identity"
        return "unknown", f"IOMMU groups of type {', '.join(kinds)}: no host DMA translation"
    mode = cmdline_iommu_mode(platform.kernel_cmdline_iommu)
    if mode is None:
        read = "not read" if platform.kernel_cmdline_iommu is None else "silent"
        return "unknown", (
            "IOMMU on, but no group types are reported, a kernel before 5.4, and the kernel "
            f"command line is {read} about the mode"
        )
    return mode, f"kernel command line {cmdline}; no IOMMU group types reported"
