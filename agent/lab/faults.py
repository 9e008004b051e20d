"""Fault injection on a rendered tree: port down/up, counter bumps and resets, PCIe width
drop, ACS control edits (device removal: hotplug.py). Owns which files a fault touches, in
kernel formats and counter widths, and how: in place by default, so a running agent that
holds a descriptor and preads it (its counter and port-state readers do) sees the change,
or with `atomic=True` as a temp file + os.replace (readers that reopen see old or new,
never half, but a held descriptor keeps reading the replaced inode forever).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Literal

import msgspec

from agent.errors import AgentError
from agent.lab import pciconfig
from agent.lab.models import COUNTERS_EXT_TWIN, HW_COUNTER_BITS, LEGACY_COUNTERS, PMA_COUNTERS
from agent.lab.nodespec import PCI_ADDRESS_RE
from proto.ibta import PHYS_STATES, PORT_STATES

FaultKind = Literal[
    "port-down", "port-up", "counter", "counter-reset", "pcie-width", "acs", "device-remove",
    "device-add",
]  # fmt: skip
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # one path component, never '..'
_TMP_DIR = ".lab-tmp"  # at the tree root: outside every directory a reader lists
COUNTER_DIRS = ("counters", "counters_ext", "hw_counters")


class FaultError(AgentError, ValueError):
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
    injected_at: float  # before the first write (port faults) or after the last one


def port_down(root: Path, device: str, port: int = 1, *, atomic: bool = False) -> FaultRecord:
    """State DOWN / phys_state Disabled, and the port's netdevs down without carrier."""
    return _set_port(root, device, port, "port-down", up=False, atomic=atomic)


def port_up(root: Path, device: str, port: int = 1, *, atomic: bool = False) -> FaultRecord:
    """State ACTIVE / phys_state LinkUp, and the port's netdevs up with carrier."""
    return _set_port(root, device, port, "port-up", up=True, atomic=atomic)


def bump_counter(
    root: Path, device: str, port: int, name: str, delta: int, *, atomic: bool = False
) -> FaultRecord:
    """Add `delta` to counters/<name>, counters_ext/<name> or hw_counters/<name> (a
    `dir/name` prefix picks one). Narrow PMA error counters saturate at their width like
    the hardware does, hw_counters wrap at 32 bits. On a port with counters_ext/ (the
    pre-4.5 layout) a data/packet counter is one value seen twice: both files move, the
    32-bit counters/ copy saturating, the _64 twin not."""
    if delta < 0:
        raise FaultError(name, f"delta must be >= 0, got {delta} (counters only grow)")
    root = tree_root(root)
    files = counter_files(root, device, port, name)
    changes = []
    for path, width in files:
        changes.append(write(root, path, f"{added(_read_int(path), delta, width)}\n", atomic))
    first = files[0][0]
    return record("counter", f"{device}/{port}/{first.parent.name}/{first.name}", changes)


CounterWidth = int | None  # bits a counter saturates at; None: it wraps at 32 (hw_counters)


def counter_files(root: Path, device: str, port: int, name: str) -> list[tuple[Path, CounterWidth]]:
    """The file `name` is on the port, and its counters_ext/ twin when it has one."""
    port_dir = port_path(root, device, port)
    group, _, leaf = name.rpartition("/")
    if group not in {"", *COUNTER_DIRS} or not NAME_RE.match(leaf):
        raise FaultError(name, "expected a counter name or <counters|counters_ext|hw_counters>/x")
    groups = [group] if group else list(COUNTER_DIRS)
    found = [port_dir / g / leaf for g in groups if (port_dir / g / leaf).is_file()]
    if not found:
        where = " or ".join(str(port_dir / g / leaf) for g in groups)
        raise FaultError(where, "no such counter")
    paths = [found[0]]
    twins = {**COUNTERS_EXT_TWIN, **{v: k for k, v in COUNTERS_EXT_TWIN.items()}}
    twin = port_dir / ("counters_ext" if found[0].parent.name == "counters" else "counters")
    if leaf in twins and (twin / twins[leaf]).is_file():
        paths.append(twin / twins[leaf])
    return [
        (path, None if path.parent.name == "hw_counters" else _width(port_dir, path))
        for path in paths
    ]


