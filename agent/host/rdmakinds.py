"""What kind of RDMA device a /sys/class/infiniband entry is, beyond PF and VF: an mlx5
sub-function (its `device` is an auxiliary device below the PF), a RoCE LAG bond (one
RDMA device over the lower netdevs of a bond), and the ConnectX-8 Data Direct functions
with the VPD that pairs them with their NIC. Reads only; failures land in the caller's
error log. A VF is already told apart by its `physfn` link (agent.host.pci).
"""

from __future__ import annotations

import re
from typing import Final

from agent.errors import ParseError, ReadErrorLog, ReadFailed
from agent.host import parse, pci, pciparse, vpd
from agent.host.sysfs import ABSENT, SysDir, Sysfs, read_value
from proto.inventory import DataDirectFunction, Interface

DATA_DIRECT_DEVICE: Final = "0x2100"  # ConnectX-8 Data Direct (mlx5_data_direct's id table)
# mlx5_lag names the RDMA device of a RoCE LAG "mlx5_bond_%d" (mlx5_ib_add_lag / ib_register).
_BOND_NAME: Final = re.compile(r"[a-z0-9]+_bond_[0-9]+", re.ASCII)
_VPD: Final = "vpd"
_VPD_BYTES: Final = 32768  # the PCI VPD address space is 15 bits
# Unprivileged readers get EACCES (vpd is 0600); a function without the capability has no
# file. Neither is a fault of the device.
_VPD_QUIET: Final = frozenset({"ENOENT", "EACCES"})


def auxiliary_of(device_dir: SysDir) -> str | None:
    """The auxiliary device an RDMA device hangs off (`mlx5_core.sf.4`), or None when its
    `device` is the PCI function itself."""
    name = device_dir.parts[-1] if device_dir.parts else ""
    return None if pciparse.is_pci_address(name) else name


def sf_number(device_dir: SysDir, errors: ReadErrorLog) -> int | None:
    """An mlx5 SF's `sfnum` (the number devlink port add was given)."""
    return read_value(device_dir, "sfnum", _sfnum, errors, quiet=ABSENT)


def _sfnum(text: str) -> int:
    return parse.parse_decimal(text, "sfnum", minimum=0)


def is_bond(name: str) -> bool:
    return _BOND_NAME.fullmatch(name) is not None


def lag_functions(
    sysfs: Sysfs, device_dir: SysDir, interfaces: tuple[Interface, ...], errors: ReadErrorLog
) -> tuple[str, ...]:
    """The PCI functions below the bond master of the device's netdev (its `master` link,
    then the master's `lower_*` links): the PFs a RoCE LAG spans, address order."""
    found: set[str] = set()
    for interface in interfaces:
        try:
            master = device_dir.child(f"net/{interface.name}").link_name("master")
            bond = sysfs.dir(f"class/net/{master}")
            lowers = [e for e in bond.entries() if e.startswith("lower_")]
        except ReadFailed as failure:
            if failure.error != "ENOENT":
                errors.add(failure)
            continue
        for lower in lowers:
            try:
                fn = bond.child(f"{lower}/device").parts[-1]
            except ReadFailed as failure:
                errors.add(failure)
                continue
            if pciparse.is_pci_address(fn):
                found.add(fn)
    return tuple(sorted(found))


def read_vpd(d: SysDir, errors: ReadErrorLog) -> dict[str, str]:
    """The read-only VPD keywords of a function; {} when it has none or may not be read."""
    try:
        data = d.read_bytes(_VPD, _VPD_BYTES)
    except ReadFailed as failure:
        if failure.error not in _VPD_QUIET:
            errors.add(failure)
        return {}
    return vpd.read_only_keywords(data)


def find_data_direct(sysfs: Sysfs, errors: ReadErrorLog) -> tuple[DataDirectFunction, ...]:
    """The Data Direct functions among bus/pci/devices/*, address order, with their VPD."""
    found: list[DataDirectFunction] = []
    for _, d in pci.functions_of_vendor(sysfs, pciparse.MELLANOX_VENDOR, errors) or ():
        device = read_value(d, "device", lambda t: pciparse.parse_pci_id(t, "device"), errors)
        if device != DATA_DIRECT_DEVICE:
            continue
        try:
            address, chain = pciparse.parse_pci_devpath(d.realpath)
        except ParseError as exc:
            errors.record(d.path, exc.short())
            continue
        try:
            driver: str | None = d.link_name("driver")
        except ReadFailed:
            driver = None  # unbound (mlx5_ib not loaded): still where the root is
        keywords = read_vpd(d, errors)
        found.append(
            DataDirectFunction(
                pci_address=address,
                pci_path=chain,
                numa_node=read_value(d, "numa_node", pciparse.parse_numa_node, errors),
                driver=driver,
                vpd_serial=keywords.get("SN"),
                vpd_vuid=keywords.get("VU"),
            )
        )
    return tuple(found)
