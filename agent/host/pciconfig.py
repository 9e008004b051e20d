"""Pure reading of PCI configuration space bytes: the ACS extended capability.

Takes the bytes of a function's sysfs `config` file and walks the PCIe extended
capability list the way the kernel's pci_find_next_ext_capability() does. No I/O: the
caller reads the file. Junk never raises anything but ParseError.
"""

from __future__ import annotations

from typing import Final

from agent.errors import ParseError

# The kustomize overlay that grants CAP_SYS_ADMIN: named in the error so the data-quality
# finding that shows it says how to turn ACS from unknown into known.
ACS_OVERLAY: Final = "deploy/overlays/acs"
HEADER_SIZE: Final = 64  # what an unprivileged reader gets (type 0/1 header)
CARDBUS_HEADER_SIZE: Final = 128  # ... and of a CardBus bridge
CONFIG_SPACE_SIZE: Final = 256  # conventional PCI: no extended capabilities
EXT_CONFIG_SPACE_SIZE: Final = 4096
ACS_CAP_ID: Final = 0x000D
ACS_CTRL_OFFSET: Final = 6  # Capability header (4) + ACS Capability register (2)
ACS_SV: Final = 0x01  # Source Validation
ACS_TB: Final = 0x02  # Translation Blocking
ACS_RR: Final = 0x04  # P2P Request Redirect
ACS_CR: Final = 0x08  # P2P Completion Redirect
ACS_UF: Final = 0x10  # Upstream Forwarding
# The bits that stop peer-to-peer traffic from taking the short way through a switch.
ACS_REDIRECT_BITS: Final = ACS_SV | ACS_RR | ACS_CR
# Each capability takes at least 8 bytes: the kernel's bound on walking a looped list.
_MAX_CAPABILITIES: Final = (EXT_CONFIG_SPACE_SIZE - CONFIG_SPACE_SIZE) // 8


class HeaderOnly(ParseError):
    """Exactly the header an unprivileged read returns: drivers/pci/pci-sysfs.c cuts a
    `config` read to 64 bytes (128 for CardBus) without CAP_SYS_ADMIN, so everything
    beyond it, ACS included, is unknown, not absent."""

    def __init__(self, config: bytes) -> None:
        super().__init__(
            "PCI config space",
            _hex(config),
            "extended config space not readable: needs CAP_SYS_ADMIN "
            f"(read {len(config)} bytes, the header only), so ACS is unknown; "
            f"enable {ACS_OVERLAY}",
        )


def _dword(config: bytes, offset: int) -> int:
    return int.from_bytes(config[offset : offset + 4], "little")


def find_ext_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of extended capability `cap_id`, or None when the function lacks it.

    Raises ParseError when the bytes cannot tell: shorter than the 64-byte header,
    truncated between 64 and 256 bytes, or a capability chain pointing past the data;
    HeaderOnly (a ParseError) for exactly the 64 or 128 bytes an unprivileged read shows.
    """
    size = len(config)
    if size < HEADER_SIZE:
        raise ParseError("PCI config space", _hex(config), f"only {size} bytes")
    if size in (HEADER_SIZE, CARDBUS_HEADER_SIZE):
        raise HeaderOnly(config)
    if size < CONFIG_SPACE_SIZE:
        raise ParseError("PCI config space", _hex(config), f"truncated to {size} bytes")
    if size < CONFIG_SPACE_SIZE + 4:
        return None  # conventional PCI function or a 256-byte read: no extended space
    offset = CONFIG_SPACE_SIZE
    for _ in range(_MAX_CAPABILITIES):
        if offset + 4 > size:
            raise ParseError("PCI config space", _hex(config), f"capability at {offset:#x}")
        header = _dword(config, offset)
        # 0 means "no capabilities"; all ones is what a vanished device reads back.
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
        if offset < CONFIG_SPACE_SIZE:  # the end of the list (next == 0), as the kernel has it
            return None
    raise ParseError("PCI config space", _hex(config), "extended capability list loops")


def parse_acs_control(config: bytes) -> int | None:
    """The ACS Control register (16 bits), None when the function has no ACS capability."""
    offset = find_ext_capability(config, ACS_CAP_ID)
    if offset is None:
        return None
    start = offset + ACS_CTRL_OFFSET
    if start + 2 > len(config):
        raise ParseError("PCI config space", _hex(config), "ACS capability cut short")
    return int.from_bytes(config[start : start + 2], "little")


def acs_redirects(control: int) -> bool:
    """Source Validation, P2P Request or Completion Redirect enabled: peer-to-peer
    traffic below this bridge is validated or sent up to the root complex."""
    return bool(control & ACS_REDIRECT_BITS)


def _hex(config: bytes) -> str:
    return config[:16].hex()
