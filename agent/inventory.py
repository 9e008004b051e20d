"""Assembles a node's RDMA inventory and counter samples from a `Sysfs` tree.

Every read goes through agent.sysfs and every value through agent.parse; this module
opens no file itself and takes `now` from the caller. One bad device, port or file never
hides the others: failures land in `read_errors` and the value stays None, never zero.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from agent import parse
from agent.errors import ParseError, ReadFailed
from agent.sysfs import ReadErrorLog, Sysfs
from proto.inventory import (
    Adapter,
    Gpu,
    Module,
    Netdev,
    NodeSnapshot,
    PcieLink,
    PciFunction,
    Port,
    PortStateName,
    ReadError,
)
from proto.messages import CounterBatch, PortCounters

T = TypeVar("T")

INFINIBAND: Final = "class/infiniband"
MODULES: Final = (
    "mlx5_core",
    "mlx5_ib",
    "ib_core",
    "ib_uverbs",
    "rdma_ucm",
    "nvidia",
    "nvidia_peermem",
    "nv_peer_mem",
)
# counters/ is the IBTA PMA set (absent on drivers without a PMA: rxe, siw), counters_ext/
# the 64-bit extended set (mlx4), hw_counters/ the driver's own (mlx5, bnxt_re, ...).
COUNTER_GROUPS: Final = ("counters", "counters_ext", "hw_counters")
# hw_counters/lifespan is the driver's read-cache period in ms: a setting, not a counter.
NOT_COUNTERS: Final = frozenset({"hw_counters/lifespan"})
CHAR_DEVICE_CLASSES: Final = ("infiniband_verbs", "infiniband_mad")
# Skips class/infiniband_verbs/abi_version and other non-device entries.
_CHAR_DEVICE_NAME: Final = re.compile(r"(?:uverbs|umad|issm)\d+")
# rdma_ucm's misc device: one per node, shared by every adapter, needed by RDMA CM users.
RDMA_CM_CLASS: Final = "class/misc/rdma_cm"
RDMA_CM_DEVICE: Final = "/dev/infiniband/rdma_cm"
# A vanished file means the device went away or its driver was rebound.
_GONE: Final = frozenset({"ENOENT", "ENODEV"})


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key putting mlx5_2 before mlx5_10."""
    # [0-9], not \d: a Unicode digit in a name must not reach int().
    return tuple(
        (int(token), "") if index % 2 else (-1, token)
        for index, token in enumerate(re.split(r"([0-9]+)", name))
    )


class _Round:
    """One collection round: the tree, its error log, and read-then-parse helpers."""

    def __init__(self, sysfs: Sysfs, errors: ReadErrorLog) -> None:
        self.sysfs = sysfs
        self.errors = errors

    def value(self, path: str, parser: Callable[[str], T]) -> T | None:
        text = self.sysfs.read_optional(path, self.errors)
        if text is None:
            return None
        try:
            return parser(text)
        except ParseError:
            self.errors.record("/" + path.strip("/"), f"unparsable: {text.strip()[:40]!r}")
            return None

    def entries(self, path: str, *, optional: bool = False) -> list[str]:
        """Directory entries; a missing optional directory is normal and not recorded."""
        try:
            return self.sysfs.list_dir(path)
        except ReadFailed as failure:
            if not (optional and failure.error == "ENOENT"):
                self.errors.add(failure)
            return []


# --- counters -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _CounterFile:
    key: str  # counter_key(): "port_xmit_data", "hw_counters/out_of_buffer"
    path: str  # as asked, for read errors
    host: Path  # resolved once at discovery


@dataclass(frozen=True, slots=True)
class _PortCounterFiles:
    adapter: str
    port: int
    files: tuple[_CounterFile, ...]


def _discover_port_counters(r: _Round, port_dir: str) -> tuple[_CounterFile, ...]:
    found: list[_CounterFile] = []
    for group in COUNTER_GROUPS:
        group_dir = f"{port_dir}/{group}"
        names = r.entries(group_dir, optional=True)
        if not names:
            continue
        try:
            host_dir = r.sysfs.resolve(group_dir)
        except ReadFailed as failure:
            r.errors.add(failure)
            continue
        for name in names:
            key = parse.counter_key(group, name)
            if key not in NOT_COUNTERS:
                found.append(_CounterFile(key, f"/{group_dir}/{name}", host_dir / name))
    return tuple(sorted(found, key=lambda f: f.key))


