"""The node snapshot: everything an agent knows about one host's RDMA path.

Its JSON form is the stable contract of `nicfleet-agent snapshot` (docs/snapshot.md):
key names here are API. Plain data only (msgspec Structs, frozen, keyword-only).
Optional kernel attributes are `null` when absent — never dropped, never zero-filled —
and every file that could not be read is listed in an `errors` list. Fields added
later must have defaults so that older payloads keep decoding.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SNAPSHOT_VERSION = 1

PortStateName = Literal["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER", "UNKNOWN"]
LinkLayer = Literal["InfiniBand", "Ethernet", "Unknown"]
Relation = Literal["X", "PIX", "PXB", "PHB", "NODE", "SYS"]


class Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False, gc=False):
    """Common Struct options for every wire type. `gc=False`: wire structs hold only
    immutable data, never a cycle, so the garbage collector need not track them (16 bytes
    less per instance, ~210 per node held by the aggregator; docs/performance.md)."""


class ReadError(Base, frozen=True, kw_only=True):
    """A sysfs (or other) read that failed; recorded, never zero-filled."""

    path: str  # relative to the sysfs root, starting with '/'
    error: str  # errno name (ENOENT, EACCES, ...) or a short reason ("N/A (no PMA)")


class Pcie(Base, frozen=True, kw_only=True):
    """Negotiated and possible PCIe link of a function.

    `max_*` is the effective maximum: the lower of the device's own maximum and its
    upstream port's, because a x16 card in a x8 slot can never train wider than x8.
    """

    current_speed_gts: float | None = None
    current_width: int | None = None
    max_speed_gts: float | None = None
    max_width: int | None = None
    degraded: bool = False
    device_max_speed_gts: float | None = None
    device_max_width: int | None = None


class Sriov(Base, frozen=True, kw_only=True):
    totalvfs: int | None = None
    numvfs: int | None = None
    vfs: tuple[str, ...] = ()  # PCI addresses of the virtual functions
    physfn: str | None = None  # set on a VF: its physical function's PCI address


class Interface(Base, frozen=True, kw_only=True):
    """A netdev of an adapter's PCI function, as /sys/class/net/<if> shows it."""

    name: str
    port: int | None = None  # dev_port + 1
    mtu: int | None = None
    operstate: str | None = None
    carrier: bool | None = None
    address: str | None = None
    type: int | None = None  # ARPHRD_*: 1 Ethernet, 32 InfiniBand


class Gid(Base, frozen=True, kw_only=True):
    index: int
    gid: str
    type: str | None = None  # gid_attrs/types: "IB/RoCE v1", "RoCE v2"
    ndev: str | None = None  # gid_attrs/ndevs


class Port(Base, frozen=True, kw_only=True):
    port: int
    state: PortStateName = "UNKNOWN"
    state_id: int | None = None
    phys_state: str | None = None
    phys_state_id: int | None = None
    link_layer: LinkLayer = "Unknown"
    rate_gbps: float | None = None
    rate_lanes: int | None = None
    rate_speed: str | None = None  # NDR, HDR, ... (absent on old kernels)
    lid: int | None = None
    sm_lid: int | None = None
    lid_mask_count: int | None = None
    cap_mask: str | None = None
    gids: tuple[Gid, ...] = ()  # non-zero GIDs only
    pkeys: tuple[str, ...] = ()  # non-zero P_Keys, as "0xffff"
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    counters_ext: dict[str, int] = msgspec.field(default_factory=dict)
    hw_counters: dict[str, int] = msgspec.field(default_factory=dict)
    rx_bytes: int | None = None  # port_rcv_data x 4 (or counters_ext/port_rcv_data_64 x 4)
    tx_bytes: int | None = None


class Device(Base, frozen=True, kw_only=True):
    """One RDMA device (/sys/class/infiniband/<name>) and its PCI function."""

    name: str  # mlx5_0
    pci_address: str | None = None  # 0000:3b:00.0
    vendor_id: str | None = None  # 0x15b3
    device_id: str | None = None
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    class_code: str | None = None  # 0x020700
    revision: str | None = None  # PCI revision id, 0x00
    power_state: str | None = None  # PCI power state: D0 ... D3cold
    driver: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    hca_type: str | None = None
    hw_rev: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    node_type: str | None = None
    numa_node: int | None = None  # -1 in sysfs means unknown -> null
    local_cpulist: str | None = None
    netdevs: tuple[str, ...] = ()
    interfaces: tuple[Interface, ...] = ()
    char_devices: tuple[str, ...] = ()
    pcie: Pcie | None = None
    sriov: Sriov | None = None
    # The PCI chain above the function: host bridge ("pci0000:3a") first, then every
    # bridge down to the parent. The GPU<->NIC relation is derived from it.
    pci_path: tuple[str, ...] = ()
    ports: tuple[Port, ...] = ()
    errors: tuple[ReadError, ...] = ()
    # Added for DRA (docs/dra.md, "ResourceSlices"); an older agent sends none of them.
    # An mlx5 sub-function's RDMA device hangs off an auxiliary device below its PF
    # (`mlx5_core.sf.<n>`): its name, and the SF number (`sfnum`) where readable. The PCI
    # fields above are then the PF's.
    auxiliary_device: str | None = None
    sf_number: int | None = None
    # A RoCE LAG bond (mlx5_bond_<n>): the PCI functions of the bonded netdev's lower
    # devices, address order. The RDMA device's own PCI fields are the first PF's.
    lag_functions: tuple[str, ...] = ()
    # The PCI VPD read-only keywords SN (board serial) and VU (NVIDIA's vendor-unique id)
    # of the function; null where the VPD is absent or unreadable (it is root-only).
    vpd_serial: str | None = None
    vpd_vuid: str | None = None


