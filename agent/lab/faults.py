"""Fault injection on a rendered lab tree: port down/up, counter increments, PCIe width drop.

Owns which files a fault touches and how (kernel formats, counter widths) and the write
discipline: by default each file is replaced atomically (temp file + os.replace), so a
concurrent reader sees the old or the new content, never half of it. Readers that keep a
file descriptor open across reads (pread on a cached fd) would keep seeing the replaced
inode; for them pass `atomic=False`, which rewrites the file in place instead.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Literal

import msgspec

from agent.lab.spec import PCI_ADDRESS_RE, PHYS_STATES, PMA_COUNTERS, PORT_STATES

FaultKind = Literal["port-down", "port-up", "counter", "pcie-width"]
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # one path component, never '..'
_TMP_DIR = ".lab-tmp"  # at the tree root: outside every directory a reader lists
HW_COUNTER_BITS = 32  # mlx5 queue counters are 32-bit in hardware and wrap


class FaultError(ValueError):
    """The fault's target does not exist (or is not what it should be); names the path."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class Change(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # relative to the tree root
    old: str
    new: str


class FaultRecord(msgspec.Struct, frozen=True, kw_only=True):
    fault: FaultKind
    target: str  # mlx5_0/1, mlx5_0/1/port_rcv_errors, 0000:19:00.0
    changes: tuple[Change, ...]
    injected_at: float  # time.time() after the last write


def port_down(root: Path, device: str, port: int = 1, *, atomic: bool = True) -> FaultRecord:
    """State DOWN / phys_state Disabled, and the port's netdevs down without carrier."""
    return _set_port(root, device, port, "port-down", up=False, atomic=atomic)


def port_up(root: Path, device: str, port: int = 1, *, atomic: bool = True) -> FaultRecord:
    """State ACTIVE / phys_state LinkUp, and the port's netdevs up with carrier."""
    return _set_port(root, device, port, "port-up", up=True, atomic=atomic)


def bump_counter(
    root: Path, device: str, port: int, name: str, delta: int, *, atomic: bool = True
) -> FaultRecord:
    """Add `delta` to counters/<name> or hw_counters/<name> (`hw_counters/x` picks one).

    Narrow PMA error counters saturate at their width like the hardware does, hw_counters
    wrap at 32 bits, so readers meet the same edge cases as on a real HCA.
    """
    if delta < 0:
        raise FaultError(name, f"delta must be >= 0, got {delta} (counters only grow)")
    root = _tree_root(root)
    port_dir = _port_dir(root, device, port)
    group, _, leaf = name.rpartition("/")
    if group not in {"", "counters", "hw_counters"} or not _NAME.match(leaf):
        raise FaultError(name, "expected a counter name, counters/<name> or hw_counters/<name>")
    groups = [group] if group else ["counters", "hw_counters"]
    found = [port_dir / g / leaf for g in groups if (port_dir / g / leaf).is_file()]
    if not found:
        where = " or ".join(str(port_dir / g / leaf) for g in groups)
        raise FaultError(where, "no such counter")
    path = found[0]
    old = _read(path)
    try:
        value = int(old)
    except ValueError:
        raise FaultError(path, f"counter does not hold a number: {old!r}") from None
    if path.parent.name == "hw_counters":
        new = (value + delta) % (1 << HW_COUNTER_BITS)
    else:
        new = min(value + delta, (1 << PMA_COUNTERS.get(leaf, 64)) - 1)
    change = _write(root, path, f"{new}\n", atomic)
    return _record("counter", f"{device}/{port}/{path.parent.name}/{leaf}", [change])


def pcie_width_drop(
    root: Path, pci_address: str, width: int, *, atomic: bool = True
) -> FaultRecord:
    """Retrain the function's link at a narrower `width`. A link has two ends and one
    status, so the upstream bridge port and the device's other functions change too."""
    root = _tree_root(root)
    if not PCI_ADDRESS_RE.match(pci_address):
        raise FaultError(pci_address, "not a PCI address like 0000:19:00.0")
    device = root / "bus" / "pci" / "devices" / pci_address
    if not device.is_dir():
        raise FaultError(device, "no such PCI device")
    max_width = int(_read(device / "max_link_width"))
    if width not in {1, 2, 4, 8, 12, 16, 32} or width > max_width:
        raise FaultError(device / "current_link_width", f"width {width} not in 1..{max_width}")
    real = device.resolve()
    ends = [a for a in sorted(os.listdir(real.parent)) if a[:-1] == pci_address[:-1]]
    if PCI_ADDRESS_RE.match(real.parent.name):  # not directly on a host bridge
        ends.insert(0, real.parent.name)
    changes = [
        _write(root, root / "bus/pci/devices" / end / "current_link_width", f"{width}\n", atomic)
        for end in ends
    ]
    return _record("pcie-width", pci_address, changes)


def _set_port(
    root: Path, device: str, port: int, kind: FaultKind, *, up: bool, atomic: bool
) -> FaultRecord:
    root = _tree_root(root)
    port_dir = _port_dir(root, device, port)
    state, phys = ("ACTIVE", "LinkUp") if up else ("DOWN", "Disabled")
    files = [
        (port_dir / "state", f"{PORT_STATES[state]}: {state}\n"),
        (port_dir / "phys_state", f"{PHYS_STATES[phys]}: {phys}\n"),
    ]
    # The port's netdevs: the function's net/* whose dev_port is port - 1 (as ibdev2netdev
    # does); written through class/net/<name> so the record shows the usual path.
    net = root / "class" / "infiniband" / device / "device" / "net"
    for name in sorted(os.listdir(net)) if net.is_dir() else []:
        netdev = root / "class" / "net" / name
        if _read(netdev / "dev_port").strip() == str(port - 1):
            files.append((netdev / "operstate", "up\n" if up else "down\n"))
            files.append((netdev / "carrier", "1\n" if up else "0\n"))
    changes = [_write(root, path, text, atomic) for path, text in files]
    return _record(kind, f"{device}/{port}", changes)


def _tree_root(root: Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise FaultError(root, "no such directory (expected a tree rendered by lab render)")
    return root


def _port_dir(root: Path, device: str, port: int) -> Path:
    if not _NAME.match(device):
        raise FaultError(device, "not an RDMA device name")
    dev = root / "class" / "infiniband" / device
    if not dev.is_dir():
        raise FaultError(dev, "no such RDMA device")
    port_dir = dev / "ports" / str(port)
    if port < 1 or not port_dir.is_dir():
        raise FaultError(port_dir, "no such port")
    return port_dir


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise FaultError(path, f"cannot read: {exc.strerror}") from exc


def _write(root: Path, path: Path, text: str, atomic: bool) -> Change:
    old = _read(path)
    data = text.encode()
    if atomic:
        # The temp file must be on the same filesystem for os.replace to be atomic, and
        # outside the directory being listed, so readers never meet a stray ".tmp" file.
        tmp_dir = root / _TMP_DIR
        tmp_dir.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=tmp_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    else:
        # In place, so an open fd sees the new value; a shorter value is a write then a
        # truncate, which a reader may straddle (sysfs itself never has this problem).
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
    return Change(path=str(path.relative_to(root)), old=old.rstrip("\n"), new=text.rstrip("\n"))


def _record(kind: FaultKind, target: str, changes: list[Change]) -> FaultRecord:
    return FaultRecord(fault=kind, target=target, changes=tuple(changes), injected_at=time.time())