def _read_counters(
    sysfs: Sysfs, files: tuple[_CounterFile, ...], errors: ReadErrorLog
) -> tuple[dict[str, int], bool]:
    """Values by key, plus whether a file had vanished (time to rediscover)."""
    values: dict[str, int] = {}
    gone = False
    for counter in files:
        try:
            text = sysfs.read_resolved(counter.host, counter.path)
        except ReadFailed as failure:
            errors.add(failure)
            gone = gone or failure.error in _GONE
            continue
        try:
            value = parse.parse_counter(text)
        except ParseError:
            errors.record(counter.path, f"unparsable: {text.strip()[:40]!r}")
            continue
        if value is None:
            # The port has no performance management agent (i40iw, some iWARP/RoCE
            # drivers): the kernel answers "N/A (no PMA)" instead of a number.
            errors.record(counter.path, parse.NO_PMA)
            continue
        values[counter.key] = value
    return values, gone


class CounterReader:
    """Finds every port's counter files once, then reads only those on each sample.

    Discovery lists adapters, ports and counter directories and resolves them to host
    paths; a sample touches nothing else, so a 1 s loop over 16 NICs stays cheap. A file
    that vanished (ENOENT/ENODEV: device removed, driver rebound) marks the reader stale
    and the next sample rediscovers; `rediscover()` does the same on demand (device added)
    without doing I/O itself. File access stays in `Sysfs.read_resolved`, the one place
    to switch to cached file descriptors and pread.
    """

    def __init__(self, sysfs: Sysfs) -> None:
        self.sysfs = sysfs
        self._ports: tuple[_PortCounterFiles, ...] | None = None
        self._stale = False
        self.last_errors: tuple[ReadError, ...] = ()

    @property
    def stale(self) -> bool:
        return self._ports is None or self._stale

    def rediscover(self) -> None:
        """Discover again before the next sample (cheap: only sets a flag)."""
        self._stale = True

    def discover(self, errors: ReadErrorLog | None = None) -> None:
        """List adapters, ports and counter files now."""
        self._discover(errors)

    def _discover(self, errors: ReadErrorLog | None) -> tuple[_PortCounterFiles, ...]:
        r = _Round(self.sysfs, errors if errors is not None else ReadErrorLog())
        ports: list[_PortCounterFiles] = []
        for adapter in _adapter_names(r):
            for number in _port_numbers(r, adapter):
                port_dir = f"{INFINIBAND}/{adapter}/ports/{number}"
                files = _discover_port_counters(r, port_dir)
                ports.append(_PortCounterFiles(adapter, number, files))
        self._ports = tuple(ports)
        self._stale = False
        return self._ports

    def read(self, errors: ReadErrorLog) -> tuple[PortCounters, ...]:
        """One sample of every discovered port; unreadable counters are left out."""
        ports = self._ports
        if ports is None or self._stale:
            ports = self._discover(errors)
        samples: list[PortCounters] = []
        for port in ports:
            values, gone = _read_counters(self.sysfs, port.files, errors)
            self._stale = self._stale or gone
            samples.append(PortCounters(adapter=port.adapter, port=port.port, values=values))
        return tuple(samples)

    def collect(self, *, node: str, seq: int, now: float) -> CounterBatch:
        """One CounterBatch; what could not be read is kept in `last_errors`."""
        errors = ReadErrorLog()
        ports = self.read(errors)
        self.last_errors = errors.to_tuple()
        return CounterBatch(
            node=node, seq=seq, collected_at=now, ports=ports, read_errors=self.last_errors
        )


