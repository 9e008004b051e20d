"""Lab node specs, the model: the msgspec Structs the YAML of one simulated host decodes into
(NodeSpec and its parts) and the small helpers every lab module shares (GUID text, CPU
lists, bus numbers). Hardware tables live in models.py; loading and the semantic checks
in spec.py and checks.py. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from agent.lab.models import ADAPTER_MODELS, SWITCH_IDS

PCI_ADDRESS = r"[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]"  # domain:bus:device.function
PCI_ADDRESS_RE = re.compile(f"^{PCI_ADDRESS}\\Z")
PciAddress = Annotated[str, Meta(pattern=f"^{PCI_ADDRESS}\\Z")]
HostBridgeName = Annotated[str, Meta(pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}\Z")]
ParentRef = Annotated[str, Meta(pattern=f"^(pci[0-9a-f]{{4}}:[0-9a-f]{{2}}|{PCI_ADDRESS})\\Z")]
HexId = Annotated[str, Meta(pattern=r"^0x[0-9a-f]{4}\Z")]
ClassCode = Annotated[str, Meta(pattern=r"^0x[0-9a-f]{6}\Z")]
Guid = Annotated[str, Meta(pattern=r"^(([0-9a-f]{4}:){3}[0-9a-f]{4}|0x[0-9a-f]{16})\Z")]
Gid = Annotated[str, Meta(pattern=r"^([0-9a-f]{4}:){7}[0-9a-f]{4}\Z")]
Pkey = Annotated[str, Meta(pattern=r"^0x[0-9a-f]{4}\Z")]
CapMask = Annotated[str, Meta(pattern=r"^0x[0-9a-f]{8}\Z")]
Rate = Annotated[str, Meta(pattern=r"^(1|2|4|8|12)X (SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\Z")]
CpuList = Annotated[str, Meta(pattern=r"^\d+(-\d+)?(,\d+(-\d+)?)*\Z")]
HwAddress = Annotated[str, Meta(pattern=r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}([0-9a-f:]{42})?\Z")]
SrcVersion = Annotated[str, Meta(pattern=r"^[0-9A-F]{23}\Z")]  # modpost's 23 hex digits
# Names become file names in the tree, so no '/', no leading '.'.
Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z", max_length=64)]
IfName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z", max_length=15)]
Gen = Annotated[int, Meta(ge=1, le=6)]
Width = Literal[1, 2, 4, 8, 12, 16, 32]
U16 = Annotated[int, Meta(ge=0, le=0xFFFF)]
AcsBits = Annotated[int, Meta(ge=0, le=0x7F)]  # SV TB RR CR UF EC DT
Positive = Annotated[int, Meta(ge=1)]
Mtu = Annotated[int, Meta(ge=68, le=65520)]
Line = Annotated[str, Meta(pattern=r"^[^\n]*\Z")]  # written as one line of a sysfs file
KernelRelease = Annotated[str, Meta(pattern=r"^\d+\.\d+[A-Za-z0-9._+~-]*\Z", max_length=64)]

PortState = Literal["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"]
PhysState = Literal[
    "Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
    "LinkErrorRecovery", "Phy Test",
]  # fmt: skip
LinkLayer = Literal["InfiniBand", "Ethernet"]
OperState = Literal["up", "down", "lowerlayerdown", "dormant", "unknown"]
AdapterModelName = Literal[
    "ConnectX-6", "ConnectX-6 Dx", "ConnectX-7", "ConnectX-8", "BlueField-2", "BlueField-3"
]  # fmt: skip
GpuModel = Literal["H100 SXM5", "H100 PCIe", "A100 SXM4 80GB"]
IommuGroupType = Literal["DMA", "DMA-FQ", "identity"]
NvidiaFlavour = Literal["open", "proprietary"]
NetnsMode = Literal["shared", "exclusive"]


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Spec Structs reject unknown keys, so a typo is an error, not a silent default."""


class Link(_Spec, frozen=True, kw_only=True):
    """A PCIe link; max_* default to the current values."""

    gen: Gen = 5
    width: Width = 16
    max_gen: Gen | None = None
    max_width: Width | None = None


class Acs(_Spec, frozen=True, kw_only=True):
    """ACS registers of a downstream/root port; capability defaults by port kind."""

    control: AcsBits
    capability: AcsBits | None = None


# `enabled` is what Linux writes when an IOMMU wants isolation (0x1d), `disabled` is 0.
AcsSetting = Literal["enabled", "disabled"] | Acs


class Bridge(_Spec, frozen=True, kw_only=True):
    address: PciAddress
    link: Link = Link()
    vendor: HexId | None = None
    device: HexId | None = None
    acs: AcsSetting | None = None  # default: the switch's / host bridge's, else disabled