def added(value: int, delta: int, width: CounterWidth) -> int:
    """`value + delta` as a counter of that width holds it: saturated, or wrapped."""
    if width is None:
        return (value + delta) % (1 << HW_COUNTER_BITS)
    return min(value + delta, (1 << width) - 1)


def counter_reset(
    root: Path, device: str, port: int | None = None, *, atomic: bool = False
) -> FaultRecord:
    """Every counter of the port (all ports when None) back to 0, as a driver reload or a
    firmware reset leaves them; hw_counters/lifespan is a setting and stays. Only files
    that change are written and recorded; unreadable/non-numeric ones are left alone."""
    root = tree_root(root)
    ports = [port] if port is not None else _ports(root, device)
    changes = []
    for number in ports:
        port_dir = port_path(root, device, number)
        for group in COUNTER_DIRS:
            directory = port_dir / group
            for name in sorted(os.listdir(directory)) if directory.is_dir() else []:
                path = directory / name
                if (group, name) == ("hw_counters", "lifespan") or not path.is_file():
                    continue
                text = _read(path).strip()
                if text.isdigit() and int(text) != 0:
                    changes.append(write(root, path, "0\n", atomic))
    target = device if port is None else f"{device}/{port}"
    return record("counter-reset", target, changes)


def pcie_width_drop(
    root: Path, pci_address: str, width: int, *, atomic: bool = False
) -> FaultRecord:
    """Retrain the function's link at a narrower `width`. A link has two ends and one
    status, so the upstream bridge port and the device's other functions change too; each
    end's `current_link_width` and the Link Status register in its `config` move."""
    root = tree_root(root)
    device = pci_device(root, pci_address)
    max_width = int(_read(device / "max_link_width"))
    if width not in {1, 2, 4, 8, 12, 16, 32} or width > max_width:
        raise FaultError(device / "current_link_width", f"width {width} not in 1..{max_width}")
    real = device.resolve()
    ends = [a for a in sorted(os.listdir(real.parent)) if a[:-1] == pci_address[:-1]]
    ends = [a for a in ends if not (real.parent / a / "physfn").exists()]  # VFs have no link
    if PCI_ADDRESS_RE.match(real.parent.name):  # not directly on a host bridge
        ends.insert(0, real.parent.name)
    changes = []
    for end in ends:
        fn = root / "bus/pci/devices" / end
        old = _read(fn / "current_link_width").strip()
        changes.append(write(root, fn / "current_link_width", f"{width}\n", atomic))
        config = fn / "config"
        if config.is_file():
            new = pciconfig.with_link_width(config.read_bytes(), width)
            changes.append(write_bytes(root, config, new, atomic, old, str(width)))
    return record("pcie-width", pci_address, changes)


def set_acs(root: Path, pci_address: str, control: int, *, atomic: bool = False) -> FaultRecord:
    """Rewrite a bridge's ACS control register (+6 in extended capability 0x000D), as
    `setpci -s <addr> ECAP_ACS+6.w=<control>` does; the record shows the register in hex."""
    root = tree_root(root)
    config = pci_device(root, pci_address) / "config"
    data = config.read_bytes() if config.is_file() else b""
    old = pciconfig.acs_control(data) if len(data) > pciconfig.EXT_START else None
    if old is None:
        raise FaultError(config, "no ACS extended capability (not a root or downstream port?)")
    if not 0 <= control <= 0xFFFF:
        raise FaultError(config, f"control 0x{control:x} is not a 16-bit value")
    new = pciconfig.with_acs_control(data, control)
    change = write_bytes(root, config, new, atomic, f"0x{old:04x}", f"0x{control:04x}")
    return record("acs", pci_address, [change])


