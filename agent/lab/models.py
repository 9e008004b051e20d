"""Hardware and kernel tables the lab renders from: PCI ids per model, default PCIe links,
the mlx5 counter sets (names and widths), ACS capability bits and module srcversions.

Pure data plus tiny helpers; no I/O. Specs (nodespec.py) refer to models by name, the renderer
and the fault injector look the details up here.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple


class LinkDefault(NamedTuple):
    gen: int
    width: int = 16


class AdapterModel(NamedTuple):
    device: str  # PCI device id of the physical function
    hca_type: str  # mlx5 prints "MT<device id in decimal>"
    link: LinkDefault
    vf_device: str  # PCI device id of its SR-IOV virtual functions


ADAPTER_MODELS: dict[str, AdapterModel] = {
    # ConnectX-6 has its own VF id; later parts share the "mlx5Gen Virtual Function" 0x101e.
    "ConnectX-6": AdapterModel("0x101b", "MT4123", LinkDefault(4), "0x101c"),
    "ConnectX-6 Dx": AdapterModel("0x101d", "MT4125", LinkDefault(4), "0x101e"),
    "ConnectX-7": AdapterModel("0x1021", "MT4129", LinkDefault(5), "0x101e"),
    "ConnectX-8": AdapterModel("0x1023", "MT4131", LinkDefault(6), "0x101e"),
    "BlueField-2": AdapterModel("0xa2d6", "MT41686", LinkDefault(4), "0x101e"),
    "BlueField-3": AdapterModel("0xa2dc", "MT41692", LinkDefault(5), "0x101e"),
}
GPU_MODELS: dict[str, tuple[str, LinkDefault]] = {
    "H100 SXM5": ("0x2330", LinkDefault(5)),
    "H100 PCIe": ("0x2331", LinkDefault(5)),
    "A100 SXM4 80GB": ("0x20b2", LinkDefault(4)),
}
ROOT_PORT_IDS = ("0x8086", "0x352a")  # Intel Sapphire Rapids root port, unless overridden
SWITCH_IDS = ("0x1000", "0xc030")  # Broadcom PEX890xx Gen5 switch ports
MELLANOX = "0x15b3"
NVIDIA = "0x10de"


def hca_type_of(device_id: str) -> str:
    """mlx5_ib's hca_type is "MT%d" of the PCI device id: 0x1021 -> MT4129."""
    return f"MT{int(device_id, 16)}"


# mlx5 counters/ (PMA PortCounters, 64-bit data/packets via PortCountersExtended on kernels
# >= 4.5): name -> width. Narrow PMA error counters saturate at 2**width - 1.
PMA_COUNTERS: dict[str, int] = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16, "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16, "port_xmit_wait": 32,
    "port_xmit_data": 64, "port_rcv_data": 64, "port_xmit_packets": 64,
    "port_rcv_packets": 64, "unicast_xmit_packets": 64, "unicast_rcv_packets": 64,
    "multicast_xmit_packets": 64, "multicast_rcv_packets": 64,
}  # fmt: skip
# Kernels before 4.5 (and old OFED stacks) put only the 32-bit PortCounters in counters/
# (data and packets saturate at 2**32 - 1) and the 64-bit PortCountersExtended values in
# counters_ext/, under these names (what procfs and node_exporter read).
LEGACY_COUNTERS: dict[str, int] = {
    name: min(width, 32)
    for name, width in PMA_COUNTERS.items()
    if not name.startswith(("unicast_", "multicast_"))
}
COUNTERS_EXT: tuple[str, ...] = (
    "port_xmit_data_64", "port_rcv_data_64", "port_xmit_packets_64", "port_rcv_packets_64",
    "port_unicast_xmit_packets", "port_unicast_rcv_packets",
    "port_multicast_xmit_packets", "port_multicast_rcv_packets",
)  # fmt: skip
# One PMA value seen through both directories: a fault bumps both files.
COUNTERS_EXT_TWIN = {
    "port_xmit_data": "port_xmit_data_64",
    "port_rcv_data": "port_rcv_data_64",
    "port_xmit_packets": "port_xmit_packets_64",
    "port_rcv_packets": "port_rcv_packets_64",
}
# mlx5 hw_counters/ (queue + extended error counters; 32-bit in hardware, they wrap).
HW_COUNTERS: tuple[str, ...] = (
    "duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error",
    "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
    "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors",
    "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
    "roce_slow_restart_cnps", "roce_slow_restart_trans", "rx_atomic_requests",
    "rx_dct_connect", "rx_read_requests", "rx_write_requests",
)  # fmt: skip
# Congestion-control counters exist only on Ethernet (RoCE) ports.
ROCE_CONG_COUNTERS = (
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "rp_cnp_ignored",
)
# Every mlx5 hw_counters name the lab knows, in the driver's group order (q counters,
# extended errors, RoCE acceleration, congestion, PPCNT); synthetic specs draw from it.
ALL_HW_COUNTERS: tuple[str, ...] = (*HW_COUNTERS, *ROCE_CONG_COUNTERS, "rx_icrc_encapsulated")
HW_COUNTERS_LIFESPAN_MS = 10  # hw_counters/lifespan: how long the driver caches a read
HW_COUNTER_BITS = 32

# ACS (PCIe extended capability 0x000D) capability/control bits.
ACS_SV, ACS_TB, ACS_RR, ACS_CR, ACS_UF, ACS_EC, ACS_DT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
# What Linux sets on every ACS-capable downstream port when an IOMMU asks for isolation
# (pci_std_enable_acs: source validation, request/completion redirect, upstream forwarding).
ACS_ENABLED = ACS_SV | ACS_RR | ACS_CR | ACS_UF  # 0x1d
ROOT_PORT_ACS_CAP = ACS_SV | ACS_TB | ACS_RR | ACS_CR | ACS_UF  # 0x1f
SWITCH_ACS_CAP = ROOT_PORT_ACS_CAP | ACS_DT  # 0x5f (no egress control vector)


def srcversion_of(name: str, version: str | None) -> str:
    """A stable stand-in for modpost's srcversion: 23 uppercase hex digits (the kernel's
    MD4 of the module sources, printed "%08X%08X%08X..." into a 24-byte buffer)."""
    return hashlib.sha256(f"{name}\0{version}".encode()).hexdigest().upper()[:23]
