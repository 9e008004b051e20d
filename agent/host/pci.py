"""PCI functions as sysfs shows them: ids, driver, NUMA, PCIe link, SR-IOV, position.

Reads one function's directory (reached through an RDMA device's `device` link or
bus/pci/devices) and finds the GPUs. Values go through agent.host.pciparse; failures land in
the caller's error log and the value stays None. Knows nothing about RDMA devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agent.errors import ParseError, ReadErrorLog, ReadFailed
from agent.host import parse, pciparse
from agent.host.sysfs import ABSENT, SysDir, Sysfs, read_value
from proto.inventory import Pcie, Sriov

BUS_DEVICES: Final = "bus/pci/devices"


@dataclass(frozen=True, slots=True)
class PciFunction:
    """One PCI function. `chain` is its place in the hierarchy: host bridge first, then
    every bridge down to its parent (the Device.pci_path of the wire model)."""

    address: str
    chain: tuple[str, ...]
    dir: SysDir
    vendor_id: str | None = None
    device_id: str | None = None
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    class_code: str | None = None
    revision: str | None = None
    driver: str | None = None
    numa_node: int | None = None
    local_cpulist: str | None = None
    power_state: str | None = None
    d3cold_allowed: bool | None = None
    pcie: Pcie | None = None
    sriov: Sriov | None = None
    sriov_drivers_autoprobe: bool | None = None
    sriov_vf_total_msix: int | None = None

    @property
    def path(self) -> tuple[str, ...]:
        """`chain` plus the function itself: the form agent.host.topology compares."""
        return (*self.chain, self.address)

    def bridge_dir(self, address: str) -> SysDir | None:
        """The directory of the bridge `address` above this function, if it is one."""
        parts = self.dir.parts
        if address not in parts[:-1]:
            return None
        return self.dir.ancestor(len(parts) - 1 - parts.index(address))


def function_of(device: SysDir, errors: ReadErrorLog) -> PciFunction | None:
    """The PCI function at `device` or, for an auxiliary device (an mlx5 sub-function),
    the nearest one above it. None for a device outside PCI (rxe, siw)."""
    parts = device.parts
    index = next(
        (i for i in range(len(parts) - 1, -1, -1) if pciparse.is_pci_address(parts[i])), -1
    )
    if index < 0:
        return None
    try:
        address, chain = pciparse.parse_pci_devpath("/".join(parts[: index + 1]))
    except ParseError:
        return None  # no host bridge above it: not a PCI function we can place
    directory = device if index == len(parts) - 1 else device.ancestor(len(parts) - 1 - index)
    return read_function(directory, address, chain, errors)


def read_function(
    d: SysDir, address: str, chain: tuple[str, ...], errors: ReadErrorLog
) -> PciFunction:
    """Every attribute of the function directory `d` that nicfleet reports."""

    def pci_id(name: str) -> str | None:
        return read_value(d, name, lambda t: pciparse.parse_pci_id(t, name), errors)

    sriov = read_sriov(d, errors)
    autoprobe = msix = None
    if sriov is not None and sriov.totalvfs is not None:  # files of SR-IOV capable PFs
        autoprobe = read_value(d, "sriov_drivers_autoprobe", _flag, errors, quiet=ABSENT)
        msix = read_value(d, "sriov_vf_total_msix", _count, errors, quiet=ABSENT)
    try:
        driver: str | None = d.link_name("driver")
    except ReadFailed as failure:
        errors.add(failure)  # unbound, or a dangling link of a half-unbound device
        driver = None
    return PciFunction(
        address=address,
        chain=chain,
        dir=d,
        vendor_id=pci_id("vendor"),
        device_id=pci_id("device"),
        subsystem_vendor_id=pci_id("subsystem_vendor"),
        subsystem_device_id=pci_id("subsystem_device"),
        class_code=read_value(d, "class", pciparse.parse_pci_class, errors),
        revision=read_value(d, "revision", pciparse.parse_pci_revision, errors),
        driver=driver,
        numa_node=read_value(d, "numa_node", pciparse.parse_numa_node, errors),
        local_cpulist=read_value(d, "local_cpulist", pciparse.parse_cpulist, errors),
        power_state=read_value(d, "power_state", pciparse.parse_power_state, errors, quiet=ABSENT),
        d3cold_allowed=read_value(d, "d3cold_allowed", _flag, errors, quiet=ABSENT),
        pcie=read_pcie(d, chain, errors),
        sriov=sriov,
        sriov_drivers_autoprobe=autoprobe,
        sriov_vf_total_msix=msix,
    )


def _flag(text: str) -> bool:
    return parse.parse_bool01(text, "flag")


def _count(text: str) -> int:
    return parse.parse_decimal(text, "count", minimum=0)


def _link(d: SysDir, errors: ReadErrorLog) -> tuple[float | None, int | None]:
    """(max speed, max width) of a function; errors recorded."""
    return (
        read_value(d, "max_link_speed", pciparse.parse_link_speed, errors),
        read_value(d, "max_link_width", pciparse.parse_link_width, errors),
    )


def read_pcie(d: SysDir, chain: tuple[str, ...], errors: ReadErrorLog) -> Pcie | None:
    """Current link against the effective maximum: min(own max, upstream port's max).

    Both ends of a link report the same current speed/width; the upstream port is the
    bridge the function hangs from (a switch downstream port or a root port). None for a
    function with no PCIe link attributes at all (conventional PCI, some virtual ones).
    """
    current_speed = read_value(d, "current_link_speed", pciparse.parse_link_speed, errors)
    current_width = read_value(d, "current_link_width", pciparse.parse_link_width, errors)
    own_speed, own_width = _link(d, errors)
    if (current_speed, current_width, own_speed, own_width) == (None, None, None, None):
        return None
    up_speed: float | None = None
    up_width: int | None = None
    if chain and pciparse.is_pci_address(chain[-1]):  # not right on the host bridge's bus
        up_speed, up_width = _link(d.ancestor(1), errors)
    max_speed = pciparse.effective_max(own_speed, up_speed)
    max_width = pciparse.effective_max(own_width, up_width)
    return Pcie(
        current_speed_gts=current_speed,
        current_width=current_width,
        max_speed_gts=max_speed,
        max_width=max_width,
        degraded=pciparse.is_degraded(current_speed, max_speed)
        or pciparse.is_degraded(current_width, max_width),
        device_max_speed_gts=own_speed,
        device_max_width=own_width,
    )


def read_sriov(d: SysDir, errors: ReadErrorLog) -> Sriov | None:
    """SR-IOV of a physical function (sriov_* files, virtfnN links) or of a virtual one
    (its physfn link); None when the function has neither."""
    totalvfs = read_value(d, "sriov_totalvfs", _count, errors, quiet=ABSENT)
    numvfs = read_value(d, "sriov_numvfs", _count, errors, quiet=ABSENT)
    physfn: str | None = None
    try:
        physfn = d.link_name("physfn")
    except ReadFailed as failure:
        if failure.error != "ENOENT":
            errors.add(failure)
    if totalvfs is None and physfn is None:
        return None
    vfs: list[str] = []
    if numvfs:
        try:
            links = [e for e in d.entries() if e.startswith("virtfn") and e[6:].isdigit()]
        except ReadFailed as failure:
            errors.add(failure)
            links = []
        for link in sorted(links, key=parse.natural_key):
            try:
                vfs.append(d.link_name(link))
            except ReadFailed as failure:
                errors.add(failure)
    return Sriov(totalvfs=totalvfs, numvfs=numvfs, vfs=tuple(vfs), physfn=physfn)


def functions_of_vendor(
    sysfs: Sysfs, vendor: str, errors: ReadErrorLog
) -> list[tuple[str, SysDir]] | None:
    """(name, directory) of the functions among bus/pci/devices/* whose vendor is `vendor`,
    in listing order: one read of every other function. None when the bus cannot be listed
    (absent, or an error that is recorded), which callers must not read as "none there"."""
    try:
        bus = sysfs.dir(BUS_DEVICES)
        names = bus.entries()
    except ReadFailed as failure:
        if failure.error != "ENOENT":
            errors.add(failure)
        return None
    found: list[tuple[str, SysDir]] = []
    for name in names:
        try:
            d = bus.child(name)
        except ReadFailed as failure:
            errors.add(failure)
            continue
        if read_value(d, "vendor", lambda t: pciparse.parse_pci_id(t, "vendor"), errors) == vendor:
            found.append((name, d))
    return found


def find_gpus(sysfs: Sysfs, errors: ReadErrorLog) -> list[PciFunction]:
    """NVIDIA 3D/VGA controllers among bus/pci/devices/*, in PCI address order (the
    order nvidia-smi numbers them in)."""
    gpus: list[PciFunction] = []
    nvidia = pciparse.NVIDIA_VENDOR
    for _, d in functions_of_vendor(sysfs, nvidia, errors) or ():
        if not pciparse.is_gpu(nvidia, read_value(d, "class", pciparse.parse_pci_class, errors)):
            continue
        try:
            address, chain = pciparse.parse_pci_devpath(d.realpath)
        except ParseError as exc:
            errors.record(d.path, exc.short())
            continue
        gpus.append(read_function(d, address, chain, errors))
    return gpus


def find_nic_functions(sysfs: Sysfs, errors: ReadErrorLog) -> tuple[str, ...] | None:
    """The addresses of the Mellanox/NVIDIA network functions among bus/pci/devices/*,
    with an RDMA device or not (NodeSnapshot.nic_functions); None when the bus cannot be
    listed, so a missing list never reads as "every function gone"."""
    functions = functions_of_vendor(sysfs, pciparse.MELLANOX_VENDOR, errors)
    if functions is None:
        return None
    vendor = pciparse.MELLANOX_VENDOR
    return tuple(
        sorted(
            name.lower()
            for name, d in functions
            if pciparse.is_rdma_nic(
                vendor, read_value(d, "class", pciparse.parse_pci_class, errors)
            )
        )
    )