def _set_port(
    root: Path, device: str, port: int, kind: FaultKind, *, up: bool, atomic: bool
) -> FaultRecord:
    started = time.time()
    root = tree_root(root)
    port_dir = port_path(root, device, port)
    state, phys = ("ACTIVE", "LinkUp") if up else ("DOWN", "Disabled")
    files = [
        (port_dir / "state", f"{PORT_STATES[state]}: {state}\n"),
        (port_dir / "phys_state", f"{PHYS_STATES[phys]}: {phys}\n"),
    ]
    # Two files, two writes: in the order the hardware moves (the link trains before the
    # port goes ACTIVE; the port is DOWN as the link drops), so an agent polling between
    # them sees DOWN/LinkUp, a real state, never ACTIVE/Disabled.
    if up:
        files.reverse()
    # The port's netdevs: the function's net/* whose dev_port is port - 1 (as ibdev2netdev
    # does); written through class/net/<name> so the record shows the usual path.
    net = root / "class" / "infiniband" / device / "device" / "net"
    for name in sorted(os.listdir(net)) if net.is_dir() else []:
        netdev = root / "class" / "net" / name
        if _read(netdev / "dev_port").strip() == str(port - 1):
            files.append((netdev / "operstate", "up\n" if up else "down\n"))
            files.append((netdev / "carrier", "1\n" if up else "0\n"))
    changes = [write(root, path, text, atomic) for path, text in files]
    return record(kind, f"{device}/{port}", changes, started=started)


def _width(port_dir: Path, path: Path) -> int:
    if path.parent.name == "counters_ext":
        return 64
    if (port_dir / "counters_ext").is_dir():  # pre-4.5 layout: counters/ is 32-bit
        return LEGACY_COUNTERS.get(path.name, 64)
    return PMA_COUNTERS.get(path.name, 64)


def _ports(root: Path, device: str) -> list[int]:
    ports = port_path(root, device, 1).parent
    return sorted(int(p) for p in os.listdir(ports) if p.isdigit())


def tree_root(root: Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise FaultError(root, "no such directory (expected a tree rendered by lab render)")
    return root


def pci_device(root: Path, pci_address: str) -> Path:
    if not PCI_ADDRESS_RE.match(pci_address):
        raise FaultError(pci_address, "not a PCI address like 0000:19:00.0")
    device = root / "bus" / "pci" / "devices" / pci_address
    if not device.is_dir():
        raise FaultError(device, "no such PCI device")
    return device


def port_path(root: Path, device: str, port: int) -> Path:
    if not NAME_RE.match(device):
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


def _read_int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text)
    except ValueError:
        raise FaultError(path, f"counter does not hold a number: {text!r}") from None


def write(root: Path, path: Path, text: str, atomic: bool) -> Change:
    old = _read(path)
    write_bytes(root, path, text.encode(), atomic)
    return Change(path=str(path.relative_to(root)), old=old.rstrip("\n"), new=text.rstrip("\n"))


def write_bytes(
    root: Path, path: Path, data: bytes, atomic: bool, old: str = "", new: str = ""
) -> Change:
    """Replace a file's bytes; the Change carries `old`/`new` as given (binary files)."""
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
        write_in_place(path, data)
    return Change(path=str(path.relative_to(root)), old=old, new=new)


def write_in_place(path: Path, data: bytes) -> None:
    """Rewrite `path`'s inode, so a descriptor held open on it reads the new bytes.

    A shorter text value is first written padded with spaces to the old length, then
    truncated: a reader between the two reads the new value plus trailing blanks, which
    every sysfs parser strips (the agent's, `int()`, `cat`), never the new value's head
    followed by the old one's tail ("0\\n345\\n"). Binary files keep their length.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        size = os.fstat(fd).st_size
        if len(data) < size and data.endswith(b"\n"):
            os.pwrite(fd, padded(data, size), 0)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def padded(data: bytes, size: int) -> bytes:
    """`data` ("1: DOWN\\n") blank-padded before its newline to `size` bytes: what a
    reader may meet while a longer value is being replaced by it in place."""
    return data[:-1] + b" " * (size - len(data)) + data[-1:]


def record(
    kind: FaultKind, target: str, changes: list[Change], *, started: float | None = None
) -> FaultRecord:
    """`started`: time.time() taken before the first write, when the caller has it — no
    reader can see the fault earlier, so "seen - injected_at" is never negative."""
    injected_at = started if started is not None else time.time()
    return FaultRecord(fault=kind, target=target, changes=tuple(changes), injected_at=injected_at)
