"""Pure parsers for PCI attributes in sysfs (drivers/pci/pci-sysfs.c) and the rules on
them: addresses and device paths, ids, link speed/width and its effective maximum.

Same contract as agent.host.parse: raw text in, a value or ParseError out; no I/O.
"""

from __future__ import annotations

import re
from typing import Final, TypeVar

from agent.errors import ParseError
from agent.host.parse import parse_decimal

# pci_power_names[] in drivers/pci/pci.c.
POWER_STATES: Final = frozenset({"error", "D0", "D1", "D2", "D3hot", "D3cold", "unknown"})
NVIDIA_VENDOR: Final = "0x10de"
MELLANOX_VENDOR: Final = "0x15b3"  # ConnectX / BlueField (NVIDIA networking)
NETWORK_CLASS_PREFIX: Final = "0x02"  # network controller: Ethernet 0x0200, InfiniBand 0x0207
# PCI class prefixes (base class + subclass) of GPUs: 3D controller (H100, A100) and VGA.
GPU_CLASS_PREFIXES: Final = ("0x0302", "0x0300")
N = TypeVar("N", int, float)

_LINK_SPEED = re.compile(r"(?P<gts>[0-9]+(?:\.[0-9]+)?) GT/s(?: PCIe)?", re.ASCII)
_PCI_ADDRESS = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])",
    re.ASCII,
)
_HOST_BRIDGE = re.compile(r"pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}", re.ASCII)
_PCI_ID = re.compile(r"0x[0-9a-fA-F]{4}", re.ASCII)
_PCI_CLASS = re.compile(r"0x[0-9a-fA-F]{6}", re.ASCII)
_PCI_REVISION = re.compile(r"0x[0-9a-fA-F]{2}", re.ASCII)
_CPULIST = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*", re.ASCII)


def parse_link_speed(text: str) -> float | None:
    """PCIe `{current,max}_link_speed` in GT/s: `"16.0 GT/s PCIe"` -> 16.0.

    Older kernels print `"8 GT/s"` / `"2.5 GT/s"` without the suffix; an untrained or
    unreadable link reads `"Unknown"` (or `"Unknown speed"` on older kernels) -> None.
    """
    value = text.strip()
    if value in ("Unknown", "Unknown speed"):
        return None
    match = _LINK_SPEED.fullmatch(value)
    if match is None:
        raise ParseError("PCIe link speed", text, "expected '<n> GT/s PCIe'")
    return float(match["gts"])


def parse_link_width(text: str) -> int:
    """PCIe `{current,max}_link_width`: decimal lane count (0 while the link is down)."""
    return parse_decimal(text, "PCIe link width", minimum=0)


def parse_numa_node(text: str) -> int | None:
    """`numa_node`: `-1` means the firmware did not say -> None."""
    value = parse_decimal(text, "numa_node", minimum=-1)
    return None if value == -1 else value


def parse_power_state(text: str) -> str:
    """A PCI function's `power_state`: D0, D1, D2, D3hot, D3cold, unknown or error."""
    value = text.strip()
    if value not in POWER_STATES:
        raise ParseError("power_state", text, "not a PCI power state name")
    return value


def parse_pci_address(text: str) -> str:
    """`"0000:3b:00.0"` (domain may have more than 4 digits behind VMD), lower-cased."""
    value = text.strip()
    match = _PCI_ADDRESS.fullmatch(value)
    if match is None or int(match["dev"], 16) > 0x1F:
        raise ParseError("PCI address", text, "expected dddd:bb:dd.f")
    return value.lower()


def is_pci_address(name: str) -> bool:
    match = _PCI_ADDRESS.fullmatch(name)
    return match is not None and int(match["dev"], 16) <= 0x1F


def is_host_bridge(name: str) -> bool:
    """A PCI host bridge directory under /sys/devices, e.g. `pci0000:00`."""
    return _HOST_BRIDGE.fullmatch(name) is not None


def _pci_hex(text: str, pattern: re.Pattern[str], what: str, digits: int) -> str:
    value = text.strip()
    if pattern.fullmatch(value) is None:
        raise ParseError(what, text, f"expected 0x followed by {digits} hex digits")
    return value.lower()


def parse_pci_id(text: str, what: str = "PCI id") -> str:
    """A 16-bit PCI id (`vendor`, `device`, `subsystem_*`): `"0x15b3"`, lower-cased."""
    return _pci_hex(text, _PCI_ID, what, 4)


def parse_pci_class(text: str) -> str:
    """A 24-bit PCI class code: `"0x020700"` (InfiniBand controller), lower-cased."""
    return _pci_hex(text, _PCI_CLASS, "PCI class", 6)


def parse_pci_revision(text: str) -> str:
    """The 8-bit revision id: `"0x01"`."""
    return _pci_hex(text, _PCI_REVISION, "PCI revision", 2)


def parse_cpulist(text: str) -> str | None:
    """`local_cpulist` such as `"0-23,48-71"`, kept as text; empty -> None."""
    value = text.strip()
    if not value:
        return None
    if _CPULIST.fullmatch(value) is None:
        raise ParseError("cpulist", text, "expected ranges like 0-15,32-47")
    return value


def parse_pci_devpath(devpath: str) -> tuple[str, tuple[str, ...]]:
    """Split a resolved device directory into `(address, path)`.

    `devpath` is the resolved location of a PCI function relative to the sysfs root, e.g.
    `/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0`. `path` starts with the
    host bridge (`pci0000:00`) and lists every bridge down to the function's parent:
    `("pci0000:00", "0000:00:01.0", "0000:01:00.0")`. Components that are neither host
    bridges nor PCI functions (ACPI or VMBus nodes above the host bridge) are dropped; a
    VMD domain shows up as a second host bridge inside the chain.
    """
    parts = [part for part in devpath.split("/") if part]
    if not parts or not is_pci_address(parts[-1]):
        raise ParseError("PCI device path", devpath, "does not end in a PCI address")
    start = next((i for i, part in enumerate(parts) if is_host_bridge(part)), None)
    if start is None:
        raise ParseError("PCI device path", devpath, "no pciDDDD:BB host bridge")
    chain = tuple(
        part.lower() for part in parts[start:-1] if is_host_bridge(part) or is_pci_address(part)
    )
    return parts[-1].lower(), chain


def is_gpu(vendor: str | None, class_code: str | None) -> bool:
    """An NVIDIA function whose class is 3D controller (0x0302xx) or VGA (0x0300xx)."""
    if vendor != NVIDIA_VENDOR or class_code is None:
        return False
    return class_code.startswith(GPU_CLASS_PREFIXES)


def is_rdma_nic(vendor: str | None, class_code: str | None) -> bool:
    """A Mellanox/NVIDIA network function (a ConnectX port, a BlueField's, or a VF)."""
    return (
        vendor == MELLANOX_VENDOR
        and class_code is not None
        and class_code.startswith(NETWORK_CLASS_PREFIX)
    )


def effective_max(device_max: N | None, upstream_max: N | None) -> N | None:
    """The lower of two link maxima; either side unknown leaves the other standing.

    A Gen5 x16 card in a Gen4 x8 slot can never train faster than Gen4 x8: comparing
    the negotiated link with the card's own maximum would call every such card degraded.
    """
    if device_max is None or upstream_max is None:
        return device_max if upstream_max is None else upstream_max
    return min(device_max, upstream_max)


def is_degraded(current: N | None, maximum: N | None) -> bool:
    """Below the effective maximum; an unknown side (link down, no attribute) says no."""
    return current is not None and maximum is not None and current < maximum
