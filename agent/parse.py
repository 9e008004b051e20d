"""Pure parsers for the text the kernel writes in sysfs (RDMA core, PCI, net).

Each function takes the raw text of one file (trailing newline and all) and returns a
value or raises `ParseError` naming what it was parsing. No I/O, no clock, no logging:
formats follow drivers/infiniband/core/sysfs.c, drivers/pci/pci-sysfs.c, net-sysfs.c.
"""

from __future__ import annotations

import re
from typing import Final

from agent.errors import ParseError
from proto.inventory import LinkLayer, PortStateName

# ib_port_state names as printed by the kernel's state_show(); out-of-range is "UNKNOWN".
PORT_STATE_NAMES: Final[dict[str, PortStateName]] = {
    "NOP": "NOP",
    "DOWN": "DOWN",
    "INIT": "INIT",
    "ARMED": "ARMED",
    "ACTIVE": "ACTIVE",
    "ACTIVE_DEFER": "ACTIVE_DEFER",
    "UNKNOWN": "UNKNOWN",
}
LINK_LAYERS: Final[dict[str, LinkLayer]] = {
    "infiniband": "InfiniBand",
    "ethernet": "Ethernet",
    "unknown": "Unknown",
}
OPERSTATES: Final = frozenset(
    {"unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up"}
)
NVIDIA_VENDOR: Final = "0x10de"
# PCI class prefixes (base class + subclass) of GPUs: 3D controller (H100, A100) and VGA.
GPU_CLASS_PREFIXES: Final = ("0x0302", "0x0300")
# Counters the kernel reports in 4-octet units (IBTA PortXmitData/PortRcvData), keyed the
# way `counter_key` names them.
DATA_COUNTERS: Final = frozenset(
    {
        "port_xmit_data",
        "port_rcv_data",
        "counters_ext/port_xmit_data_64",
        "counters_ext/port_rcv_data_64",
    }
)
NO_PMA: Final = "N/A (no PMA)"
_U64_MAX: Final = 2**64 - 1

_NUMBERED = re.compile(r"(?P<num>\d+): (?P<name>\S(?:.*\S)?)")
_RATE = re.compile(
    r"(?P<gbps>\d+(?:\.\d+)?) Gb/sec"
    r"(?: \((?P<lanes>\d+)X(?: (?P<speed>[A-Za-z][A-Za-z0-9]*))?\))?"
)
_HEX = re.compile(r"(?:0[xX])?(?P<digits>[0-9a-fA-F]+)")
_GUID = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}")
_LINK_SPEED = re.compile(r"(?P<gts>\d+(?:\.\d+)?) GT/s(?: PCIe)?")
_PCI_ADDRESS = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])"
)
_HOST_BRIDGE = re.compile(r"pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}")
_PCI_ID = re.compile(r"0x[0-9a-fA-F]{4}")
_PCI_CLASS = re.compile(r"0x[0-9a-fA-F]{6}")
_CPULIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
_DECIMAL = re.compile(r"-?\d+")
_HWADDR = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2})*")


def _numbered(text: str, what: str) -> tuple[int, str]:
    # "4: ACTIVE", "5: LinkUp", "7: Phy Test", "1: CA": "%d: %s\n" in the RDMA core.
    match = _NUMBERED.fullmatch(text.strip())
    if match is None:
        raise ParseError(what, text, "expected '<number>: <name>'")
    return int(match["num"]), match["name"]


def parse_port_state(text: str) -> tuple[int, PortStateName]:
    """`"4: ACTIVE"` -> `(4, "ACTIVE")`; a name we do not know becomes "UNKNOWN"."""
    number, name = _numbered(text, "port state")
    return number, PORT_STATE_NAMES.get(name, "UNKNOWN")


def parse_phys_state(text: str) -> tuple[int, str | None]:
    """`"5: LinkUp"` -> `(5, "LinkUp")`; the kernel's `<unknown>` name becomes None.

    The name is kept as written: some drivers print names outside the IBTA table (a
    captured mlx5 shows `4: ACTIVE`), and the number alone would hide that.
    """
    number, name = _numbered(text, "port phys_state")
    return number, (None if name == "<unknown>" else name)


def parse_node_type(text: str) -> str | None:
    """`"1: CA"` -> `"CA"` (also RNIC, usNIC, switch, router; `<unknown>` -> None)."""
    _, name = _numbered(text, "node_type")
    return None if name == "<unknown>" else name


def parse_rate(text: str) -> tuple[float, int | None, str | None]:
    """`"400 Gb/sec (4X NDR)"` -> `(400.0, 4, "NDR")`.

    Old kernels print no speed name for SDR (`"10 Gb/sec (4X)"`), half rates carry `.5`
    (`"2.5 Gb/sec (1X SDR)"`).
    """
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ParseError("port rate", text, "expected '<n> Gb/sec (<w>X <speed>)'")
    lanes = int(match["lanes"]) if match["lanes"] is not None else None
    return float(match["gbps"]), lanes, match["speed"]


