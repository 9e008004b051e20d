"""PCI config space images: exact bytes of the header and the capability lists, ACS on
root/downstream ports, SR-IOV on PFs, and rendered trees whose `config` agrees with the
text files next to it. The walkers here are written from the PCI spec, independently of
agent.lab.pciconfig."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from agent.lab import pciconfig
from agent.lab.pciconfig import Config, Sriov, build
from agent.lab.render import render
from agent.lab.spec import load_builtin

PCI = "bus/pci/devices"


def _u16(data: bytes, offset: int) -> int:
    return int(struct.unpack_from("<H", data, offset)[0])


def _u32(data: bytes, offset: int) -> int:
    return int(struct.unpack_from("<I", data, offset)[0])


def _caps(data: bytes) -> dict[int, int]:
    """Standard list: status bit 4, pointer at 0x34, each cap [id, next]. id -> offset."""
    assert _u16(data, 0x06) & 0x10
    out: dict[int, int] = {}
    offset = data[0x34]
    while offset:
        assert offset >= 0x40 and offset not in out.values()
        out[data[offset]] = offset
        offset = data[offset + 1]
    return out


def _ext_caps(data: bytes) -> dict[int, tuple[int, int]]:
    """Extended list from 0x100: 16-bit id, 4-bit version, 12-bit next. id -> (offset, v)."""
    out, offset = {}, 0x100
    while offset:
        header = _u32(data, offset)
        out[header & 0xFFFF] = (offset, header >> 16 & 0xF)
        offset = header >> 20
        assert offset == 0 or offset >= 0x100
    return out


def _acs_control(data: bytes) -> int | None:
    ext = _ext_caps(data)
    return _u16(data, ext[0x000D][0] + 6) if 0x000D in ext else None


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("h100")
    render(load_builtin("h100-ib-12nic"), root)
    return root


@pytest.fixture(scope="module")
def acs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("acs")
    render(load_builtin("h100-iommu-acs"), root)
    return root


def test_bridge_image_bytes() -> None:
    link = (4, 8, 5, 16)
    data = build(
        Config(style="bridge", vendor=0x1000, device=0xC030, subsystem_vendor=0x1000,
               subsystem_device=0xC030, class_code=0x060400, port_type=pciconfig.PCIE_DOWNSTREAM,
               link=link, buses=(0x17, 0x19, 0x1A), acs=(0x5F, 0x1D))
    )  # fmt: skip
    assert len(data) == 4096
    assert data[0:4] == bytes([0x00, 0x10, 0x30, 0xC0])  # vendor, device little endian
    assert data[0x08:0x0C] == bytes([0x00, 0x00, 0x04, 0x06])  # revision, prog-if, sub, class
    assert data[0x0E] == 0x01  # type 1 header
    assert data[0x18:0x1B] == bytes([0x17, 0x19, 0x1A])  # primary, secondary, subordinate
    caps = _caps(data)
    assert set(caps) == {0x10, 0x05, 0x0D, 0x01}  # PCIe, MSI, bridge subsystem ids, PM
    exp = caps[0x10]
    assert _u16(data, exp + 2) >> 4 & 0xF == 0x6  # downstream switch port
    assert _u16(data, exp + 0x12) & 0xF == 4 and _u16(data, exp + 0x12) >> 4 & 0x3F == 8
    assert _u32(data, exp + 0x0C) & 0xF == 5 and _u32(data, exp + 0x0C) >> 4 & 0x3F == 16
    assert _u32(data, exp + 0x2C) == 0b111110  # 2.5 .. 32 GT/s supported
    assert _u16(data, caps[0x0D] + 4) == 0x1000  # subsystem vendor of a bridge
    ext = _ext_caps(data)
    assert list(ext) == [0x0001, 0x000D]  # AER first, the walk must follow `next`
    offset, version = ext[0x000D]
    assert (version, _u16(data, offset + 4), _u16(data, offset + 6)) == (1, 0x5F, 0x1D)


def test_endpoint_image_with_sriov_and_multifunction() -> None:
    sriov = Sriov(total=8, num=2, offset=2, stride=1, vf_device=0x101E, function=0)
    data = build(
        Config(style="nic", vendor=0x15B3, device=0x101D, subsystem_vendor=0x15B3,
               subsystem_device=0x0016, class_code=0x020000, link=(4, 16, 4, 16),
               multifunction=True, sriov=sriov, ari_next=1)
    )  # fmt: skip
    assert data[0x0E] == 0x80  # type 0, multi-function
    assert (_u16(data, 0x2C), _u16(data, 0x2E)) == (0x15B3, 0x0016)
    assert data[0x34] == 0x60 and _caps(data)[0x10] == 0x60  # ConnectX lists PCIe first
    ext = _ext_caps(data)
    assert 0x000D not in ext
    assert data[ext[0x000E][0] + 5] == 1  # ARI next function
    s = ext[0x0010][0]
    fields = [_u16(data, s + o) for o in (0x0E, 0x10, 0x12, 0x14, 0x16, 0x1A)]
    assert fields == [8, 2, 0, 2, 1, 0x101E]  # total, num, dependency, offset, stride, VF id
    assert _u16(data, s + 8) & 0x9 == 0x9  # VF enable + VF memory space


def test_vf_image_reads_ffff_ids_and_no_link() -> None:
    data = build(
        Config(style="vf", vendor=0x15B3, device=0x101E, subsystem_vendor=0x15B3,
               subsystem_device=0, class_code=0x020700)
    )  # fmt: skip
    assert data[0:4] == b"\xff\xff\xff\xff"
    exp = _caps(data)[0x10]
    assert _u32(data, exp + 0x0C) == 0 and _u16(data, exp + 0x12) == 0


def test_gpu_list_does_not_start_with_pcie() -> None:
    data = build(
        Config(style="gpu", vendor=0x10DE, device=0x2330, subsystem_vendor=0x10DE,
               subsystem_device=0x16C1, class_code=0x030200, link=(5, 16, 5, 16))
    )  # fmt: skip
    assert data[data[0x34]] == 0x01  # power management first, as on an H100
    assert list(_caps(data)) == [0x01, 0x05, 0x10, 0x09]
    assert list(_ext_caps(data)) == [0x0002, 0x0001]


def test_edits_and_lookups() -> None:
    base = Config(style="bridge", vendor=1, device=2, subsystem_vendor=1, subsystem_device=2,
                  class_code=0x060400, port_type=pciconfig.PCIE_ROOT_PORT,
                  link=(5, 16, 5, 16), acs=(0x1F, 0))  # fmt: skip
    data = build(base)
    assert pciconfig.acs_control(pciconfig.with_acs_control(data, 0x1D)) == 0x1D
    narrowed = pciconfig.with_link_width(data, 4)
    exp = _caps(narrowed)[0x10]
    assert _u16(narrowed, exp + 0x12) >> 4 & 0x3F == 4 and _u16(narrowed, exp + 0x12) & 0xF == 5
    upstream = build(base._replace(port_type=pciconfig.PCIE_UPSTREAM, acs=None))
    assert pciconfig.acs_control(upstream) is None
    with pytest.raises(ValueError, match="no ACS"):
        pciconfig.with_acs_control(upstream, 0)
    assert pciconfig.find_capability(upstream, 0x11) is None


def test_every_rendered_function_has_a_consistent_config(h100: Path) -> None:
    functions = sorted(os.listdir(h100 / PCI))
    assert len(functions) == 8 + 12 + 8 * 4 + 2  # GPUs, NICs, root+up+2 down, 2 extra DSPs
    for address in functions:
        d = h100 / PCI / address
        data = (d / "config").read_bytes()
        text = {n: (d / n).read_text().strip() for n in ("vendor", "device", "class")}
        assert len(data) == 4096, address
        assert f"0x{_u16(data, 0):04x}" == text["vendor"], address
        assert f"0x{_u16(data, 2):04x}" == text["device"], address
        assert f"0x{_u32(data, 8) >> 8:06x}" == text["class"], address
        bridge = text["class"] == "0x060400"
        assert data[0x0E] & 0x7F == (1 if bridge else 0), address
        exp = _caps(data)[0x10]
        status = _u16(data, exp + 0x12)
        speed = {4: "16.0", 5: "32.0"}[status & 0xF]
        assert (d / "current_link_speed").read_text() == f"{speed} GT/s PCIe\n", address
        assert (d / "current_link_width").read_text() == f"{status >> 4 & 0x3F}\n", address
        port_type = _u16(data, exp + 2) >> 4 & 0xF
        # ACS on root ports (4) and downstream ports (6), disabled unless the spec says so.
        assert _acs_control(data) == (0 if port_type in (4, 6) else None), address


def test_functions_of_a_dual_port_card_are_multifunction(h100: Path) -> None:
    for address in ("0000:1a:00.0", "0000:1a:00.1"):
        assert (h100 / PCI / address / "config").read_bytes()[0x0E] == 0x80
    assert (h100 / PCI / "0000:19:00.0" / "config").read_bytes()[0x0E] == 0x00


def test_bridge_bus_numbers_span_what_hangs_below(h100: Path) -> None:
    root_port = (h100 / PCI / "0000:15:01.0" / "config").read_bytes()
    assert root_port[0x18:0x1B] == bytes([0x15, 0x16, 0x1A])
    downstream = (h100 / PCI / "0000:17:02.0" / "config").read_bytes()
    assert downstream[0x18:0x1B] == bytes([0x17, 0x1A, 0x1A])


@pytest.mark.parametrize(
    ("address", "control"),
    [
        pytest.param("0000:15:01.0", 0x1D, id="root-port-enabled-by-host-bridge"),
        pytest.param("0000:17:00.0", 0x1D, id="gpu0-downstream-port"),
        pytest.param("0000:17:01.0", 0x1D, id="nic0-downstream-port"),
        pytest.param("0000:97:01.0", 0x1D, id="root-port-socket-1"),
        pytest.param("0000:99:00.0", 0x00, id="gpu1-port-fixed-by-hand"),
        pytest.param("0000:99:01.0", 0x00, id="nic1-port-fixed-by-hand"),
        pytest.param("0000:16:00.0", None, id="upstream-port-has-none"),
        pytest.param("0000:19:00.0", None, id="endpoint-has-none"),
    ],
)
def test_acs_control_per_bridge(acs: Path, address: str, control: int | None) -> None:
    assert _acs_control((acs / PCI / address / "config").read_bytes()) == control


def test_acs_on_the_gpu_nic_path(acs: Path) -> None:
    """Walk GPU0 -> mlx5_0 the way the agent will: the chain from sysfs, ACS from config."""
    nic = (acs / "class/infiniband/mlx5_0/device").resolve()
    gpu = (acs / PCI / "0000:18:00.0").resolve()
    shared = [p for p in nic.parents if p in gpu.parents and p.name.startswith("0000:")]
    below = {p.name for p in [*nic.parents, *gpu.parents] if p.name.startswith("0000:")}
    assert [p.name for p in shared] == ["0000:16:00.0", "0000:15:01.0"]
    on = {a for a in below if _acs_control((acs / PCI / a / "config").read_bytes())}
    assert on == {"0000:15:01.0", "0000:17:00.0", "0000:17:01.0"}


def test_pf_and_vf_config_in_the_tree(acs: Path) -> None:
    pf = (acs / PCI / "0000:19:00.0" / "config").read_bytes()
    s = _ext_caps(pf)[0x0010][0]
    assert [_u16(pf, s + o) for o in (0x0E, 0x10, 0x14, 0x16, 0x1A)] == [8, 2, 1, 1, 0x101E]
    vf = (acs / PCI / "0000:19:00.1" / "config").read_bytes()
    assert len(vf) == 4096 and vf[0:4] == b"\xff\xff\xff\xff"
    assert (acs / PCI / "0000:19:00.1" / "device").read_text() == "0x101e\n"
