"""Render the few procfs files the agent reads (agent.host.procfs) for a lab node spec:
`proc/cmdline`, `proc/sys/kernel/osrelease` and, with nvidia loaded,
`proc/driver/nvidia/version`, in the kernel's and the NVIDIA driver's formats.

The tree goes to `<root>/proc`, beside the sysfs files of the same lab tree (so
`lab render --overwrite` replaces both); the agent reads it with `--proc-root <root>/proc`.
Writes only below the directory it is given. Deterministic.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from agent.lab.nodespec import NodeSpec, module_of

PROC_DIR: Final = "proc"  # below the lab tree's root
# The build and date parts of the driver's version line are made up but well formed
# (tests/data/kernelfacts has the formats); only the flavour and the version matter.
_OPEN_LINE: Final = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(dvs-builder@U16-I3-D08-1-2)  Fri May 31 09:34:34 UTC 2024"
)
_PROPRIETARY_LINE: Final = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Sun May 12 19:39:15 UTC 2024"
)
_GCC_LINE: Final = "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) "


def proc_root(root: Path) -> Path:
    """Where `render_proc` writes for the lab tree at `root` (what --proc-root takes)."""
    return Path(root) / PROC_DIR


def cmdline_text(spec: NodeSpec) -> str:
    """/proc/cmdline: the spec's `kernel_cmdline`, else GRUB's usual line with the IOMMU
    parameters the sysfs side implies: `intel_iommu=on` for an IOMMU, `iommu=pt` when the
    groups are identity (what pass-through boots them as)."""
    if spec.kernel_cmdline is not None:
        return spec.kernel_cmdline
    words = [f"BOOT_IMAGE=/boot/vmlinuz-{spec.kernel_release}", "root=LABEL=root", "ro"]
    if spec.iommu:
        words.append("intel_iommu=on")
        if spec.iommu_group_type == "identity":
            words.append("iommu=pt")
    words.append("quiet")
    return " ".join(words)


def nvidia_version_text(spec: NodeSpec) -> str | None:
    """/proc/driver/nvidia/version, None where nvidia.ko is not loaded (no such file)."""
    if "nvidia" not in spec.modules:
        return None
    version = module_of(spec.modules["nvidia"]).version or "0.0"
    line = _OPEN_LINE if spec.nvidia_kernel_module == "open" else _PROPRIETARY_LINE
    return f"{line.format(version=version)}\n{_GCC_LINE}\n"


def proc_files(spec: NodeSpec) -> dict[str, str]:
    """Path below proc/ -> text, as the kernel shows it (one trailing newline)."""
    files = {
        "cmdline": cmdline_text(spec) + "\n",
        "sys/kernel/osrelease": spec.kernel_release + "\n",
    }
    nvidia = nvidia_version_text(spec)
    if nvidia is not None:
        files["driver/nvidia/version"] = nvidia
    return files


def render_proc(spec: NodeSpec, root: Path) -> Path:
    """Write the procfs files of `spec` below `root/proc`; returns that directory."""
    proc = proc_root(root)
    for rel, text in proc_files(spec).items():
        path = proc / rel
        os.makedirs(path.parent, exist_ok=True)
        path.write_text(text)
    return proc