def parse_link_layer(text: str) -> LinkLayer:
    """`"InfiniBand"`, `"Ethernet"` or `"Unknown"`.

    Some kernels emit a blank second line after the value ("InfiniBand\\n\\n").
    """
    value = text.strip()
    link_layer = LINK_LAYERS.get(value.lower())
    if link_layer is None:
        raise ParseError("port link_layer", text, "expected InfiniBand, Ethernet or Unknown")
    return link_layer


def parse_hex_int(text: str, what: str = "hex integer") -> int:
    """`"0x1f"` -> 31 (lid and sm_lid are printed with "0x%x")."""
    match = _HEX.fullmatch(text.strip())
    if match is None:
        raise ParseError(what, text, "expected a hexadecimal number")
    return int(match["digits"], 16)


def parse_guid(text: str, what: str = "GUID") -> str:
    """`"0a7f:bc12:45ef:d23b"` (4 groups of 4 hex digits), lower-cased.

    node_guid may lack the trailing newline in captured trees; stripping covers both.
    """
    value = text.strip()
    if _GUID.fullmatch(value) is None:
        raise ParseError(what, text, "expected xxxx:xxxx:xxxx:xxxx")
    return value.lower()


def parse_counter(text: str) -> int | None:
    """A counter file's value; `"N/A (no PMA)"` (no performance management agent) -> None.

    The value is returned as the kernel printed it: PMA error counters saturate at their
    width (4294967295 for a 32-bit one) and that saturation is information, not garbage.
    """
    value = text.strip()
    if value == NO_PMA:
        return None
    if not value.isascii() or not value.isdigit():
        raise ParseError("counter", text, "expected an unsigned decimal")
    number = int(value)
    if number > _U64_MAX:
        raise ParseError("counter", text, "larger than 64 bits")
    return number


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


def parse_decimal(text: str, what: str, *, minimum: int | None = None) -> int:
    """A signed decimal integer (mtu, dev_port, type, ...), optionally bounded below."""
    value = text.strip()
    if _DECIMAL.fullmatch(value) is None:
        raise ParseError(what, text, "expected a decimal integer")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ParseError(what, text, f"below {minimum}")
    return number


def parse_bool01(text: str, what: str) -> bool:
    """A `0`/`1` flag such as a netdev's `carrier`."""
    value = text.strip()
    if value not in ("0", "1"):
        raise ParseError(what, text, "expected 0 or 1")
    return value == "1"


def parse_string(text: str) -> str | None:
    """A free-text attribute (fw_ver, board_id, hca_type, ...): stripped, empty -> None."""
    value = text.strip()
    return value or None


def parse_operstate(text: str) -> str:
    """A netdev's RFC 2863 operstate as the kernel names it (`up`, `down`, `dormant`, ...)."""
    value = text.strip()
    if value not in OPERSTATES:
        raise ParseError("operstate", text, "not an RFC 2863 operstate name")
    return value


def parse_hw_address(text: str) -> str:
    """A netdev `address`: 6 octets for Ethernet, 20 for IPoIB; lower-cased."""
    value = text.strip()
    if _HWADDR.fullmatch(value) is None:
        raise ParseError("hardware address", text, "expected colon-separated hex octets")
    return value.lower()


def parse_pci_address(text: str) -> str:
    """`"0000:3b:00.0"` (domain may have more than 4 digits behind VMD), lower-cased."""
    value = text.strip()
    match = _PCI_ADDRESS.fullmatch(value)
    if match is None or int(match["dev"], 16) > 0x1F:
        raise ParseError("PCI address", text, "expected dddd:bb:dd.f")
    return value.lower()


def is_pci_address(name: str) -> bool:
    try:
        parse_pci_address(name)
    except ParseError:
        return False
    return True


def is_host_bridge(name: str) -> bool:
    """A PCI host bridge directory under /sys/devices, e.g. `pci0000:00`."""
    return _HOST_BRIDGE.fullmatch(name) is not None


def parse_pci_id(text: str, what: str = "PCI id") -> str:
    """A 16-bit PCI id (`vendor`, `device`, `subsystem_*`): `"0x15b3"`, lower-cased."""
    value = text.strip()
    if _PCI_ID.fullmatch(value) is None:
        raise ParseError(what, text, "expected 0x followed by 4 hex digits")
    return value.lower()


def parse_pci_class(text: str) -> str:
    """A 24-bit PCI class code: `"0x020700"` (InfiniBand controller), lower-cased."""
    value = text.strip()
    if _PCI_CLASS.fullmatch(value) is None:
        raise ParseError("PCI class", text, "expected 0x followed by 6 hex digits")
    return value.lower()


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


def counter_key(group: str, name: str) -> str:
    """Stable counter name: plain for `counters/`, `<group>/<name>` for the other groups.

    `counters/` holds the IBTA PortCounters every tool knows by bare name; `counters_ext/`
    and `hw_counters/` (driver-defined) keep their directory so names never collide.
    """
    return name if group == "counters" else f"{group}/{name}"


def data_bytes(name: str, value: int) -> int:
    """Octets for a data counter (kernel counts 4-octet units), other counters unchanged."""
    return value * 4 if name in DATA_COUNTERS else value