class DataDirectFunction(Base, frozen=True, kw_only=True):
    """A ConnectX-8 Data Direct PCI function (15b3:2100): the DMA engine a NIC uses to
    reach GPU memory over the GPU's own PCIe root. It has no RDMA device of its own."""

    pci_address: str
    pci_path: tuple[str, ...] = ()  # as Device.pci_path
    numa_node: int | None = None
    driver: str | None = None  # mlx5_data_direct when bound
    vpd_serial: str | None = None
    vpd_vuid: str | None = None


class Gpu(Base, frozen=True, kw_only=True):
    pci_address: str
    numa_node: int | None = None
    device_id: str | None = None
    vendor_id: str | None = None
    class_code: str | None = None
    driver: str | None = None  # nvidia (GPUDirect RDMA needs it), vfio-pci, nouveau
    pcie: Pcie | None = None
    pci_path: tuple[str, ...] = ()


class GpuNicRelation(Base, frozen=True, kw_only=True):
    gpu: str  # PCI address
    nic: str  # RDMA device name
    relation: Relation


class ModuleInfo(Base, frozen=True, kw_only=True):
    version: str | None = None
    srcversion: str | None = None


NvidiaModuleFlavour = Literal["open", "proprietary"]
RdmaNetnsMode = Literal["shared", "exclusive"]


class IommuGroup(Base, frozen=True, kw_only=True):
    """The IOMMU group of one RDMA adapter's or GPU's PCI function (its `iommu_group`
    link) and the group's default domain type, as the kernel writes it in
    kernel/iommu_groups/<group>/type: DMA, DMA-FQ (translated), identity (pass-through),
    blocked, unmanaged. `type` is null where the file is missing (kernels before 5.4) or
    unreadable."""

    pci_address: str
    group: str
    type: str | None = None


class Platform(Base, frozen=True, kw_only=True):
    iommu: bool | None = None  # /sys/class/iommu has entries
    peermem: bool = False  # nvidia_peermem (or legacy nv_peer_mem) loaded
    acs_enabled_bridges: tuple[str, ...] = ()  # bridges on GPU<->NIC paths with ACS redirect
    verbs: str | None = None  # "ok: N devices" or "verbs unavailable: <reason>"
    # Added after the first format; an older agent sends none of them (empty / null).
    iommu_groups: tuple[IommuGroup, ...] = ()  # of the RDMA adapters and GPUs, address order
    # The IOMMU parameters of /proc/cmdline in order (iommu=pt, intel_iommu=on, ...);
    # null: the command line was not read (no --proc-root), () when it has none.
    kernel_cmdline_iommu: tuple[str, ...] | None = None
    kernel_release: str | None = None  # /proc/sys/kernel/osrelease, e.g. "6.8.0-45-generic"
    # Flavour of the loaded nvidia.ko (module taint P = proprietary licence); null: not
    # loaded or not told. dma-buf GPUDirect RDMA needs the open one.
    nvidia_kernel_module: NvidiaModuleFlavour | None = None
    # The RDMA subsystem's network-namespace mode (ib_core netns_mode, what `rdma system
    # show netns` prints): shared, every RDMA device usable from every netns; exclusive,
    # each device only in the one netns it was moved to. Null: not read (ib_core not
    # loaded, a kernel before 5.2 without the parameter, or an older agent).
    rdma_netns_mode: RdmaNetnsMode | None = None


class NodeSnapshot(
    Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.NodeSnapshot"
):
    """Full inventory of one node, published on start, reconnect, change and periodically."""

    version: int = SNAPSHOT_VERSION
    node: str
    agent_version: str
    seq: int  # per-agent-process sequence number, increases with every publish
    collected_at: float  # unix seconds
    devices: tuple[Device, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    gpu_nic_topology: tuple[GpuNicRelation, ...] = ()
    modules: dict[str, ModuleInfo] = msgspec.field(default_factory=dict)
    platform: Platform = Platform()
    errors: tuple[ReadError, ...] = ()  # host-level errors (GPUs, modules, platform)
    # PCI addresses of every Mellanox/NVIDIA network function (vendor 0x15b3, class 0x02xxxx)
    # on the bus, with an RDMA device or without (mlx5_ib unloaded, unregistered): whether a
    # vanished RDMA device's function is still there. Null: not reported (older agent, or
    # bus/pci/devices unreadable).
    nic_functions: tuple[str, ...] | None = None
    # The agent process that sent it (docs/wire.md, "Ordering"): its start in unix ns by
    # its own clock, the same in every message of one process; 0: an agent older than epochs.
    epoch: int = 0
    # ConnectX-8 Data Direct functions (address order); () from an older agent or a node
    # without them.
    data_direct: tuple[DataDirectFunction, ...] = ()