class HostBridge(_Spec, frozen=True, kw_only=True):
    name: HostBridgeName  # the sysfs directory devices/pciDDDD:BB
    numa_node: int | None = None  # None renders as -1 (unknown)
    root_ports: list[PciAddress | Bridge] = []
    acs: AcsSetting | None = None  # default for its root ports


class Switch(_Spec, frozen=True, kw_only=True):
    parent: PciAddress  # a root port or another switch's downstream port
    upstream: PciAddress | Bridge
    downstream: Annotated[list[PciAddress | Bridge], Meta(min_length=1)]
    vendor: HexId = SWITCH_IDS[0]
    device: HexId = SWITCH_IDS[1]
    acs: AcsSetting | None = None  # default for its downstream ports


class Gpu(_Spec, frozen=True, kw_only=True):
    address: PciAddress
    parent: ParentRef
    model: GpuModel
    device: HexId | None = None
    subsystem_vendor: HexId = "0x10de"
    subsystem_device: HexId = "0x0000"
    class_code: ClassCode = "0x030200"
    driver: Name = "nvidia"
    link: Link | None = None


class Netdev(_Spec, frozen=True, kw_only=True):
    name: IfName
    mtu: Mtu | None = None  # default 4092 (IPoIB datagram) / 1500 (Ethernet)
    operstate: OperState | None = None  # default follows the port state
    carrier: bool | None = None
    address: HwAddress | None = None  # default derived from the node GUID
    ifindex: Positive | None = None  # default: order of appearance, from 2 (1 is lo)
    ipv4: list[str] = []  # adds IPv4-mapped RoCE GIDs


class Port(_Spec, frozen=True, kw_only=True):
    number: Positive | None = None  # default: position + 1
    link_layer: LinkLayer = "InfiniBand"
    state: PortState = "ACTIVE"
    phys_state: PhysState | None = None  # default LinkUp, or Disabled when DOWN
    rate: Rate
    lid: U16 = 0
    sm_lid: U16 = 0
    lid_mask_count: Annotated[int, Meta(ge=0, le=7)] = 0
    sm_sl: Annotated[int, Meta(ge=0, le=15)] = 0
    cap_mask: CapMask | None = None  # default by link layer (CX-7 IB / mlx5 RoCE)
    gids: list[Gid] | None = None  # default derived from the GUID or the netdev
    pkeys: list[Pkey] = msgspec.field(default_factory=lambda: ["0xffff"])
    netdev: IfName | Netdev | None = None
    counters: dict[Name, int] = {}
    hw_counters: dict[Name, int] = {}
    counters_ext: dict[Name, int] = {}  # values; needs the adapter's counters_ext: true
    counter_names: list[Name] | None = None  # replaces the default counters/ file set
    hw_counter_names: list[Name] | None = None  # replaces the default hw_counters/ set

    def effective_phys_state(self) -> PhysState:
        if self.phys_state is not None:
            return self.phys_state
        return "Disabled" if self.state == "DOWN" else "LinkUp"

    def effective_cap_mask(self) -> str:
        if self.cap_mask is not None:
            return self.cap_mask
        return "0xa751e848" if self.link_layer == "InfiniBand" else "0x00010000"

    def netdev_spec(self) -> Netdev | None:
        return Netdev(name=self.netdev) if isinstance(self.netdev, str) else self.netdev


class Sriov(_Spec, frozen=True, kw_only=True):
    """SR-IOV of a physical function; only the `numvfs` enabled VFs exist in sysfs."""

    totalvfs: Annotated[int, Meta(ge=1, le=255)]
    numvfs: Annotated[int, Meta(ge=0, le=255)] = 0
    driver: Name | None = "mlx5_core"  # the VFs' driver; null = unbound (no autoprobe)
    rdma: bool = False  # give every VF its own RDMA device (mlx5_N after the PFs')


class Vpd(_Spec, frozen=True, kw_only=True):
    """A function's PCI VPD: the card's identifier string and read-only keywords."""

    identifier: Line = "NVIDIA ConnectX-8 SuperNIC"
    part_number: Line = "900-9X81Q-00CN-ST0"
    serial: Line  # SN, the board serial: the same on every function of one card
    vuid: Line | None = None  # VU, NVIDIA's vendor-unique id (Data Direct pairing)


class SubFunction(_Spec, frozen=True, kw_only=True):
    """An mlx5 sub-function of a PF: auxiliary device mlx5_core.sf.<n> with its own RDMA
    device (a port like the PF's first) and, optionally, a netdev."""

    name: Name  # its RDMA device, mlx5_N
    sfnum: Annotated[int, Meta(ge=0, le=0xFFFFFFFF)]
    netdev: IfName | None = None


