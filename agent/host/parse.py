"""Pure parsers for the text the kernel writes in sysfs for RDMA devices and netdevs.

Each function takes the raw text of one file (trailing newline and all) and returns a
value or raises `ParseError` naming what it was parsing. No I/O, no clock, no logging:
formats follow drivers/infiniband/core/sysfs.c and net-sysfs.c (PCI: agent.host.pciparse).
"""

from __future__ import annotations

import re
from typing import Final

from agent.errors import ParseError
from proto.ibta import PORT_STATE_NAMES
from proto.inventory import LinkLayer, PortStateName

LINK_LAYERS: Final[dict[str, LinkLayer]] = {
    "infiniband": "InfiniBand",
    "ethernet": "Ethernet",
    "unknown": "Unknown",
}
OPERSTATES: Final = frozenset(
    {"unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up"}
)
NO_PMA: Final = "N/A (no PMA)"
_NO_PMA_BYTES: Final = NO_PMA.encode()
_U64_MAX: Final = 2**64 - 1
# A 32-bit PortXmitData/PortRcvData stuck at its maximum (pre-extended-counter HCAs).
U32_SATURATED: Final = 2**32 - 1
ZERO_GID: Final = "0000:0000:0000:0000:0000:0000:0000:0000"

# re.ASCII everywhere: \d and \s must not accept Unicode digits or spaces from junk files.
_NUMBERED = re.compile(r"(?P<num>[0-9]+): (?P<name>\S(?:.*\S)?)", re.ASCII)
_RATE = re.compile(
    r"(?P<gbps>[0-9]+(?:\.[0-9]+)?) Gb/sec"
    r"(?: \((?P<lanes>[0-9]+)X(?: (?P<speed>[A-Za-z][A-Za-z0-9]*))?\))?",
    re.ASCII,
)
_HEX = re.compile(r"(?:0[xX])?(?P<digits>[0-9a-fA-F]{1,16})", re.ASCII)
_GUID = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}", re.ASCII)
_GID = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}", re.ASCII)
_DECIMAL = re.compile(r"-?[0-9]+", re.ASCII)
_HWADDR = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2})*", re.ASCII)
_DIGIT_RUNS = re.compile(r"([0-9]+)", re.ASCII)


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
    link_layer = LINK_LAYERS.get(text.strip().lower())
    if link_layer is None:
        raise ParseError("port link_layer", text, "expected InfiniBand, Ethernet or Unknown")
    return link_layer


def parse_hex_int(text: str, what: str = "hex integer") -> int:
    """`"0x1f"` -> 31 (lid and sm_lid are printed with "0x%x")."""
    match = _HEX.fullmatch(text.strip())
    if match is None:
        raise ParseError(what, text, "expected a hexadecimal number")
    return int(match["digits"], 16)


def parse_hex_text(text: str, what: str) -> str:
    """A hex register kept as text (`cap_mask` `"0xa751e848"`), normalised to `0x` + lower."""
    return f"0x{parse_hex_int(text, what):08x}"


def parse_guid(text: str, what: str = "GUID") -> str:
    """`"0a7f:bc12:45ef:d23b"` (4 groups of 4 hex digits), lower-cased.

    node_guid may lack the trailing newline in captured trees; stripping covers both.
    """
    value = text.strip()
    if _GUID.fullmatch(value) is None:
        raise ParseError(what, text, "expected xxxx:xxxx:xxxx:xxxx")
    return value.lower()


def parse_gid(text: str) -> str:
    """A GID table entry, 8 groups of 4 hex digits (`%pI6` without compression), lowered."""
    value = text.strip()
    if _GID.fullmatch(value) is None:
        raise ParseError("GID", text, "expected 8 colon-separated groups of 4 hex digits")
    return value.lower()


def parse_pkey(text: str) -> str:
    """A P_Key table entry, printed "0x%04x": normalised to `0x` + 4 lower hex digits."""
    value = parse_hex_int(text, "P_Key")
    if value > 0xFFFF:
        raise ParseError("P_Key", text, "wider than 16 bits")
    return f"0x{value:04x}"


def parse_counter(data: bytes | str) -> int | None:
    """A counter file's value; `"N/A (no PMA)"` (no performance management agent) -> None.

    Takes bytes as read by the hot loop's pread. The value is returned as the kernel
    printed it: PMA error counters saturate at their width (4294967295 for a 32-bit one)
    and that saturation is information, not garbage.
    """
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
    value = raw.strip()
    # bytes.isdigit() is ASCII-only, so no Unicode digit or sign ever reaches int().
    if value.isdigit():
        number = int(value)
        if number > _U64_MAX:
            raise ParseError("counter", value.decode(), "larger than 64 bits")
        return number
    if value == _NO_PMA_BYTES:
        return None
    raise ParseError("counter", raw.decode("utf-8", "replace"), "expected an unsigned decimal")


def data_octets(
    counters: dict[str, int], counters_ext: dict[str, int]
) -> tuple[int | None, int | None]:
    """(rx, tx) bytes: PortRcvData/PortXmitData count 4-octet units.

    `counters/port_*_data` first; the mlx4-era `counters_ext/port_*_data_64` when the
    former is absent or stuck at its 32-bit maximum (a saturated PMA counter).
    """

    def octets(name: str) -> int | None:
        value = counters.get(f"port_{name}_data")
        extended = counters_ext.get(f"port_{name}_data_64")
        if extended is not None and (value is None or value == U32_SATURATED):
            value = extended
        return None if value is None else value * 4

    return octets("rcv"), octets("xmit")


def parse_decimal(text: str, what: str, *, minimum: int | None = None) -> int:
    """A signed decimal integer (mtu, dev_port, type, ...), optionally bounded below."""
    value = text.strip()
    if _DECIMAL.fullmatch(value) is None or len(value) > 20:
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


def parse_string(text: str) -> str:
    """A free-text attribute (fw_ver, board_id, hca_type, ...), stripped.

    Empty, or holding control characters or undecodable bytes (shown as U+FFFD by the
    reader), is not an attribute value but junk: ParseError.
    """
    value = text.strip()
    if not value:
        raise ParseError("text attribute", text, "empty")
    if not value.isprintable() or "\ufffd" in value:
        raise ParseError("text attribute", text, "not printable text")
    return value


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


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key putting mlx5_2 before mlx5_10 (and uverbs2 before uverbs10)."""
    return tuple(
        (int(token), "") if index % 2 else (-1, token)
        for index, token in enumerate(_DIGIT_RUNS.split(name))
    )
