"""Traffic on rendered trees: the data and packet counters of every ACTIVE port grow at a
share of the port's rate, written in place as the kernel's counters move, so a running
agent computes non-zero rates and the status page draws sparklines. `offered_bytes` is
pure; `Traffic.tick` reads port states and adds to counters; `drive` repeats it until
stopped. Never touches error counters: those stay for `lab fault counter`.
"""

from __future__ import annotations

import math
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ParseError
from agent.host import parse
from agent.lab.faults import CounterWidth, FaultError, added, counter_files

INFINIBAND = "class/infiniband"
# PortXmitData/PortRcvData count 4-octet words (IBTA); packets at the IB MTU.
WORD_BYTES = 4
PACKET_BYTES = 4096
# The load swings ±20% around its mean over this period, each port at its own phase, so
# a sparkline shows a wave rather than a flat line.
SWING = 0.2
PERIOD_S = 60.0
# A tick after a long pause (laptop suspend, a stopped process) adds at most this many
# intervals of traffic, not hours at once.
MAX_CATCH_UP = 5.0
DEFAULT_LOAD = 0.1
# Four ticks per 1 s agent sample keep each sampled rate within about ±25% of the offered
# one; one tick a second would alias against the samples into runs of 0 and 2x.
DEFAULT_INTERVAL_S = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficSettings:
    load: float = DEFAULT_LOAD  # mean share of each port's rate, 0..1
    interval_s: float = DEFAULT_INTERVAL_S  # between two counter updates

    def __post_init__(self) -> None:
        if not 0.0 <= self.load <= 1.0:
            raise ValueError(f"load {self.load} is not in 0..1")
        if self.interval_s < 0.1:
            raise ValueError(f"interval {self.interval_s}s is below 0.1 s")


@dataclass(frozen=True, slots=True)
class Port:
    device: str
    port: int
    rate_gbps: float


def offered_bytes(port: Port, load: float, at: float, *, receive: bool) -> float:
    """Bytes per second offered to one direction of `port` at time `at` (seconds)."""
    # The phase comes from the port's name, stable across processes (hash() is salted).
    key = f"{port.device}/{port.port}/{'rx' if receive else 'tx'}".encode()
    phase = (zlib.crc32(key) % 1000) / 1000 * 2 * math.pi
    swing = 1.0 + SWING * math.sin(2 * math.pi * at / PERIOD_S + phase)
    return port.rate_gbps * 1e9 / 8 * load * swing


def active_ports(root: Path) -> list[Port]:
    """Every port whose state reads ACTIVE and whose rate parses, read afresh (devices
    come and go with `lab fault device-remove/-add`, ports with port-down/-up)."""
    base = f"{root}/{INFINIBAND}"
    try:
        devices = sorted(os.listdir(base), key=parse.natural_key)
    except OSError:
        return []
    found = []
    for device in devices:
        ports = f"{base}/{device}/ports"
        try:
            numbers = sorted(int(n) for n in os.listdir(ports) if n.isdigit())
        except OSError:
            continue
        for number in numbers:
            try:
                state = parse.parse_port_state(_read(f"{ports}/{number}/state").decode())
                gbps = parse.parse_rate(_read(f"{ports}/{number}/rate").decode())[0]
            except (OSError, ParseError, UnicodeDecodeError):
                continue
            if state[1] == "ACTIVE":
                found.append(Port(device, number, gbps))
    return found


Files = list[tuple[str, CounterWidth]]


class Traffic:
    """Ticks of traffic; remembers which files each port's counters are (and their widths)
    so a tick is a read and a write per file, not a directory walk."""

    def __init__(self) -> None:
        self._files: dict[tuple[str, str, int, str], Files] = {}

    def tick(self, root: Path, load: float, at: float, seconds: float) -> int:
        """Add `seconds` of traffic to every ACTIVE port of `root`; how many counters
        moved. A counter the port lacks (no PMA set, say) is skipped, as is a file that
        vanished with its device."""
        moved = 0
        for port in active_ports(root):
            for receive, way in ((False, "xmit"), (True, "rcv")):
                sent = offered_bytes(port, load, at, receive=receive) * seconds
                packets = int(sent / PACKET_BYTES)
                for name, amount in (
                    (f"port_{way}_data", int(sent / WORD_BYTES)),
                    (f"port_{way}_packets", packets),
                    (f"unicast_{way}_packets", packets),  # no multicast here: they agree
                ):
                    moved += self._add(root, port, name, amount)
        return moved

    def _add(self, root: Path, port: Port, name: str, amount: int) -> int:
        key = (str(root), port.device, port.port, name)
        files = self._files.get(key)
        if files is None:
            try:
                found = counter_files(root, port.device, port.port, name)
            except FaultError:
                found = []
            files = self._files[key] = [(str(path), width) for path, width in found]
        moved = 0
        for path, width in files:
            try:
                add_in_place(path, amount, width)
            except (OSError, ValueError):
                # Gone with its device (device-remove) or not a number: look again next time.
                self._files.pop(key, None)
                continue
            moved = 1
        return moved


def add_in_place(path: str, delta: int, width: CounterWidth) -> None:
    """One counter file += delta, rewritten in place (counters only grow here, so the new
    text is never shorter and one pwrite is the whole change)."""
    fd = os.open(path, os.O_RDWR)
    try:
        value = int(os.pread(fd, 64, 0))
        data = b"%d\n" % added(value, delta, width)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(64)


def drive(
    roots: Sequence[Path],
    settings: TrafficSettings,
    stop: threading.Event,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> None:
    """Tick every root each interval until `stop` is set."""
    traffic = Traffic()
    last = clock()
    while not stop.wait(settings.interval_s):
        now = clock()
        seconds = min(now - last, settings.interval_s * MAX_CATCH_UP)
        last = now
        for root in roots:
            traffic.tick(root, settings.load, wall(), seconds)