def collect_counters(
    sysfs: Sysfs,
    *,
    node: str,
    seq: int,
    now: float,
    reader: CounterReader | None = None,
    errors: ReadErrorLog | None = None,
) -> CounterBatch:
    """One counter sample of every port (values are the kernel's raw numbers: data
    counters in 4-octet units). A sampling loop should keep one `CounterReader` and call
    its `collect`. What could not be read is in the batch's `read_errors` (and in
    `errors`, when given).
    """
    active = reader if reader is not None else CounterReader(sysfs)
    log = errors if errors is not None else ReadErrorLog()
    ports = active.read(log)
    return CounterBatch(
        node=node, seq=seq, collected_at=now, ports=ports, read_errors=log.to_tuple()
    )


# --- adapters, ports, netdevs ---------------------------------------------------------


def _adapter_names(r: _Round) -> list[str]:
    return sorted(r.entries(INFINIBAND), key=natural_key)


def _port_numbers(r: _Round, adapter: str) -> list[int]:
    names = r.entries(f"{INFINIBAND}/{adapter}/ports")
    return sorted(int(n) for n in names if n.isascii() and n.isdigit())


def collect_port_states(sysfs: Sysfs) -> dict[tuple[str, int], tuple[PortStateName, str | None]]:
    """`(adapter, port) -> (state name, phys_state name)` for a cheap change-detection poll.

    Each port directory is resolved once and both files are read from there. Unreadable
    values read as ("UNKNOWN", None); errors are not kept (the next snapshot records them).
    """
    r = _Round(sysfs, ReadErrorLog())
    states: dict[tuple[str, int], tuple[PortStateName, str | None]] = {}
    for adapter in _adapter_names(r):
        for number in _port_numbers(r, adapter):
            port_dir = f"{INFINIBAND}/{adapter}/ports/{number}"
            try:
                host = sysfs.resolve(port_dir)
            except ReadFailed:
                continue  # removed since the listing: absent from this poll
            state = _quietly(sysfs, host, port_dir, "state", parse.parse_port_state)
            phys = _quietly(sysfs, host, port_dir, "phys_state", parse.parse_phys_state)
            states[(adapter, number)] = (
                state[1] if state is not None else "UNKNOWN",
                phys[1] if phys is not None else None,
            )
    return states


def _quietly(
    sysfs: Sysfs, host_dir: Path, directory: str, name: str, parser: Callable[[str], T]
) -> T | None:
    try:
        return parser(sysfs.read_resolved(host_dir / name, f"{directory}/{name}"))
    except (ReadFailed, ParseError):
        return None


def _collect_port(r: _Round, adapter: str, number: int, netdevs: tuple[Netdev, ...]) -> Port:
    port_dir = f"{INFINIBAND}/{adapter}/ports/{number}"
    state = r.value(f"{port_dir}/state", parse.parse_port_state)
    phys = r.value(f"{port_dir}/phys_state", parse.parse_phys_state)
    rate = r.value(f"{port_dir}/rate", parse.parse_rate)
    counters, _ = _read_counters(r.sysfs, _discover_port_counters(r, port_dir), r.errors)
    return Port(
        number=number,
        state=state[0] if state else None,
        state_name=state[1] if state else "UNKNOWN",
        phys_state=phys[0] if phys else None,
        phys_state_name=phys[1] if phys else None,
        rate_gbps=rate[0] if rate else None,
        rate_lanes=rate[1] if rate else None,
        rate_speed=rate[2] if rate else None,
        link_layer=r.value(f"{port_dir}/link_layer", parse.parse_link_layer) or "Unknown",
        lid=r.value(f"{port_dir}/lid", lambda t: parse.parse_hex_int(t, "lid")),
        sm_lid=r.value(f"{port_dir}/sm_lid", lambda t: parse.parse_hex_int(t, "sm_lid")),
        netdevs=tuple(n.name for n in netdevs if n.port == number),
        counters=counters,
    )


def _collect_netdev(r: _Round, name: str) -> Netdev:
    net_dir = f"class/net/{name}"
    dev_port = r.value(f"{net_dir}/dev_port", lambda t: parse.parse_decimal(t, "dev_port"))
    return Netdev(
        name=name,
        # dev_port is 0-based, RDMA port numbers start at 1 (mlx4: one PCI function, two
        # ports, two netdevs with dev_port 0 and 1).
        port=dev_port + 1 if dev_port is not None else None,
        mtu=r.value(f"{net_dir}/mtu", lambda t: parse.parse_decimal(t, "mtu", minimum=0)),
        operstate=r.value(f"{net_dir}/operstate", parse.parse_operstate),
        # Reading carrier of an administratively down interface fails with EINVAL.
        carrier=r.value(f"{net_dir}/carrier", lambda t: parse.parse_bool01(t, "carrier")),
        address=r.value(f"{net_dir}/address", parse.parse_hw_address),
        type=r.value(f"{net_dir}/type", lambda t: parse.parse_decimal(t, "type", minimum=0)),
    )


