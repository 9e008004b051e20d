"""RDMA devices as /sys/class/infiniband shows them: identity, ports, GIDs, P_Keys,
netdevs and their /dev/infiniband char devices.

Each device's reads land in its own error log, so one broken adapter never hides the
others. Counter files are read through agent.counters.reader, PCI through agent.host.pci.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Final, NamedTuple

from agent.counters import reader as counters
from agent.errors import ReadErrorLog, ReadFailed
from agent.host import parse, pci, rdmakinds
from agent.host.sysfs import SysDir, Sysfs, read_value
from proto.inventory import Device, Gid, Interface, Port

INFINIBAND: Final = counters.INFINIBAND
CHAR_DEVICE_CLASSES: Final = ("infiniband_verbs", "infiniband_mad")
# Skips class/infiniband_verbs/abi_version and other non-device entries.
_CHAR_DEVICE_NAME: Final = re.compile(r"(?:uverbs|umad|issm)[0-9]+", re.ASCII)
# rdma_ucm's misc device: one per node, shared by every adapter, needed by RDMA CM users.
RDMA_CM_CLASS: Final = "class/misc/rdma_cm"
RDMA_CM_DEVICE: Final = "/dev/infiniband/rdma_cm"
# An IB GID has no netdev: reading its ndev fails with EINVAL (older kernels lack the
# gid_attrs directory altogether). Either way the answer is "none", not a failure.
_NO_GID_ATTR: Final = frozenset({"ENOENT", "EINVAL"})
_DOWN_CARRIER: Final = frozenset({"EINVAL"})


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    """A device as published, plus its PCI function (for topology and ACS)."""

    device: Device
    function: pci.PciFunction | None


class CharDevices(NamedTuple):
    by_ibdev: dict[str, list[str]]  # uverbsN, umadN, issmN of each device
    shared: list[str]  # nodes every device can use: rdma_cm

    def of(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(self.by_ibdev.get(name, []) + self.shared, key=parse.natural_key))


def char_devices(sysfs: Sysfs, errors: ReadErrorLog) -> CharDevices:
    """The /dev/infiniband nodes of every device, matched by `ibdev` exactly.

    A class directory exists only while its module (ib_uverbs, ib_umad) is loaded;
    rdma_cm only while rdma_ucm is.
    """
    found: dict[str, list[str]] = defaultdict(list)
    for cls in CHAR_DEVICE_CLASSES:
        try:
            class_dir = sysfs.dir(f"class/{cls}")
            entries = class_dir.entries()
        except ReadFailed as failure:
            if failure.error != "ENOENT":
                errors.add(failure)
            continue
        for entry in entries:
            if not _CHAR_DEVICE_NAME.fullmatch(entry):
                continue
            try:
                node = class_dir.child(entry)
            except ReadFailed as failure:
                errors.add(failure)
                continue
            ibdev = read_value(node, "ibdev", parse.parse_string, errors)
            if ibdev is not None:
                found[ibdev].append(f"/dev/infiniband/{entry}")
    return CharDevices(found, [RDMA_CM_DEVICE] if sysfs.exists(RDMA_CM_CLASS) else [])


def read_device(
    sysfs: Sysfs, name: str, chars: CharDevices, *, read_vpd: bool = False
) -> RdmaDevice:
    """Everything nicfleet reports about `class/infiniband/<name>`. `read_vpd`: also the
    function's VPD serial and VUID (slow: every VPD read goes to the card's EEPROM, so
    only where a Data Direct function needs pairing)."""
    errors = ReadErrorLog()
    try:
        d = sysfs.dir(f"{INFINIBAND}/{name}")
    except ReadFailed as failure:
        errors.add(failure)
        return RdmaDevice(Device(name=name, errors=errors.to_tuple()), None)
    fn: pci.PciFunction | None = None
    interfaces: tuple[Interface, ...] = ()
    auxiliary: str | None = None
    sfnum: int | None = None
    lag: tuple[str, ...] = ()
    try:
        device_dir = d.child("device")
    except ReadFailed as failure:
        errors.add(failure)  # a soft device, or a capture without links
    else:
        fn = pci.function_of(device_dir, errors)
        interfaces = read_interfaces(device_dir, errors)
        auxiliary = rdmakinds.auxiliary_of(device_dir)
        if auxiliary is not None:
            sfnum = rdmakinds.sf_number(device_dir, errors)
        if rdmakinds.is_bond(name):
            lag = rdmakinds.lag_functions(sysfs, device_dir, interfaces, errors)
    keywords = rdmakinds.read_vpd(fn.dir, errors) if read_vpd and fn is not None else {}
    ports = tuple(read_port(sysfs, d, n, errors) for n in counters.port_numbers(d, errors))

    def guid(attr: str) -> str | None:
        return read_value(d, attr, lambda t: parse.parse_guid(t, attr), errors)

    device = Device(
        name=name,
        pci_address=fn.address if fn else None,
        vendor_id=fn.vendor_id if fn else None,
        device_id=fn.device_id if fn else None,
        subsystem_vendor_id=fn.subsystem_vendor_id if fn else None,
        subsystem_device_id=fn.subsystem_device_id if fn else None,
        class_code=fn.class_code if fn else None,
        revision=fn.revision if fn else None,
        power_state=fn.power_state if fn else None,
        driver=fn.driver if fn else None,
        fw_ver=read_value(d, "fw_ver", parse.parse_string, errors),
        board_id=read_value(d, "board_id", parse.parse_string, errors),
        hca_type=read_value(d, "hca_type", parse.parse_string, errors),
        hw_rev=read_value(d, "hw_rev", parse.parse_string, errors),
        node_guid=guid("node_guid"),
        sys_image_guid=guid("sys_image_guid"),
        node_type=read_value(d, "node_type", parse.parse_node_type, errors),
        numa_node=fn.numa_node if fn else None,
        local_cpulist=fn.local_cpulist if fn else None,
        netdevs=tuple(i.name for i in interfaces),
        interfaces=interfaces,
        char_devices=chars.of(name),
        pcie=fn.pcie if fn else None,
        sriov=fn.sriov if fn else None,
        pci_path=fn.chain if fn else (),
        ports=ports,
        errors=errors.to_tuple(),
        auxiliary_device=auxiliary,
        sf_number=sfnum,
        lag_functions=lag,
        vpd_serial=keywords.get("SN"),
        vpd_vuid=keywords.get("VU"),
    )
    return RdmaDevice(device, fn)


def read_interfaces(device_dir: SysDir, errors: ReadErrorLog) -> tuple[Interface, ...]:
    """The netdevs of the device's function (`device/net/*`), matched to ports by dev_port.

    Read from the function's own net/<if> directory, which is what /sys/class/net/<if>
    links to, and named that way in errors. No net/ (IPoIB not loaded) is normal.
    """
    try:
        net = device_dir.child("net")
        names = net.entries()
    except ReadFailed as failure:
        if failure.error != "ENOENT":
            errors.add(failure)
        return ()
    interfaces: list[Interface] = []
    for ifname in sorted(names, key=parse.natural_key):
        try:
            nd = net.child(ifname).renamed(f"/class/net/{ifname}")
        except ReadFailed as failure:
            errors.add(failure)
            continue
        dev_port = read_value(nd, "dev_port", _decimal, errors)
        interfaces.append(
            Interface(
                name=ifname,
                # dev_port is 0-based, RDMA port numbers start at 1 (mlx4: one PCI function,
                # two ports, two netdevs with dev_port 0 and 1).
                port=dev_port + 1 if dev_port is not None else None,
                mtu=read_value(nd, "mtu", _unsigned, errors),
                operstate=read_value(nd, "operstate", parse.parse_operstate, errors),
                # Reading carrier of an administratively down interface fails with EINVAL.
                carrier=read_value(nd, "carrier", _flag, errors, quiet=_DOWN_CARRIER),
                address=read_value(nd, "address", parse.parse_hw_address, errors),
                type=read_value(nd, "type", _unsigned, errors),
            )
        )
    return tuple(interfaces)


def read_port(sysfs: Sysfs, device: SysDir, number: int, errors: ReadErrorLog) -> Port:
    """One port: state, rate, link layer, addressing, GIDs, P_Keys and counters."""
    try:
        p = device.child(f"ports/{number}")
    except ReadFailed as failure:
        errors.add(failure)
        return Port(port=number)
    state = read_value(p, "state", parse.parse_port_state, errors)
    phys = read_value(p, "phys_state", parse.parse_phys_state, errors)
    rate = read_value(p, "rate", parse.parse_rate, errors)
    files = counters.discover_counter_files(p, errors)
    values, _ = counters.read_values(sysfs, files, errors)
    rx, tx = parse.data_octets(values[0], values[1])
    return Port(
        port=number,
        state=state[1] if state else "UNKNOWN",
        state_id=state[0] if state else None,
        phys_state=phys[1] if phys else None,
        phys_state_id=phys[0] if phys else None,
        link_layer=read_value(p, "link_layer", parse.parse_link_layer, errors) or "Unknown",
        rate_gbps=rate[0] if rate else None,
        rate_lanes=rate[1] if rate else None,
        rate_speed=rate[2] if rate else None,
        lid=read_value(p, "lid", lambda t: parse.parse_hex_int(t, "lid"), errors),
        sm_lid=read_value(p, "sm_lid", lambda t: parse.parse_hex_int(t, "sm_lid"), errors),
        lid_mask_count=read_value(p, "lid_mask_count", _unsigned, errors),
        cap_mask=read_value(p, "cap_mask", lambda t: parse.parse_hex_text(t, "cap_mask"), errors),
        gids=read_gids(p, errors),
        pkeys=read_pkeys(p, errors),
        counters=values[0],
        counters_ext=values[1],
        hw_counters=values[2],
        rx_bytes=rx,
        tx_bytes=tx,
    )


def _decimal(text: str) -> int:
    return parse.parse_decimal(text, "decimal attribute")


def _unsigned(text: str) -> int:
    return parse.parse_decimal(text, "decimal attribute", minimum=0)


def _flag(text: str) -> bool:
    return parse.parse_bool01(text, "flag")


def _table(p: SysDir, name: str, errors: ReadErrorLog) -> tuple[SysDir | None, list[str]]:
    """A port's numbered table directory (gids/, pkeys/) and its indexes in order."""
    try:
        table = p.child(name)
        entries = table.entries()
    except ReadFailed as failure:
        if failure.error != "ENOENT":
            errors.add(failure)
        return None, []
    return table, sorted((e for e in entries if e.isascii() and e.isdigit()), key=int)


