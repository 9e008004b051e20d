"""The node snapshot: everything an agent knows about one host's RDMA path.

Plain data only (msgspec Structs, frozen, keyword-only). Optional kernel attributes are
`None` when absent; every file the agent could not read is listed in `read_errors`
instead of being zero-filled. New fields must have defaults so older payloads decode.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SNAPSHOT_VERSION = 1

PortStateName = Literal["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER", "UNKNOWN"]
LinkLayer = Literal["InfiniBand", "Ethernet", "Unknown"]


class Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Common Struct options for every wire type."""


class ReadError(Base, frozen=True, kw_only=True):
    """A sysfs (or other) read that failed; recorded, never zero-filled."""

    path: str
    error: str  # errno name (ENOENT, EACCES, ...) or a short reason ("N/A (no PMA)")


class PcieLink(Base, frozen=True, kw_only=True):
    current_speed_gts: float | None = None
    current_width: int | None = None
    max_speed_gts: float | None = None
    max_width: int | None = None


class PciFunction(Base, frozen=True, kw_only=True):
    address: str  # 0000:3b:00.0
    vendor: str | None = None  # 0x15b3
    device: str | None = None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    class_code: str | None = None  # 0x020700
    driver: str | None = None
    numa_node: int | None = None  # -1 in sysfs means unknown -> None
    local_cpulist: str | None = None
    link: PcieLink = PcieLink()
    # PCI addresses from the root complex down to this function's parent bridge.
    path: tuple[str, ...] = ()


class Netdev(Base, frozen=True, kw_only=True):
    name: str
    port: int | None = None  # matched via dev_port (0-based) -> port number (1-based)
    mtu: int | None = None
    operstate: str | None = None
    carrier: bool | None = None
    address: str | None = None
    type: int | None = None


class Port(Base, frozen=True, kw_only=True):
    number: int
    state: int | None = None
    state_name: PortStateName = "UNKNOWN"
    phys_state: int | None = None
    phys_state_name: str | None = None
    rate_gbps: float | None = None
    rate_lanes: int | None = None
    rate_speed: str | None = None  # NDR, HDR, ...
    link_layer: LinkLayer = "Unknown"
    lid: int | None = None
    sm_lid: int | None = None
    netdevs: tuple[str, ...] = ()
    counters: dict[str, int] = msgspec.field(default_factory=dict)


class Adapter(Base, frozen=True, kw_only=True):
    name: str  # mlx5_0
    pci: PciFunction | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    hca_type: str | None = None
    hw_rev: str | None = None
    node_type: str | None = None
    ports: tuple[Port, ...] = ()
    netdevs: tuple[Netdev, ...] = ()
    char_devices: tuple[str, ...] = ()


class Gpu(Base, frozen=True, kw_only=True):
    pci: PciFunction
    name: str | None = None


class Module(Base, frozen=True, kw_only=True):
    name: str
    version: str | None = None


class NodeSnapshot(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.node-snapshot"
):
    """Full inventory of one node, published on start, reconnect, change and periodically."""

    version: int = SNAPSHOT_VERSION
    node: str
    agent_version: str
    seq: int  # per-agent-process sequence number, increases with every publish
    collected_at: float  # unix seconds
    adapters: tuple[Adapter, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    modules: tuple[Module, ...] = ()
    read_errors: tuple[ReadError, ...] = ()
