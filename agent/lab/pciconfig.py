"""PCI configuration space images: the 4096 bytes root reads from a PCIe function's sysfs
`config` file. Type 0/1 header, the standard capability list (PCI Express among PM, MSI,
MSI-X, ...) and the extended list from 0x100 (AER, ARI, ACS on root/downstream ports,
SR-IOV on physical functions). Pure: registers in, bytes out; all fields little endian.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Literal, NamedTuple

CONFIG_SIZE = 4096  # PCIe extended configuration space
EXT_START = 0x100
CAP_POINTER = 0x34
STATUS_CAP_LIST = 0x0010  # status register bit: a capability list starts at 0x34
# Standard capability ids.
CAP_PM, CAP_MSI, CAP_VNDR, CAP_SSVID, CAP_EXP, CAP_MSIX = 0x01, 0x05, 0x09, 0x0D, 0x10, 0x11
# Extended capability ids.
EXT_AER, EXT_VC, EXT_ACS, EXT_ARI, EXT_SRIOV = 0x0001, 0x0002, 0x000D, 0x000E, 0x0010
ACS_CAP_REG, ACS_CTRL_REG = 4, 6  # offsets inside the ACS capability
# PCI Express capability: device/port type (bits 7:4 of the capabilities register).
PCIE_ENDPOINT, PCIE_ROOT_PORT, PCIE_UPSTREAM, PCIE_DOWNSTREAM = 0x0, 0x4, 0x5, 0x6
LINK_CAP, LINK_STATUS = 0x0C, 0x12  # offsets inside the PCI Express capability

Style = Literal["bridge", "nic", "vf", "gpu"]


class Sriov(NamedTuple):
    total: int
    num: int
    offset: int  # first VF routing ID - PF routing ID
    stride: int
    vf_device: int
    function: int  # the PF's function number (function dependency link)


class Config(NamedTuple):
    style: Style  # which capability layout (they differ between real devices)
    vendor: int
    device: int
    subsystem_vendor: int
    subsystem_device: int
    class_code: int  # 24 bits: class, subclass, programming interface
    port_type: int = PCIE_ENDPOINT
    link: tuple[int, int, int, int] | None = None  # gen, width, max gen, max width
    revision: int = 0
    multifunction: bool = False
    buses: tuple[int, int, int] = (0, 0, 0)  # bridges: primary, secondary, subordinate
    acs: tuple[int, int] | None = None  # capability, control
    sriov: Sriov | None = None
    ari_next: int = 0  # ARI: next function number of the device (0 = last)


def build(fn: Config) -> bytes:
    """The whole 4096-byte image of one function."""
    buf = bytearray(CONFIG_SIZE)
    vf = fn.style == "vf"
    # SR-IOV: a VF's own Vendor/Device ID registers read 0xffff; the kernel takes the ids
    # from the PF's SR-IOV capability, which is what sysfs `vendor`/`device` show.
    _put16(buf, 0x00, 0xFFFF if vf else fn.vendor)
    _put16(buf, 0x02, 0xFFFF if vf else fn.device)
    command = 0x0406 if vf else 0x0547 if fn.style == "bridge" else 0x0546
    _put16(buf, 0x04, command)  # memory space, bus master, SERR, INTx disabled
    _put16(buf, 0x06, STATUS_CAP_LIST)
    _put32(buf, 0x08, fn.class_code << 8 | fn.revision)  # 0x08 revision, 0x09..0x0b class
    header = 0x01 if fn.style == "bridge" else 0x00
    buf[0x0E] = header | (0x80 if fn.multifunction else 0)
    if fn.style == "bridge":
        buf[0x18], buf[0x19], buf[0x1A] = fn.buses
    else:
        _put16(buf, 0x2C, fn.subsystem_vendor)
        _put16(buf, 0x2E, fn.subsystem_device)
    buf[0x3C], buf[0x3D] = 0xFF, 0 if vf else 1  # IRQ line unknown, INTA (VFs have none)
    standard, extended = _LAYOUTS[fn.style]
    buf[CAP_POINTER] = standard[0][0]
    _chain(buf, fn, standard, extended=False)
    # ACS only on root/downstream ports, SR-IOV only on PFs that have it.
    absent = {EXT_ACS} if fn.acs is None else set()
    absent |= {EXT_SRIOV} if fn.sriov is None else set()
    _chain(buf, fn, [c for c in extended if c[1] not in absent], extended=True)
    return bytes(buf)


def find_capability(data: bytes, cap_id: int) -> int | None:
    """Offset of a standard capability, walking the list from 0x34."""
    offset, seen = data[CAP_POINTER] & 0xFC, set()
    while offset and offset not in seen and offset + 2 <= len(data):
        seen.add(offset)
        if data[offset] == cap_id:
            return offset
        offset = data[offset + 1] & 0xFC
    return None


def find_ext_capability(data: bytes, cap_id: int) -> int | None:
    """Offset of an extended capability, walking the list from 0x100."""
    offset, seen = EXT_START, set()
    while offset and offset not in seen and offset + 4 <= len(data):
        seen.add(offset)
        header = struct.unpack_from("<I", data, offset)[0]
        if header & 0xFFFF == cap_id:
            return offset
        offset = header >> 20
    return None


def with_acs_control(data: bytes, control: int) -> bytes:
    """The image with a new ACS control register (what `setpci ECAP_ACS+6.w=...` does)."""
    offset = find_ext_capability(data, EXT_ACS)
    if offset is None:
        raise ValueError("no ACS capability")
    out = bytearray(data)
    _put16(out, offset + ACS_CTRL_REG, control)
    return bytes(out)


def acs_control(data: bytes) -> int | None:
    offset = find_ext_capability(data, EXT_ACS)
    return None if offset is None else int.from_bytes(data[offset + 6 : offset + 8], "little")


def with_link_width(data: bytes, width: int) -> bytes:
    """The image with a new negotiated width in the Link Status register."""
    offset = find_capability(data, CAP_EXP)
    if offset is None:
        raise ValueError("no PCI Express capability")
    out = bytearray(data)
    status = int.from_bytes(out[offset + LINK_STATUS : offset + LINK_STATUS + 2], "little")
    _put16(out, offset + LINK_STATUS, status & ~0x03F0 | width << 4)
    return bytes(out)


def _put16(buf: bytearray, offset: int, value: int) -> None:
    struct.pack_into("<H", buf, offset, value)


def _put32(buf: bytearray, offset: int, value: int) -> None:
    struct.pack_into("<I", buf, offset, value)


def _pcie(buf: bytearray, at: int, fn: Config) -> None:
    bridge_down = fn.port_type in (PCIE_ROOT_PORT, PCIE_DOWNSTREAM)
    # Capabilities register: version 2, device/port type, "slot implemented" on ports.
    _put16(buf, at + 2, 0x2 | fn.port_type << 4 | (0x100 if bridge_down else 0))
    _put32(buf, at + 0x04, 0x8000 | 0x2)  # DevCap: role-based errors, 512-byte max payload
    _put16(buf, at + 0x08, 0x2 << 12 | 0x1 << 5 | 0xF)  # DevCtl: MRRS 512, MPS 256, errors
    if fn.link is not None:  # VF link registers are reserved and read 0
        gen, width, max_gen, max_width = fn.link
        dll = 0x100000 if bridge_down else 0  # data link layer active reporting capable
        port_number = (fn.buses[0] if bridge_down else 0) & 0xFF
        _put32(buf, at + LINK_CAP, port_number << 24 | dll | 0x3 << 10 | max_width << 4 | max_gen)
        active = 0x2000 if bridge_down else 0
        _put16(buf, at + LINK_STATUS, 0x1000 | active | width << 4 | gen)  # slot clock
        _put32(buf, at + 0x2C, sum(1 << g for g in range(1, max_gen + 1)))  # speeds vector
        _put16(buf, at + 0x30, max_gen)  # LnkCtl2: target link speed
    if bridge_down:
        _put32(buf, at + 0x24, 0x20)  # DevCap2: ARI forwarding supported
        _put16(buf, at + 0x28, 0x20)  # DevCtl2: ARI forwarding enabled


def _acs(buf: bytearray, at: int, fn: Config) -> None:
    capability, control = fn.acs or (0, 0)
    _put16(buf, at + ACS_CAP_REG, capability)
    _put16(buf, at + ACS_CTRL_REG, control)


def _sriov(buf: bytearray, at: int, fn: Config) -> None:
    s = fn.sriov or Sriov(0, 0, 0, 0, 0, 0)
    _put16(buf, at + 0x08, (0x1 | 0x8 | 0x10) if s.num else 0x10)  # VF enable + MSE, ARI
    for offset, value in (
        (0x0C, s.total),
        (0x0E, s.total),
        (0x10, s.num),
        (0x12, s.function),
        (0x14, s.offset),
        (0x16, s.stride),
        (0x1A, s.vf_device),
    ):
        _put16(buf, at + offset, value)
    _put32(buf, at + 0x1C, 0x553)  # supported page sizes 4K..
    _put32(buf, at + 0x20, 0x1)  # system page size 4K


def _ssvid(buf: bytearray, at: int, fn: Config) -> None:
    _put16(buf, at + 4, fn.subsystem_vendor)  # bridges keep subsystem ids in a capability
    _put16(buf, at + 6, fn.subsystem_device)


def _fixed(**fields: int) -> Callable[[bytearray, int, Config], None]:
    def write(buf: bytearray, at: int, fn: Config) -> None:
        for offset, value in fields.items():
            _put16(buf, at + int(offset[1:], 16), value)

    return write


def _ari(buf: bytearray, at: int, fn: Config) -> None:
    _put16(buf, at + 4, fn.ari_next << 8)


Body = Callable[[bytearray, int, Config], None]
_PM = _fixed(x2=0x0003, x4=0x0008)  # PMC version 3; PMCSR D0, no soft reset
_MSI = _fixed(x2=0x0080)  # 64-bit address capable
_MSIX = _fixed(x2=0x803F)  # enabled, 64 vectors
_VNDR = _fixed(x2=0x0014)  # vendor-specific length
_NONE = _fixed()
# (offset, id, body) in list order; the order and offsets follow lspci of real parts:
# Broadcom/Intel ports list PCIe first, ConnectX starts at [60] Express, H100 at [60] PM.
_LAYOUTS: dict[Style, tuple[list[tuple[int, int, Body]], list[tuple[int, int, Body]]]] = {
    "bridge": (
        [(0x40, CAP_EXP, _pcie), (0x80, CAP_MSI, _MSI), (0x90, CAP_SSVID, _ssvid),
         (0xA0, CAP_PM, _PM)],
        [(0x100, EXT_AER, _NONE), (0x148, EXT_ACS, _acs)],
    ),
    "nic": (
        [(0x60, CAP_EXP, _pcie), (0x9C, CAP_MSIX, _MSIX), (0x40, CAP_PM, _PM)],
        [(0x100, EXT_AER, _NONE), (0x150, EXT_ARI, _ari), (0x180, EXT_SRIOV, _sriov)],
    ),
    "vf": ([(0x60, CAP_EXP, _pcie), (0x9C, CAP_MSIX, _MSIX)], [(0x100, EXT_ARI, _ari)]),
    "gpu": (
        [(0x60, CAP_PM, _PM), (0x68, CAP_MSI, _MSI), (0x78, CAP_EXP, _pcie),
         (0xB4, CAP_VNDR, _VNDR)],
        [(0x100, EXT_VC, _NONE), (0x420, EXT_AER, _NONE)],
    ),
}  # fmt: skip
# Extended capability versions (AER and SR-IOV report 2 and 1 on current parts).
_EXT_VERSION = {EXT_AER: 2, EXT_VC: 1, EXT_ACS: 1, EXT_ARI: 1, EXT_SRIOV: 1}


def _chain(buf: bytearray, fn: Config, caps: list[tuple[int, int, Body]], extended: bool) -> None:
    for i, (offset, cap_id, body) in enumerate(caps):
        following = caps[i + 1][0] if i + 1 < len(caps) else 0
        if extended:  # 16-bit id, 4-bit version, 12-bit next pointer
            _put32(buf, offset, following << 20 | _EXT_VERSION[cap_id] << 16 | cap_id)
        else:  # 8-bit id, 8-bit next pointer
            buf[offset], buf[offset + 1] = cap_id, following
        body(buf, offset, fn)