def _optional_dir(p: SysDir, name: str) -> SysDir | None:
    try:
        return p.child(name)
    except ReadFailed:
        return None  # no gid_attrs on old kernels: the types/ndevs stay null


def read_gids(p: SysDir, errors: ReadErrorLog) -> tuple[Gid, ...]:
    """The non-zero GID table entries with their type and netdev where readable.

    Unused entries read as all zeros; their attributes are not looked at.
    """
    table, indexes = _table(p, "gids", errors)
    if table is None:
        return ()
    types, ndevs = _optional_dir(p, "gid_attrs/types"), _optional_dir(p, "gid_attrs/ndevs")
    gids: list[Gid] = []
    for index in indexes:
        gid = read_value(table, index, parse.parse_gid, errors)
        if gid is None or gid == parse.ZERO_GID:
            continue
        gid_type = ndev = None
        if types is not None:
            gid_type = read_value(types, index, parse.parse_string, errors, quiet=_NO_GID_ATTR)
        if ndevs is not None:
            ndev = read_value(ndevs, index, parse.parse_string, errors, quiet=_NO_GID_ATTR)
        gids.append(Gid(index=int(index), gid=gid, type=gid_type, ndev=ndev))
    return tuple(gids)


def read_pkeys(p: SysDir, errors: ReadErrorLog) -> tuple[str, ...]:
    """The non-zero P_Key table entries ("0xffff"), in table order."""
    table, indexes = _table(p, "pkeys", errors)
    if table is None:
        return ()
    found = (read_value(table, i, parse.parse_pkey, errors) for i in indexes)
    return tuple(k for k in found if k is not None and k != "0x0000")
