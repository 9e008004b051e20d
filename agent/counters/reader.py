"""RDMA port counters: finding the files, reading one, and the sampling hot loop.

`CounterReader` discovers every port's counter files once, keeps a descriptor on each
and re-reads it with pread at offset 0 (sysfs runs show() again on every read), so a
sample is one syscall per counter: no open/close, no directory walk. It reports raw
kernel values; rates, saturation and resets are computed elsewhere (agent.counters.rates).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from agent.errors import ParseError, ReadErrorLog, ReadFailed
from agent.host import parse
from agent.host.sysfs import SysDir, Sysfs
from proto.messages.counters import CounterBatch, PortCounters

# counters/ is the IBTA PMA set (absent on drivers without a PMA: rxe, siw), counters_ext/
# the 64-bit extended set (mlx4), hw_counters/ the driver's own (mlx5, bnxt_re, ...).
COUNTER_GROUPS: Final = ("counters", "counters_ext", "hw_counters")
# A counter is at most 20 digits and a newline; a file filling 64 bytes is not one.
READ_SIZE: Final = 64
# A descriptor on a removed device's attribute reads ENODEV (kernfs), a vanished file
# ENOENT, a file on a stale network mount ESTALE: the device set changed.
GONE: Final = frozenset({"ENOENT", "ENODEV", "ESTALE"})
INFINIBAND: Final = "class/infiniband"

Values = tuple[dict[str, int], dict[str, int], dict[str, int]]  # one dict per group


@dataclass(slots=True)
class CounterFile:
    group: int  # index into COUNTER_GROUPS
    name: str
    host: str
    path: str  # logical, for errors
    fd: int = -1  # held open by CounterReader; -1: opened per read


def discover_counter_files(port: SysDir, errors: ReadErrorLog) -> list[CounterFile]:
    """Every file of the port's counter directories (any name: the set varies by
    firmware and kernel). A group directory that does not exist is normal."""
    files: list[CounterFile] = []
    for group, name in enumerate(COUNTER_GROUPS):
        try:
            directory = port.child(name)
            names = directory.entries()
        except ReadFailed as failure:
            if failure.error != "ENOENT":
                errors.add(failure)
            continue
        files += [
            CounterFile(group, entry, f"{directory.host}/{entry}", f"{directory.path}/{entry}")
            for entry in names
        ]
    return files


def store_counter(values: Values, file: CounterFile, data: bytes, errors: ReadErrorLog) -> None:
    """Parse one counter read into `values`, or record why it has no value (never 0)."""
    try:
        value = parse.parse_counter(data)
    except ParseError as exc:
        errors.record(file.path, exc.short())
        return
    if value is None:
        # No performance management agent (i40iw, some iWARP/RoCE drivers): the kernel
        # answers "N/A (no PMA)" instead of a number.
        errors.record(file.path, parse.NO_PMA)
        return
    values[file.group][file.name] = value


def read_counter(sysfs: Sysfs, file: CounterFile) -> bytes:
    """One read of one counter file: pread on its descriptor, else open-read-close."""
    if file.fd >= 0:
        return sysfs.pread(file.fd, file.path, READ_SIZE)
    return sysfs.read_file(file.host, file.path, READ_SIZE - 1)


def read_values(
    sysfs: Sysfs, files: list[CounterFile], errors: ReadErrorLog
) -> tuple[Values, bool]:
    """Values of `files` by group, and whether one had vanished (device gone)."""
    values: Values = ({}, {}, {})
    gone = False
    for file in files:
        try:
            data = read_counter(sysfs, file)
        except ReadFailed as failure:
            errors.add(failure)
            gone = gone or failure.error in GONE
            continue
        store_counter(values, file, data, errors)
    return values, gone


def port_counters(device: str, port: int, values: Values) -> PortCounters:
    rx, tx = parse.data_octets(values[0], values[1])
    return PortCounters(
        device=device,
        port=port,
        counters=values[0],
        counters_ext=values[1],
        hw_counters=values[2],
        rx_bytes=rx,
        tx_bytes=tx,
    )


def device_names(sysfs: Sysfs, errors: ReadErrorLog) -> list[str]:
    """RDMA device names in natural order (mlx5_2 before mlx5_10)."""
    try:
        return sorted(sysfs.list_dir(INFINIBAND), key=parse.natural_key)
    except ReadFailed as failure:
        if failure.error != "ENOENT":  # no RDMA device (or ib_core) at all: not an error
            errors.add(failure)
        return []


def port_numbers(device: SysDir, errors: ReadErrorLog) -> list[int]:
    try:
        names = device.child("ports").entries()
    except ReadFailed as failure:
        errors.add(failure)
        return []
    return sorted(int(n) for n in names if n.isascii() and n.isdigit())


@dataclass(slots=True)
class _Port:
    device: str
    port: int
    files: list[CounterFile]


class CounterReader:
    """Samples every port's counters from descriptors opened once.

    Rediscovers (closes everything, lists devices and ports again, reopens) on
    `rediscover()`, e.g. after a device-added event, and at once when a read shows that
    a device went away. A file that cannot be held open (EMFILE, not a regular file) is
    opened per sample instead, as are those past `max_open`. Call `close()` (or use it
    as a context manager).
    """

    def __init__(
        self, sysfs: Sysfs, *, timeout: float | None = 2.0, max_open: int | None = None
    ) -> None:
        self.sysfs = sysfs
        self.timeout = timeout  # bound on one sample, see Sysfs.run_bounded
        # At most this many descriptors are held; the rest are read per sample. Default:
        # half the soft RLIMIT_NOFILE (1024 on many distributions, where a 16-NIC node
        # has ~1800 counter files), leaving the process room for everything else.
        self.max_open: int | None = max_open
        self._ports: list[_Port] | None = None
        self._stale = False
        self._last_now: float | None = None

    @property
    def stale(self) -> bool:
        return self._ports is None or self._stale

    @property
    def open_files(self) -> int:
        """How many counter descriptors are held open."""
        return sum(1 for p in self._ports or () for f in p.files if f.fd >= 0)

    def rediscover(self) -> None:
        """Discover again before the next sample (cheap: only sets a flag)."""
        self._stale = True

    def collect(self, *, node: str, seq: int, now: float) -> CounterBatch:
        """One CounterBatch of raw values; unreadable counters are left out and listed
        in `errors`, never zero-filled."""
        ports, errors = self.sysfs.run_bounded(self._sample, timeout=self.timeout)
        previous, self._last_now = self._last_now, now
        interval = now - previous if previous is not None and now > previous else None
        return CounterBatch(
            node=node,
            seq=seq,
            collected_at=now,
            interval_s=interval,
            ports=ports,
            errors=errors.to_tuple(),
        )

    def close(self) -> None:
        """Close every descriptor; the next `collect` discovers again."""
        ports, self._ports = self._ports, None
        _close(ports or ())

    def __enter__(self) -> CounterReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        _close(self._ports or ())

    def _sample(self) -> tuple[tuple[PortCounters, ...], ReadErrorLog]:
        errors = ReadErrorLog()
        if self.stale:
            self._discover(errors)
        samples, gone = self._read(errors)
        if gone:
            # A device went away mid-sample: sample the new device set instead of
            # publishing a half-read port (a retry finding more gone files keeps them).
            errors = ReadErrorLog()
            self._discover(errors)
            samples, gone = self._read(errors)
            self._stale = gone
        return samples, errors

    def _read(self, errors: ReadErrorLog) -> tuple[tuple[PortCounters, ...], bool]:
        samples: list[PortCounters] = []
        any_gone = False
        for port in self._ports or ():
            values, gone = read_values(self.sysfs, port.files, errors)
            any_gone = any_gone or gone
            samples.append(port_counters(port.device, port.port, values))
        return tuple(samples), any_gone

    def _discover(self, errors: ReadErrorLog) -> None:
        found: list[_Port] = []
        for name in device_names(self.sysfs, errors):
            try:
                device = self.sysfs.dir(f"{INFINIBAND}/{name}")
            except ReadFailed as failure:
                errors.add(failure)
                continue
            for number in port_numbers(device, errors):
                try:
                    port = device.child(f"ports/{number}")
                except ReadFailed as failure:
                    errors.add(failure)
                    continue
                found.append(_Port(name, number, discover_counter_files(port, errors)))
        # Opened only once everything is listed: running short of descriptors (EMFILE)
        # must cost only the holding of some files, never a directory listing.
        budget = self.max_open
        if budget is None:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            budget = None if soft in (resource.RLIM_INFINITY, -1) else soft // 2
        try:
            for file in itertools.islice((f for p in found for f in p.files), budget):
                # One that cannot be held open is read per sample instead, and that read
                # records the error.
                with contextlib.suppress(ReadFailed):
                    file.fd = self.sysfs.open_file(file.host, file.path)
        except BaseException:
            _close(found)  # given up while blocked: do not leak what was opened
            raise
        old, self._ports = self._ports, found
        self._stale = False
        _close(old or ())


def _close(ports: list[_Port] | tuple[()]) -> None:
    for port in ports:
        for file in port.files:
            if file.fd >= 0:
                fd, file.fd = file.fd, -1
                os.close(fd)
