"""Pure parsing of the kernel facts around GPUDirect: IOMMU group types, the IOMMU
parameters of the command line, the kernel release and the flavour of nvidia.ko.

Text in, values out; no I/O (agent.host.platform reads the files). Junk raises ParseError.
"""

from __future__ import annotations

from typing import Final

from agent.errors import ParseError
from proto.inventory import NvidiaModuleFlavour

# What iommu_group_show_type() (drivers/iommu/iommu.c) writes; "unknown" for a domain
# type it has no name for. Documentation/ABI/testing/sysfs-kernel-iommu_groups.
GROUP_TYPES: Final = frozenset({"DMA", "DMA-FQ", "identity", "blocked", "unmanaged", "unknown"})
# Command-line parameters that choose whether and how DMA is translated
# (Documentation/admin-guide/kernel-parameters.txt).
IOMMU_PARAMS: Final = frozenset(
    {"iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict"}
)
_MAX_TOKEN: Final = 256


def parse_group_type(text: str) -> str:
    """kernel/iommu_groups/<N>/type: one of GROUP_TYPES."""
    value = text.strip()
    if value not in GROUP_TYPES:
        raise ParseError("IOMMU group type", value, f"not one of {sorted(GROUP_TYPES)}")
    return value


def parse_cmdline_iommu(text: str) -> tuple[str, ...]:
    """The IOMMU parameters of /proc/cmdline, in order, as written (`iommu=pt`).

    Later ones win in the kernel, so the order is kept. Quoted values with spaces
    (`foo="a b"`) are not IOMMU parameters and are skipped with everything else.
    """
    if "\0" in text:
        raise ParseError("kernel command line", text[:32], "contains NUL")
    found: list[str] = []
    for token in text.split():
        key = token.partition("=")[0]
        if key in IOMMU_PARAMS and len(token) <= _MAX_TOKEN:
            found.append(token)
    return tuple(found)


def parse_osrelease(text: str) -> str:
    """/proc/sys/kernel/osrelease (what `uname -r` prints): `6.8.0-45-generic`."""
    value = text.strip()
    head = value.partition(".")
    if not (head[0].isdigit() and head[2][:1].isdigit()) or len(value) > 64:
        raise ParseError("kernel release", value, "not <major>.<minor>...")
    return value


def parse_module_taint(text: str) -> NvidiaModuleFlavour:
    """/sys/module/nvidia/taint: `P` (TAINT_PROPRIETARY_MODULE) marks the proprietary
    nvidia.ko, licensed "NVIDIA"; the open modules are "Dual MIT/GPL" and show only
    `O` (out of tree), maybe with `E` (unsigned). Documentation/ABI/testing/sysfs-module.
    """
    flags = text.strip()
    if not flags.isalpha() and flags:
        raise ParseError("module taint", flags, "not taint flag letters")
    return "proprietary" if "P" in flags else "open"


def parse_nvidia_version(text: str) -> NvidiaModuleFlavour:
    """/proc/driver/nvidia/version, first line:
    `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ...`
    (open) or `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...` (proprietary).
    """
    first = text.partition("\n")[0]
    if not first.startswith("NVRM version:") or "Kernel Module" not in first:
        raise ParseError("NVIDIA driver version", first[:80], "no NVRM kernel module line")
    return "open" if "Open Kernel Module" in first else "proprietary"