def _char_devices(r: _Round) -> dict[str, list[str]]:
    """ibdev name -> its /dev/infiniband nodes (uverbsN, umadN, issmN)."""
    found: dict[str, list[str]] = defaultdict(list)
    for cls in CHAR_DEVICE_CLASSES:
        # The class directory exists only while ib_uverbs / ib_umad are loaded.
        for entry in r.entries(f"class/{cls}", optional=True):
            if _CHAR_DEVICE_NAME.fullmatch(entry):
                ibdev = r.value(f"class/{cls}/{entry}/ibdev", parse.parse_string)
                if ibdev is not None:
                    found[ibdev].append(f"/dev/infiniband/{entry}")
    return found


def _collect_adapter(r: _Round, name: str, char_devices: list[str]) -> Adapter:
    base = f"{INFINIBAND}/{name}"
    pci = collect_pci_function(r.sysfs, f"{base}/device", r.errors)
    netdevs: tuple[Netdev, ...] = ()
    if pci is not None:
        # An IB port without IPoIB loaded has no netdev: a missing net/ is normal.
        names = sorted(r.entries(f"{base}/device/net", optional=True), key=natural_key)
        netdevs = tuple(_collect_netdev(r, n) for n in names)
    return Adapter(
        name=name,
        pci=pci,
        node_guid=r.value(f"{base}/node_guid", lambda t: parse.parse_guid(t, "node_guid")),
        sys_image_guid=r.value(
            f"{base}/sys_image_guid", lambda t: parse.parse_guid(t, "sys_image_guid")
        ),
        fw_ver=r.value(f"{base}/fw_ver", parse.parse_string),
        board_id=r.value(f"{base}/board_id", parse.parse_string),
        hca_type=r.value(f"{base}/hca_type", parse.parse_string),
        hw_rev=r.value(f"{base}/hw_rev", parse.parse_string),
        node_type=r.value(f"{base}/node_type", parse.parse_node_type),
        ports=tuple(_collect_port(r, name, n, netdevs) for n in _port_numbers(r, name)),
        netdevs=netdevs,
        char_devices=tuple(sorted(char_devices, key=natural_key)),
    )


def collect_adapters(sysfs: Sysfs, errors: ReadErrorLog) -> tuple[Adapter, ...]:
    """Every `class/infiniband/<dev>`, sorted naturally, with ports and counters."""
    r = _Round(sysfs, errors)
    by_ibdev = _char_devices(r)
    # rdma_cm is node-wide; listed with each adapter only when rdma_ucm really created it.
    shared = [RDMA_CM_DEVICE] if sysfs.exists(RDMA_CM_CLASS) else []
    return tuple(
        _collect_adapter(r, name, by_ibdev.get(name, []) + shared) for name in _adapter_names(r)
    )


# --- PCI, GPUs, modules -----------------------------------------------------------------


