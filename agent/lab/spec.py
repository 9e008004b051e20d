"""Lab node specs: the YAML model of one simulated host, its defaults and its loader.

Owns the msgspec Structs a spec decodes into, the per-model defaults a spec may omit
(PCI ids, hca_type, PCIe link, the mlx5 counter set) and the semantic checks decoding
cannot express (dangling parents, duplicate addresses, bus conflicts). Pure apart from
reading the spec file; it renders nothing (see render.py).
"""

from __future__ import annotations

import importlib.resources
import ipaddress
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, get_args

import msgspec
from msgspec import Meta

from proto.subjects import InvalidNodeName, validate_node_name

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
# Names become file names in the tree, so no '/', no leading '.'.
Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z", max_length=64)]
IfName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z", max_length=15)]
Gen = Annotated[int, Meta(ge=1, le=6)]
Width = Literal[1, 2, 4, 8, 12, 16, 32]
U16 = Annotated[int, Meta(ge=0, le=0xFFFF)]
Positive = Annotated[int, Meta(ge=1)]
Mtu = Annotated[int, Meta(ge=68, le=65520)]
Line = Annotated[str, Meta(pattern=r"^[^\n]*\Z")]  # written as one line of a sysfs file

PortState = Literal["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"]
PhysState = Literal[
    "Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
    "LinkErrorRecovery", "Phy Test",
]  # fmt: skip
LinkLayer = Literal["InfiniBand", "Ethernet"]
OperState = Literal["up", "down", "lowerlayerdown", "dormant", "unknown"]
AdapterModel = Literal["ConnectX-6", "ConnectX-6 Dx", "ConnectX-7", "BlueField-2", "BlueField-3"]
GpuModel = Literal["H100 SXM5", "H100 PCIe", "A100 SXM4 80GB"]