class Adapter(_Spec, frozen=True, kw_only=True):
    """One PCI function = one RDMA device (mlx5 gives each port of a card its own)."""

    name: Name  # the RDMA device name, mlx5_N
    model: AdapterModelName
    address: PciAddress
    parent: ParentRef
    node_guid: Guid
    sys_image_guid: Guid | None = None  # default node_guid; shared by a card's functions
    fw_ver: Line
    board_id: Line
    hw_rev: Line = "0"
    node_type: Line = "1: CA"
    hca_type: Line | None = None
    device: HexId | None = None
    subsystem_vendor: HexId = "0x15b3"
    subsystem_device: HexId = "0x0000"
    class_code: ClassCode | None = None  # default 0x020700 (IB) / 0x020000 (Ethernet)
    driver: Name = "mlx5_core"
    link: Link | None = None
    sriov: Sriov | None = None
    counters_ext: bool = False  # pre-4.5 kernel layout: 32-bit counters/ + counters_ext/
    ports: Annotated[list[Port], Meta(min_length=1)]
    vpd: Vpd | None = None  # None: no vpd file
    sub_functions: list[SubFunction] = []

    def numbered_ports(self) -> list[tuple[int, Port]]:
        return [(p.number or i + 1, p) for i, p in enumerate(self.ports)]

    def effective_class(self) -> str:
        if self.class_code is not None:
            return self.class_code
        return "0x020700" if self.ports[0].link_layer == "InfiniBand" else "0x020000"

    def pci_device(self) -> str:
        return self.device or ADAPTER_MODELS[self.model].device


class DataDirect(_Spec, frozen=True, kw_only=True):
    """A ConnectX-8 Data Direct function (15b3:2100): no RDMA device, its own PCIe root
    (usually the GPU's), paired with its NIC by the VPD."""

    address: PciAddress
    parent: ParentRef
    vpd: Vpd
    driver: Name | None = "mlx5_data_direct"
    link: Link | None = None


class Bond(_Spec, frozen=True, kw_only=True):
    """A RoCE LAG: the RDMA device of the first member PF is renamed `name` and the others
    have none; a bond netdev is master of the members' netdevs (each port 1's)."""

    name: Annotated[str, Meta(pattern=r"^mlx5_bond_[0-9]+\Z")]
    netdev: IfName = "bond0"
    members: Annotated[list[PciAddress], Meta(min_length=2)]


class Module(_Spec, frozen=True, kw_only=True):
    version: Line | None = None  # None: no version file (in-tree driver)
    srcversion: SrcVersion | UnsetType | None = UNSET  # unset: derived; None: no file


class NodeSpec(_Spec, frozen=True, kw_only=True):
    name: str  # the node name (DNS-1123); `lab render --node-name` overrides it
    description: str = ""
    numa_nodes: dict[Annotated[int, Meta(ge=0)], CpuList]
    possible_cpus: Positive | None = None  # default: highest CPU + 1
    modules: dict[Name, Line | Module | None] = {}  # a version, null (in-tree) or a Module
    iommu: bool = False  # Intel VT-d: class/iommu/dmarN and IOMMU groups
    # Every group's default domain type: DMA-FQ as intel_iommu=on leaves it, identity as
    # with iommu=pt (kernel/iommu_groups/N/type).
    iommu_group_type: IommuGroupType = "DMA-FQ"
    # The flavour of nvidia.ko, seen in module/nvidia/taint (P: proprietary licence).
    nvidia_kernel_module: NvidiaFlavour = "proprietary"
    # procfs (agent.lab.procfs, the tree's proc/): /proc/sys/kernel/osrelease, and
    # /proc/cmdline; null: derived from the IOMMU fields (intel_iommu=on, iommu=pt).
    kernel_release: KernelRelease = "5.15.0-105-generic"
    kernel_cmdline: Line | None = None
    # The RDMA subsystem's netns mode, in module/ib_core/parameters/netns_mode when ib_core
    # is among `modules`: shared as a kernel boots, exclusive as after `rdma system set
    # netns exclusive`; null: a kernel before 5.2, which has no such parameter.
    rdma_netns_mode: NetnsMode | None = "shared"
    host_bridges: Annotated[list[HostBridge], Meta(min_length=1)]
    switches: list[Switch] = []
    gpus: list[Gpu] = []
    adapters: list[Adapter] = []
    data_direct: list[DataDirect] = []
    bonds: list[Bond] = []


def guid_text(guid: str) -> str:
    """`0x58a2e103001b2576` (ibstat) or `58a2:e103:001b:2576` -> the sysfs form."""
    digits = guid.removeprefix("0x").replace(":", "")
    return ":".join(digits[i : i + 4] for i in range(0, 16, 4))


def parse_cpulist(text: str) -> list[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ValueError(f"range {part!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def pci_bus(address: str) -> str:
    """`0000:17:00.0` -> `0000:17`; `pci0000:15` -> `0000:15`."""
    return address.removeprefix("pci")[:7]


def bridge_of(item: str | Bridge) -> Bridge:
    return Bridge(address=item) if isinstance(item, str) else item


def module_of(value: str | Module | None) -> Module:
    return value if isinstance(value, Module) else Module(version=value)