def collect_pci_function(sysfs: Sysfs, device: str, errors: ReadErrorLog) -> PciFunction | None:
    """The PCI function at (or, for an auxiliary device such as an mlx5 SF, above) `device`.

    `device` is a link or directory (`class/infiniband/mlx5_0/device`,
    `bus/pci/devices/0000:3b:00.0`). `path` is derived from where it really lives under
    `devices/`: host bridge first, then each bridge down to the parent (see
    `parse.parse_pci_devpath`). None when it cannot be resolved (recorded) or is not PCI.
    """
    r = _Round(sysfs, errors)
    try:
        devpath = sysfs.realpath(device)
    except ReadFailed as failure:
        errors.add(failure)
        return None
    parts = devpath.split("/")
    while len(parts) > 1 and not parse.is_pci_address(parts[-1]):
        parts.pop()
    try:
        address, chain = parse.parse_pci_devpath("/".join(parts))
    except ParseError:
        return None  # a virtual device (rxe, siw): no PCI function to describe
    pci_dir = "/".join(parts).lstrip("/")
    try:
        driver: str | None = sysfs.link_name(f"{pci_dir}/driver")
    except ReadFailed as failure:
        errors.add(failure)  # unbound (or half-unbound) function
        driver = None
    return PciFunction(
        address=address,
        vendor=r.value(f"{pci_dir}/vendor", lambda t: parse.parse_pci_id(t, "vendor")),
        device=r.value(f"{pci_dir}/device", lambda t: parse.parse_pci_id(t, "device")),
        subsystem_vendor=r.value(
            f"{pci_dir}/subsystem_vendor", lambda t: parse.parse_pci_id(t, "subsystem_vendor")
        ),
        subsystem_device=r.value(
            f"{pci_dir}/subsystem_device", lambda t: parse.parse_pci_id(t, "subsystem_device")
        ),
        class_code=r.value(f"{pci_dir}/class", parse.parse_pci_class),
        driver=driver,
        numa_node=r.value(f"{pci_dir}/numa_node", parse.parse_numa_node),
        local_cpulist=r.value(f"{pci_dir}/local_cpulist", parse.parse_cpulist),
        link=PcieLink(
            current_speed_gts=r.value(f"{pci_dir}/current_link_speed", parse.parse_link_speed),
            current_width=r.value(f"{pci_dir}/current_link_width", parse.parse_link_width),
            max_speed_gts=r.value(f"{pci_dir}/max_link_speed", parse.parse_link_speed),
            max_width=r.value(f"{pci_dir}/max_link_width", parse.parse_link_width),
        ),
        path=chain,
    )


def collect_gpus(sysfs: Sysfs, errors: ReadErrorLog) -> tuple[Gpu, ...]:
    """NVIDIA 3D/VGA controllers among `bus/pci/devices/*`, sorted by address."""
    r = _Round(sysfs, errors)
    gpus: list[Gpu] = []
    for entry in sorted(r.entries("bus/pci/devices", optional=True), key=natural_key):
        entry_dir = f"bus/pci/devices/{entry}"
        vendor = r.value(f"{entry_dir}/vendor", lambda t: parse.parse_pci_id(t, "vendor"))
        if vendor != parse.NVIDIA_VENDOR:
            continue
        if parse.is_gpu(vendor, r.value(f"{entry_dir}/class", parse.parse_pci_class)):
            pci = collect_pci_function(sysfs, entry_dir, errors)
            if pci is not None:
                gpus.append(Gpu(pci=pci))
    return tuple(gpus)


def collect_modules(sysfs: Sysfs, errors: ReadErrorLog) -> tuple[Module, ...]:
    """The RDMA/GPU kernel modules present under `module/`, in `MODULES` order.

    An in-tree module without MODULE_VERSION has no `version` file: version None, and
    that is normal, so it is not recorded. An absent module is simply not listed.
    """
    r = _Round(sysfs, errors)
    modules: list[Module] = []
    for name in MODULES:
        if not sysfs.is_dir(f"module/{name}"):
            continue
        version: str | None = None
        try:
            version = parse.parse_string(sysfs.read_text(f"module/{name}/version"))
        except ReadFailed as failure:
            if failure.error != "ENOENT":
                r.errors.add(failure)
        modules.append(Module(name=name, version=version))
    return tuple(modules)


def collect_snapshot(
    sysfs: Sysfs, *, node: str, seq: int, now: float, agent_version: str
) -> NodeSnapshot:
    """The full inventory of the tree; every unreadable file is listed in read_errors."""
    errors = ReadErrorLog()
    adapters = collect_adapters(sysfs, errors)
    gpus = collect_gpus(sysfs, errors)
    modules = collect_modules(sysfs, errors)
    return NodeSnapshot(
        node=node,
        agent_version=agent_version,
        seq=seq,
        collected_at=now,
        adapters=adapters,
        gpus=gpus,
        modules=modules,
        read_errors=errors.to_tuple(),
    )