# Kernel enum values behind "4: ACTIVE" / "5: LinkUp" (drivers/infiniband/core/sysfs.c).
PORT_STATES: dict[str, int] = {s: i for i, s in enumerate(get_args(PortState))}
PHYS_STATES: dict[str, int] = {s: i + 1 for i, s in enumerate(get_args(PhysState))}


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Spec Structs reject unknown keys, so a typo is an error, not a silent default."""


class Link(_Spec, frozen=True, kw_only=True):
    """A PCIe link; max_* default to the current values."""

    gen: Gen = 5
    width: Width = 16
    max_gen: Gen | None = None
    max_width: Width | None = None


class Bridge(_Spec, frozen=True, kw_only=True):
    address: PciAddress
    link: Link = Link()
    vendor: HexId | None = None
    device: HexId | None = None


class HostBridge(_Spec, frozen=True, kw_only=True):
    name: HostBridgeName  # the sysfs directory devices/pciDDDD:BB
    numa_node: int | None = None  # None renders as -1 (unknown)
    root_ports: list[PciAddress | Bridge] = []


class Switch(_Spec, frozen=True, kw_only=True):
    parent: PciAddress  # a root port or another switch's downstream port
    upstream: PciAddress | Bridge
    downstream: Annotated[list[PciAddress | Bridge], Meta(min_length=1)]
    vendor: HexId = "0x1000"  # Broadcom PEX890xx Gen5 switch ports
    device: HexId = "0xc030"


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


class Adapter(_Spec, frozen=True, kw_only=True):
    """One PCI function = one RDMA device (mlx5 gives each port of a card its own)."""

    name: Name  # the RDMA device name, mlx5_N
    model: AdapterModel
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
    ports: Annotated[list[Port], Meta(min_length=1)]

    def numbered_ports(self) -> list[tuple[int, Port]]:
        return [(p.number or i + 1, p) for i, p in enumerate(self.ports)]

    def effective_class(self) -> str:
        if self.class_code is not None:
            return self.class_code
        return "0x020700" if self.ports[0].link_layer == "InfiniBand" else "0x020000"


class NodeSpec(_Spec, frozen=True, kw_only=True):
    name: str  # the node name (DNS-1123); `lab render --node-name` overrides it
    description: str = ""
    numa_nodes: dict[Annotated[int, Meta(ge=0)], CpuList]
    possible_cpus: Positive | None = None  # default: highest CPU + 1
    modules: dict[Name, Line | None] = {}  # None: loaded, no version file (in-tree)
    host_bridges: Annotated[list[HostBridge], Meta(min_length=1)]
    switches: list[Switch] = []
    gpus: list[Gpu] = []
    adapters: list[Adapter] = []


class ModelInfo(NamedTuple):
    device: str
    hca_type: str
    link: Link


ADAPTER_MODELS: dict[str, ModelInfo] = {
    "ConnectX-6": ModelInfo("0x101b", "MT4123", Link(gen=4)),
    "ConnectX-6 Dx": ModelInfo("0x101d", "MT4125", Link(gen=4)),
    "ConnectX-7": ModelInfo("0x1021", "MT4129", Link(gen=5)),
    "BlueField-2": ModelInfo("0xa2d6", "MT41686", Link(gen=4)),
    "BlueField-3": ModelInfo("0xa2dc", "MT41692", Link(gen=5)),
}
GPU_MODELS: dict[str, tuple[str, Link]] = {
    "H100 SXM5": ("0x2330", Link(gen=5)),
    "H100 PCIe": ("0x2331", Link(gen=5)),
    "A100 SXM4 80GB": ("0x20b2", Link(gen=4)),
}
ROOT_PORT_IDS = ("0x8086", "0x352a")  # Intel Sapphire Rapids root port, unless overridden

# mlx5 counters/ (PMA PortCounters, extended to 64 bits for data/packets): name -> width.
# Narrow PMA error counters saturate at 2**width - 1 instead of wrapping.
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
HW_COUNTERS_LIFESPAN_MS = 10  # hw_counters/lifespan: how long the driver caches a read


class SpecError(ValueError):
    """A spec that cannot be loaded: names the file and the field path ($.a[0].b)."""

    def __init__(self, file: str, path: str, message: str) -> None:
        super().__init__(f"{file}: {path}: {message}")
        self.file = file
        self.path = path
        self.message = message


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


def parse_spec(data: bytes | str, file: str = "<spec>") -> NodeSpec:
    """Decode and validate a YAML spec; every failure is a SpecError naming the field."""
    try:
        spec = msgspec.yaml.decode(data, type=NodeSpec)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).rpartition(" - at `")
        if not message:  # no location: the document itself has the wrong shape
            raise SpecError(file, "$", str(exc)) from exc
        if where.startswith("key` in `"):  # msgspec's form for a bad mapping key
            where, message = where.removeprefix("key` in `"), f"{message} (in a key)"
        raise SpecError(file, where.rstrip("`"), message) from exc
    except msgspec.DecodeError as exc:
        raise SpecError(file, "$", f"invalid YAML: {exc}") from exc
    for path, message in _problems(spec):
        raise SpecError(file, path, message)
    return spec


def load_spec(path: Path) -> NodeSpec:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(str(path), "$", f"cannot read spec: {exc.strerror}") from exc
    return parse_spec(data, str(path))


def builtin_specs() -> list[str]:
    specs = importlib.resources.files("agent.lab").joinpath("specs")
    return sorted(p.name.removesuffix(".yaml") for p in specs.iterdir() if p.name.endswith(".yaml"))


def load_builtin(name: str) -> NodeSpec:
    if name not in builtin_specs():
        known = ", ".join(builtin_specs())
        raise SpecError(f"builtin:{name}", "$", f"no built-in spec {name!r} (known: {known})")
    resource = importlib.resources.files("agent.lab").joinpath("specs").joinpath(f"{name}.yaml")
    return parse_spec(resource.read_bytes(), f"builtin:{name}")


def with_node_name(spec: NodeSpec, node: str, file: str = "--node-name") -> NodeSpec:
    """The same hardware under another node name (GUIDs and MACs stay as they are)."""
    try:
        validate_node_name(node)
    except InvalidNodeName as exc:
        raise SpecError(file, "$.name", str(exc)) from exc
    return msgspec.structs.replace(spec, name=node)


def _problems(spec: NodeSpec) -> Iterator[tuple[str, str]]:
    """Semantic checks, in document order; each yields (field path, message)."""
    try:
        validate_node_name(spec.name)
    except InvalidNodeName as exc:
        yield "$.name", str(exc)
    owner: dict[int, int] = {}
    for numa, cpulist in spec.numa_nodes.items():
        try:
            cpus = parse_cpulist(cpulist)
        except ValueError as exc:
            yield f"$.numa_nodes[{numa}]", str(exc)
            continue
        for cpu in cpus:
            if owner.setdefault(cpu, numa) != numa:
                yield f"$.numa_nodes[{numa}]", f"CPU {cpu} is already in NUMA node {owner[cpu]}"
    if spec.possible_cpus is not None and owner and max(owner) >= spec.possible_cpus:
        yield "$.possible_cpus", f"CPU {max(owner)} is beyond possible_cpus {spec.possible_cpus}"

    seen: dict[str, str] = {}  # address or host bridge name -> field path of its declaration
    kinds: dict[str, str] = {}  # -> host_bridge | root_port | upstream | downstream | endpoint
    links: list[_Edge] = []

    def declare(path: str, address: str, kind: str) -> Iterator[tuple[str, str]]:
        if address in seen:
            yield path, f"duplicate PCI address {address} (first declared at {seen[address]})"
        seen.setdefault(address, path)
        kinds.setdefault(address, kind)

    for h, hb in enumerate(spec.host_bridges):
        yield from declare(f"$.host_bridges[{h}].name", hb.name, "host_bridge")
        if hb.numa_node is not None and hb.numa_node not in spec.numa_nodes:
            yield f"$.host_bridges[{h}].numa_node", f"NUMA node {hb.numa_node} is not declared"
        for r, rp in enumerate(map(bridge_of, hb.root_ports)):
            path = f"$.host_bridges[{h}].root_ports[{r}]"
            yield from declare(path, rp.address, "root_port")
            links.append(_Edge(path, path, rp.address, hb.name))
    for s, sw in enumerate(spec.switches):
        up = bridge_of(sw.upstream).address
        yield from declare(f"$.switches[{s}].upstream", up, "upstream")
        links.append(_Edge(f"$.switches[{s}].upstream", f"$.switches[{s}].parent", up, sw.parent))
        for d, down in enumerate(map(bridge_of, sw.downstream)):
            path = f"$.switches[{s}].downstream[{d}]"
            yield from declare(path, down.address, "downstream")
            links.append(_Edge(path, path, down.address, up))
    endpoints = [("gpus", i, g.address, g.parent) for i, g in enumerate(spec.gpus)]
    endpoints += [("adapters", i, a.address, a.parent) for i, a in enumerate(spec.adapters)]
    for field, i, address, parent in endpoints:
        yield from declare(f"$.{field}[{i}].address", address, "endpoint")
        links.append(_Edge(f"$.{field}[{i}].address", f"$.{field}[{i}].parent", address, parent))
    yield from _tree_problems(links, kinds)
    yield from _adapter_problems(spec)


class _Edge(NamedTuple):
    path: str  # where the child is declared
    parent_path: str  # where its parent is named
    address: str
    parent: str


# Which kind of node each kind of child may hang below (root ports and downstream ports
# get their parent from where they are declared, so only these two can be wrong).
_ALLOWED_PARENTS = {
    "endpoint": ("host_bridge", "root_port", "downstream"),
    "upstream": ("root_port", "downstream"),
}


def _tree_problems(links: list[_Edge], kinds: dict[str, str]) -> Iterator[tuple[str, str]]:
    # A bridge forwards one secondary bus and every device on that bus hangs below it, so a
    # bus number claimed below two different parents is a typo in the spec.
    bus_owner = {pci_bus(name): name for name, kind in kinds.items() if kind == "host_bridge"}
    for edge in links:
        parent_kind = kinds.get(edge.parent)
        if parent_kind is None:
            yield edge.parent_path, f"unknown parent {edge.parent!r}: no such host bridge or bridge"
            continue
        allowed = _ALLOWED_PARENTS.get(kinds[edge.address], (parent_kind,))
        if parent_kind not in allowed:
            names = " or ".join(k.replace("_", " ") for k in allowed)
            yield (
                edge.parent_path,
                f"{edge.parent} is a {parent_kind.replace('_', ' ')}; expected {names}",
            )
            continue
        bus = pci_bus(edge.address)
        if parent_kind == "host_bridge" and bus != pci_bus(edge.parent):
            yield edge.path, f"{edge.address} is not on bus {pci_bus(edge.parent)} of {edge.parent}"
        elif bus_owner.setdefault(bus, edge.parent) != edge.parent:
            yield edge.path, f"bus {bus} already hangs below {bus_owner[bus]}, not {edge.parent}"


def _adapter_problems(spec: NodeSpec) -> Iterator[tuple[str, str]]:
    names: set[str] = set()
    ifnames: set[str] = set()
    card_guid: dict[str, tuple[str, str]] = {}  # bus:device -> (image guid, adapter name)
    for a, adapter in enumerate(spec.adapters):
        at = f"$.adapters[{a}]"
        if adapter.name in names:
            yield f"{at}.name", f"duplicate RDMA device name {adapter.name!r}"
        names.add(adapter.name)
        image = guid_text(adapter.sys_image_guid or adapter.node_guid)
        card = adapter.address[:-2]
        first = card_guid.setdefault(card, (image, adapter.name))
        if first[0] != image:
            yield (
                f"{at}.sys_image_guid",
                (f"functions of one card share sys_image_guid; {first[1]} has {first[0]}"),
            )
        numbers = [n for n, _ in adapter.numbered_ports()]
        for p, (number, port) in enumerate(adapter.numbered_ports()):
            pat = f"{at}.ports[{p}]"
            if numbers.count(number) > 1:
                yield f"{pat}.number", f"duplicate port number {number}"
            if port.link_layer == "Ethernet" and (port.lid or port.sm_lid):
                yield f"{pat}.lid", "an Ethernet (RoCE) port has no LID; leave lid/sm_lid at 0"
            netdev = port.netdev_spec()
            if netdev is None:
                continue
            if netdev.name in ifnames:
                yield f"{pat}.netdev", f"duplicate netdev name {netdev.name!r}"
            ifnames.add(netdev.name)
            for i, ip in enumerate(netdev.ipv4):
                try:
                    ipaddress.IPv4Address(ip)
                except ValueError:
                    yield f"{pat}.netdev.ipv4[{i}]", f"not an IPv4 address: {ip!r}"
            if netdev.address is not None:
                want = 6 if port.link_layer == "Ethernet" else 20
                if len(netdev.address.split(":")) != want:
                    yield f"{pat}.netdev.address", f"a {port.link_layer} address has {want} bytes"
