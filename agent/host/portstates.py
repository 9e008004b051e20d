"""RDMA port states for the change-detection poll: `state` and `phys_state` of every port.

`collect_port_states` reads them afresh; `PortStateReader` holds descriptors on the two
files of every port and re-reads them with pread, listing class/infiniband once per poll
to notice devices coming and going. Both are bounded like every collection.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from types import TracebackType

from agent.counters.reader import GONE, INFINIBAND, READ_SIZE, device_names, port_numbers
from agent.errors import ParseError, ReadErrorLog, ReadFailed
from agent.host import parse
from agent.host.sysfs import SysDir, Sysfs, read_value
from proto.inventory import PortStateName

# (device, port number) -> (state name, phys_state name)
PortStates = dict[tuple[str, int], tuple[PortStateName, str | None]]


def collect_port_states(sysfs: Sysfs, *, timeout: float | None = 1.0) -> PortStates:
    """Every port's `(state name, phys_state name)`, read afresh.

    Unreadable values read as ("UNKNOWN", None); errors are not kept (the next snapshot
    records them). Raises CollectionTimeout when reads keep blocking (Sysfs.run_bounded).
    """
    return sysfs.run_bounded(lambda: _read_all(sysfs), timeout=timeout)


def _ports(sysfs: Sysfs, names: list[str]) -> list[tuple[str, int, SysDir]]:
    ignored = ReadErrorLog()
    found: list[tuple[str, int, SysDir]] = []
    for name in names:
        try:
            device = sysfs.dir(f"{INFINIBAND}/{name}")
        except ReadFailed:
            continue  # removed since the listing: absent from this poll
        for number in port_numbers(device, ignored):
            try:
                found.append((name, number, device.child(f"ports/{number}")))
            except ReadFailed:
                continue
    return found


def _read_all(sysfs: Sysfs) -> PortStates:
    ignored = ReadErrorLog()
    states: PortStates = {}
    for name, number, port in _ports(sysfs, device_names(sysfs, ignored)):
        state = read_value(port, "state", parse.parse_port_state, ignored)
        phys = read_value(port, "phys_state", parse.parse_phys_state, ignored)
        states[(name, number)] = (state[1] if state else "UNKNOWN", phys[1] if phys else None)
    return states


@dataclass(slots=True)
class _Held:
    """One held file: host path, logical path, descriptor (-1: read per poll)."""

    host: str
    path: str
    fd: int = -1


class PortStateReader:
    """`collect_port_states` at a fraction of the cost, for a poll every 100 ms: two
    preads (and fstats) per port and one listing of class/infiniband; a changed device
    list or a vanished file (device removed) rediscovers at once, a file replaced by a
    new inode is reopened. Call `close()` when done."""

    def __init__(self, sysfs: Sysfs, *, timeout: float | None = 1.0) -> None:
        self.sysfs = sysfs
        self.timeout = timeout
        self._names: list[str] | None = None
        self._ports: dict[tuple[str, int], tuple[_Held, _Held]] = {}

    def collect(self) -> PortStates:
        return self.sysfs.run_bounded(self._sample, timeout=self.timeout)

    def rediscover(self) -> None:
        self._names = None

    def close(self) -> None:
        ports, self._ports, self._names = self._ports, {}, None
        _close(ports)

    def __enter__(self) -> PortStateReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        _close(self._ports)

    def _sample(self) -> PortStates:
        names = device_names(self.sysfs, ReadErrorLog())
        if names != self._names:
            self._discover(names)
        states, gone = self._read()
        if gone:
            self._discover(device_names(self.sysfs, ReadErrorLog()))
            states, _ = self._read()
        return states

    def _read(self) -> tuple[PortStates, bool]:
        states: PortStates = {}
        gone = False
        for key, (state_file, phys_file) in self._ports.items():
            texts: list[str] = []
            for file in (state_file, phys_file):
                try:
                    if file.fd >= 0 and os.fstat(file.fd).st_nlink == 0:
                        # Replaced underneath us (sysfs never does this, lab trees written
                        # atomically do): a held descriptor would read the old inode forever.
                        fd, file.fd = file.fd, -1
                        os.close(fd)
                        file.fd = self.sysfs.open_file(file.host, file.path)
                    if file.fd >= 0:
                        data = self.sysfs.pread(file.fd, file.path, READ_SIZE)
                    else:
                        data = self.sysfs.read_file(file.host, file.path, READ_SIZE - 1)
                    texts.append(data.decode("utf-8", "replace"))
                except ReadFailed as failure:
                    gone = gone or failure.error in GONE
                    texts.append("")
            states[key] = (_state(texts[0]), _phys_state(texts[1]))
        return states, gone

    def _discover(self, names: list[str]) -> None:
        found: dict[tuple[str, int], tuple[_Held, _Held]] = {}
        try:
            for name, number, port in _ports(self.sysfs, names):
                held = (_Held(f"{port.host}/state", f"{port.path}/state"),
                        _Held(f"{port.host}/phys_state", f"{port.path}/phys_state"))  # fmt: skip
                found[(name, number)] = held
                for file in held:
                    with contextlib.suppress(ReadFailed):  # read per poll instead
                        file.fd = self.sysfs.open_file(file.host, file.path)
        except BaseException:
            _close(found)  # given up while blocked: do not leak what was opened
            raise
        old, self._ports, self._names = self._ports, found, names
        _close(old)


def _state(text: str) -> PortStateName:
    try:
        return parse.parse_port_state(text)[1]
    except ParseError:
        return "UNKNOWN"


def _phys_state(text: str) -> str | None:
    try:
        return parse.parse_phys_state(text)[1]
    except ParseError:
        return None


def _close(ports: dict[tuple[str, int], tuple[_Held, _Held]]) -> None:
    for files in ports.values():
        for file in files:
            if file.fd >= 0:
                fd, file.fd = file.fd, -1
                os.close(fd)
