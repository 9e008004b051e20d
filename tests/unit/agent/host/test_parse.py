"""Table tests of the pure sysfs parsers: kernel formats, old-kernel variants, garbage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import ParseError
from agent.host import parse, pciparse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("4: ACTIVE\n", (4, "ACTIVE"), id="active"),
        pytest.param("1: DOWN\n", (1, "DOWN"), id="down"),
        pytest.param("2: INIT\n", (2, "INIT"), id="init"),
        pytest.param("3: ARMED\n", (3, "ARMED"), id="armed"),
        pytest.param("0: NOP\n", (0, "NOP"), id="nop"),
        pytest.param("5: ACTIVE_DEFER\n", (5, "ACTIVE_DEFER"), id="active-defer"),
        pytest.param("9: UNKNOWN\n", (9, "UNKNOWN"), id="kernel-out-of-range"),
        pytest.param("4: SOMETHING\n", (4, "UNKNOWN"), id="unknown-name"),
        pytest.param("4: ACTIVE", (4, "ACTIVE"), id="no-newline"),
    ],
)
def test_parse_port_state(text: str, expected: tuple[int, str]) -> None:
    assert parse.parse_port_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("5: LinkUp\n", (5, "LinkUp"), id="link-up"),
        pytest.param("3: Disabled\n", (3, "Disabled"), id="disabled"),
        pytest.param("2: Polling\n", (2, "Polling"), id="polling"),
        pytest.param("7: Phy Test\n", (7, "Phy Test"), id="name-with-space"),
        pytest.param("0: <unknown>\n", (0, None), id="kernel-unknown"),
        pytest.param("4: ACTIVE\n", (4, "ACTIVE"), id="captured-mlx5-nonstandard-name"),
    ],
)
def test_parse_phys_state(text: str, expected: tuple[int, str | None]) -> None:
    assert parse.parse_phys_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1: CA\n", "CA", id="ca"),
        pytest.param("4: RNIC\n", "RNIC", id="rnic"),
        pytest.param("6: usNIC UDP\n", "usNIC UDP", id="usnic-udp"),
        pytest.param("9: <unknown>\n", None, id="unknown"),
    ],
)
def test_parse_node_type(text: str, expected: str | None) -> None:
    assert parse.parse_node_type(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("400 Gb/sec (4X NDR)\n", (400.0, 4, "NDR"), id="ndr"),
        pytest.param("200 Gb/sec (4X HDR)\n", (200.0, 4, "HDR"), id="hdr"),
        pytest.param("100 Gb/sec (4X EDR)\n", (100.0, 4, "EDR"), id="edr"),
        pytest.param("25 Gb/sec (1X EDR)\n", (25.0, 1, "EDR"), id="edr-1x"),
        pytest.param("56 Gb/sec (4X FDR)\n", (56.0, 4, "FDR"), id="fdr"),
        pytest.param("40 Gb/sec (4X FDR10)\n", (40.0, 4, "FDR10"), id="fdr10"),
        pytest.param("2.5 Gb/sec (1X SDR)\n", (2.5, 1, "SDR"), id="half-rate-sdr"),
        pytest.param("10 Gb/sec (4X)\n", (10.0, 4, None), id="old-kernel-no-speed-name"),
        pytest.param("800 Gb/sec (8X XDR)\n", (800.0, 8, "XDR"), id="xdr-8x"),
        pytest.param("300 Gb/sec (12X EDR)\n", (300.0, 12, "EDR"), id="12x"),
        pytest.param("40 Gb/sec\n", (40.0, None, None), id="no-width"),
    ],
)
def test_parse_rate(text: str, expected: tuple[float, int | None, str | None]) -> None:
    assert parse.parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("InfiniBand\n", "InfiniBand", id="ib"),
        pytest.param("Ethernet\n", "Ethernet", id="roce"),
        pytest.param("Unknown\n", "Unknown", id="unknown"),
        pytest.param("InfiniBand\n\n", "InfiniBand", id="blank-second-line"),
        pytest.param("infiniband", "InfiniBand", id="case-insensitive"),
    ],
)
def test_parse_link_layer(text: str, expected: str) -> None:
    assert parse.parse_link_layer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0x1f\n", 31, id="lid"),
        pytest.param("0x0\n", 0, id="roce-lid-zero"),
        pytest.param("0xFFFF\n", 0xFFFF, id="upper-case"),
        pytest.param("1a", 26, id="no-prefix"),
    ],
)
def test_parse_hex_int(text: str, expected: int) -> None:
    assert parse.parse_hex_int(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0a7f:bc12:45ef:d23b", "0a7f:bc12:45ef:d23b", id="no-trailing-newline"),
        pytest.param("0A7F:BC12:45EF:D23B\n", "0a7f:bc12:45ef:d23b", id="lower-cased"),
    ],
)
def test_parse_guid(text: str, expected: str) -> None:
    assert parse.parse_guid(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0\n", 0, id="zero"),
        pytest.param("6825908347\n", 6825908347, id="above-32-bit"),
        pytest.param("4294967295\n", 4294967295, id="saturated-32-bit-kept"),
        pytest.param("18446744073709551615\n", 2**64 - 1, id="u64-max"),
        pytest.param("N/A (no PMA)\n", None, id="no-pma"),
        pytest.param("  42  \n", 42, id="surrounding-space"),
    ],
)
def test_parse_counter(text: str, expected: int | None) -> None:
    assert parse.parse_counter(text) == expected
    assert parse.parse_counter(text.encode()) == expected  # what pread returns


@given(st.binary(max_size=80))
def test_parse_counter_takes_any_bytes(data: bytes) -> None:
    try:
        value = parse.parse_counter(data)
    except ParseError:
        return
    assert value is None or 0 <= value < 2**64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("16.0 GT/s PCIe\n", 16.0, id="gen4"),
        pytest.param("32.0 GT/s PCIe\n", 32.0, id="gen5"),
        pytest.param("2.5 GT/s PCIe\n", 2.5, id="gen1"),
        pytest.param("8 GT/s\n", 8.0, id="old-kernel-gen3"),
        pytest.param("2.5 GT/s\n", 2.5, id="old-kernel-gen1"),
        pytest.param("Unknown\n", None, id="unknown"),
        pytest.param("Unknown speed\n", None, id="old-kernel-unknown"),
    ],
)
def test_parse_link_speed(text: str, expected: float | None) -> None:
    assert pciparse.parse_link_speed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("16\n", 16, id="x16"),
        pytest.param("0\n", 0, id="link-down"),
    ],
)
def test_parse_link_width(text: str, expected: int) -> None:
    assert pciparse.parse_link_width(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("-1\n", None, id="unknown"),
        pytest.param("0\n", 0, id="node-0"),
        pytest.param("3\n", 3, id="node-3"),
    ],
)
def test_parse_numa_node(text: str, expected: int | None) -> None:
    assert pciparse.parse_numa_node(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0000:3b:00.0\n", "0000:3b:00.0", id="plain"),
        pytest.param("0000:3B:00.1", "0000:3b:00.1", id="lower-cased"),
        pytest.param("10000:01:00.0", "10000:01:00.0", id="vmd-domain"),
    ],
)
def test_parse_pci_address(text: str, expected: str) -> None:
    assert pciparse.parse_pci_address(text) == expected


@pytest.mark.parametrize(
    ("devpath", "expected"),
    [
        pytest.param(
            "/devices/pci0000:00/0000:00:02.1/0000:01:00.0",
            ("0000:01:00.0", ("pci0000:00", "0000:00:02.1")),
            id="behind-root-port",
        ),
        pytest.param(
            "/devices/pci0000:00/0000:00:1f.6",
            ("0000:00:1f.6", ("pci0000:00",)),
            id="on-root-complex",
        ),
        pytest.param(
            "/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0",
            ("0000:1a:00.0", ("pci0000:17", "0000:17:01.0", "0000:18:00.0", "0000:19:00.0")),
            id="behind-pcie-switch",
        ),
        pytest.param(
            "/devices/pci0000:00/0000:00:0e.0/pci10000:00/10000:00:02.0/10000:01:00.0",
            ("10000:01:00.0", ("pci0000:00", "0000:00:0e.0", "pci10000:00", "10000:00:02.0")),
            id="vmd-domain",
        ),
        pytest.param(
            "/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/VMBUS:01/abc/pci7870:00/7870:00:00.0",
            ("7870:00:00.0", ("pci7870:00",)),
            id="hyperv-acpi-above-host-bridge",
        ),
    ],
)
def test_parse_pci_devpath(devpath: str, expected: tuple[str, tuple[str, ...]]) -> None:
    assert pciparse.parse_pci_devpath(devpath) == expected


@pytest.mark.parametrize(
    ("parser", "text", "expected"),
    [
        pytest.param(lambda t: pciparse.parse_pci_id(t), "0x15B3\n", "0x15b3", id="pci-id"),
        pytest.param(pciparse.parse_pci_class, "0x020700\n", "0x020700", id="pci-class"),
        pytest.param(pciparse.parse_cpulist, "0-23,48-71\n", "0-23,48-71", id="cpulist"),
        pytest.param(pciparse.parse_cpulist, "5\n", "5", id="cpulist-single"),
        pytest.param(pciparse.parse_cpulist, "\n", None, id="cpulist-empty"),
        pytest.param(parse.parse_string, "20.35.1012\n", "20.35.1012", id="string"),
        pytest.param(parse.parse_string, "MT_0000000838", "MT_0000000838", id="string-no-newline"),
        pytest.param(pciparse.parse_power_state, "D3cold\n", "D3cold", id="power-state"),
        pytest.param(pciparse.parse_pci_revision, "0x01\n", "0x01", id="pci-revision"),
        pytest.param(parse.parse_gid, "FE80:0000:0000:0000:58A2:E103:001B:2576\n",
                     "fe80:0000:0000:0000:58a2:e103:001b:2576", id="gid"),
        pytest.param(parse.parse_pkey, "0xffff\n", "0xffff", id="pkey"),
        pytest.param(parse.parse_pkey, "0x7fff\n", "0x7fff", id="pkey-limited-member"),
        pytest.param(parse.parse_pkey, "0x1\n", "0x0001", id="pkey-padded"),
        pytest.param(lambda t: parse.parse_hex_text(t, "cap_mask"), "0xA751E848\n", "0xa751e848",
                     id="cap-mask"),
        pytest.param(lambda t: parse.parse_hex_text(t, "cap_mask"), "0x10000\n", "0x00010000",
                     id="cap-mask-padded"),
        pytest.param(parse.parse_operstate, "up\n", "up", id="operstate"),
        pytest.param(parse.parse_hw_address, "B8:CE:F6:01:02:03\n", "b8:ce:f6:01:02:03", id="mac"),
        pytest.param(
            parse.parse_hw_address,
            "00:00:10:29:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:01:02:03\n",
            "00:00:10:29:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:01:02:03",
            id="ipoib-address",
        ),
        pytest.param(lambda t: parse.parse_bool01(t, "carrier"), "1\n", True, id="carrier"),
        pytest.param(lambda t: parse.parse_decimal(t, "mtu"), "4092\n", 4092, id="decimal"),
    ],
)  # fmt: skip
def test_parse_small_attributes(parser: Callable[[str], Any], text: str, expected: Any) -> None:
    assert parser(text) == expected


GARBAGE: list[Any] = [
    pytest.param(parse.parse_port_state, "ACTIVE", "port state", id="state-no-number"),
    pytest.param(parse.parse_port_state, "", "port state", id="state-empty"),
    pytest.param(parse.parse_phys_state, "five: LinkUp", "phys_state", id="phys-not-number"),
    pytest.param(parse.parse_node_type, "CA", "node_type", id="node-type-no-number"),
    pytest.param(parse.parse_rate, "fast", "rate", id="rate-word"),
    pytest.param(parse.parse_rate, "100 Mb/sec (4X EDR)", "rate", id="rate-wrong-unit"),
    pytest.param(parse.parse_rate, "100 Gb/sec (4X EDR", "rate", id="rate-unclosed"),
    pytest.param(parse.parse_link_layer, "Omni-Path", "link_layer", id="link-layer-unknown"),
    pytest.param(parse.parse_link_layer, "\n", "link_layer", id="link-layer-empty"),
    pytest.param(parse.parse_hex_int, "0xZZ", "hex", id="hex-bad-digits"),
    pytest.param(parse.parse_hex_int, "", "hex", id="hex-empty"),
    pytest.param(parse.parse_guid, "0a7f:bc12:45ef", "GUID", id="guid-short"),
    pytest.param(parse.parse_guid, "0a7fbc1245efd23b", "GUID", id="guid-no-colons"),
    pytest.param(parse.parse_counter, "-1", "counter", id="counter-negative"),
    pytest.param(parse.parse_counter, "12abc", "counter", id="counter-junk"),
    pytest.param(parse.parse_counter, "", "counter", id="counter-empty"),
    pytest.param(parse.parse_counter, "１２", "counter", id="counter-non-ascii-digits"),
    pytest.param(parse.parse_counter, str(2**64), "counter", id="counter-over-64-bit"),
    pytest.param(parse.parse_counter, "+5", "counter", id="counter-plus-sign"),
    pytest.param(parse.parse_counter, "1_000", "counter", id="counter-underscore"),
    pytest.param(parse.parse_counter, "\x00\x01\xff", "counter", id="counter-binary"),
    pytest.param(parse.parse_string, " \n", "empty", id="string-empty"),
    pytest.param(parse.parse_string, "20.3\x00\x01", "printable", id="string-binary"),
    pytest.param(parse.parse_string, "fw\ufffd", "printable", id="string-undecodable"),
    pytest.param(parse.parse_gid, "fe80::1", "GID", id="gid-compressed"),
    pytest.param(parse.parse_pkey, "0x1ffff", "P_Key", id="pkey-too-wide"),
    pytest.param(pciparse.parse_power_state, "D4", "power_state", id="power-state-unknown"),
    pytest.param(pciparse.parse_pci_revision, "1", "revision", id="revision-no-prefix"),
    pytest.param(
        lambda t: parse.parse_decimal(t, "mtu"), "٤٠٩٢", "mtu", id="decimal-arabic-digits"
    ),
    pytest.param(lambda t: parse.parse_decimal(t, "mtu"), "9" * 40, "mtu", id="decimal-huge"),
    pytest.param(pciparse.parse_link_speed, "33 MHz PCI", "link speed", id="speed-pci-x"),
    pytest.param(pciparse.parse_link_speed, "fast", "link speed", id="speed-word"),
    pytest.param(pciparse.parse_link_width, "x16", "width", id="width-prefixed"),
    pytest.param(pciparse.parse_link_width, "-4", "width", id="width-negative"),
    pytest.param(pciparse.parse_numa_node, "-2", "numa_node", id="numa-below-minus-one"),
    pytest.param(pciparse.parse_numa_node, "zero", "numa_node", id="numa-word"),
    pytest.param(pciparse.parse_pci_address, "3b:00.0", "PCI address", id="address-no-domain"),
    pytest.param(pciparse.parse_pci_address, "0000:3b:20.0", "PCI address", id="address-dev-32"),
    pytest.param(pciparse.parse_pci_address, "0000:3b:00.8", "PCI address", id="address-fn-8"),
    pytest.param(pciparse.parse_pci_id, "15b3", "PCI id", id="pci-id-no-prefix"),
    pytest.param(pciparse.parse_pci_class, "0x0207", "PCI class", id="pci-class-short"),
    pytest.param(pciparse.parse_cpulist, "0-15,", "cpulist", id="cpulist-trailing-comma"),
    pytest.param(parse.parse_operstate, "UP", "operstate", id="operstate-upper"),
    pytest.param(parse.parse_hw_address, "b8-ce-f6-01-02-03", "hardware", id="mac-dashes"),
    pytest.param(lambda t: parse.parse_bool01(t, "carrier"), "yes", "carrier", id="carrier-word"),
    pytest.param(
        pciparse.parse_pci_devpath, "/devices/virtual/infiniband/rxe0", "PCI device path", id="virt"
    ),
    pytest.param(
        pciparse.parse_pci_devpath, "/devices/0000:00:02.1", "PCI device path", id="no-host-bridge"
    ),
]


@pytest.mark.parametrize(("parser", "text", "names"), GARBAGE)
def test_garbage_raises_parse_error_naming_what(
    parser: Callable[[str], Any], text: str, names: str
) -> None:
    with pytest.raises(ParseError) as info:
        parser(text)
    assert names.lower() in str(info.value).lower()
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("vendor", "class_code", "expected"),
    [
        pytest.param("0x10de", "0x030200", True, id="h100-3d-controller"),
        pytest.param("0x10de", "0x030000", True, id="vga"),
        pytest.param("0x10de", "0x068000", False, id="nvswitch-bridge"),
        pytest.param("0x15b3", "0x030200", False, id="not-nvidia"),
        pytest.param("0x10de", None, False, id="class-unreadable"),
        pytest.param(None, "0x030200", False, id="vendor-unreadable"),
    ],
)
def test_is_gpu(vendor: str | None, class_code: str | None, expected: bool) -> None:
    assert pciparse.is_gpu(vendor, class_code) is expected


@pytest.mark.parametrize(
    ("counters", "counters_ext", "expected"),
    [
        pytest.param({"port_rcv_data": 3, "port_xmit_data": 10}, {}, (12, 40), id="4-octet-units"),
        pytest.param({}, {"port_rcv_data_64": 5, "port_xmit_data_64": 6}, (20, 24),
                     id="mlx4-ext-only"),
        pytest.param({"port_rcv_data": 2**32 - 1, "port_xmit_data": 7},
                     {"port_rcv_data_64": 2**33, "port_xmit_data_64": 9},
                     (2**35, 28), id="saturated-32-bit-falls-back-to-ext"),
        pytest.param({"port_rcv_data": 2**32 - 1}, {}, ((2**32 - 1) * 4, None),
                     id="saturated-without-ext-kept"),
        pytest.param({}, {}, (None, None), id="no-data-counters"),
    ],
)  # fmt: skip
def test_data_octets(
    counters: dict[str, int], counters_ext: dict[str, int], expected: tuple[int | None, ...]
) -> None:
    assert parse.data_octets(counters, counters_ext) == expected


def test_natural_key_orders_numbers_by_value() -> None:
    names = ["mlx5_10", "mlx5_2", "i40iw0", "mlx5_1", "mlx4_0", "uverbs11", "uverbs3"]
    assert sorted(names, key=parse.natural_key) == [
        "i40iw0", "mlx4_0", "mlx5_1", "mlx5_2", "mlx5_10", "uverbs3", "uverbs11",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "upstream", "effective"),
    [
        pytest.param(32.0, 16.0, 16.0, id="gen5-card-in-gen4-slot"),
        pytest.param(16.0, 32.0, 16.0, id="gen4-card-in-gen5-slot"),
        pytest.param(16, 8, 8, id="x16-card-in-x8-slot"),
        pytest.param(16.0, None, 16.0, id="no-upstream-port"),
        pytest.param(None, 8.0, 8.0, id="device-max-unreadable"),
        pytest.param(None, None, None, id="nothing-known"),
    ],
)
def test_effective_max(
    device: float | None, upstream: float | None, effective: float | None
) -> None:
    assert pciparse.effective_max(device, upstream) == effective


@pytest.mark.parametrize(
    ("current", "maximum", "degraded"),
    [
        pytest.param(16.0, 32.0, True, id="slower"),
        pytest.param(8, 16, True, id="narrower"),
        pytest.param(32.0, 32.0, False, id="at-max"),
        pytest.param(None, 32.0, False, id="link-down-unknown"),
        pytest.param(16.0, None, False, id="max-unknown"),
    ],
)
def test_is_degraded(current: float | None, maximum: float | None, degraded: bool) -> None:
    assert pciparse.is_degraded(current, maximum) is degraded
