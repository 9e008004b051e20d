"""DRA device health: pure, from the snapshot and the port-state poll, by the device
plugin's rule (`agent.deviceplugin.plan.adapter_health`, never a second definition), for
every device the node's slices publish (each share copy `<name>-s<i>` with its RDMA
device's health), plus `HealthFeed`, which wakes every open NodeWatchResources stream the
moment health changes.

`device_health` does no I/O and reads no clock; the feed's clock is passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from agent.deviceplugin.plan import PortStates, adapter_health
from proto.dranames import InvalidDeviceName, device_name
from proto.draslices import SliceSettings
from proto.inventory import NodeSnapshot


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    device: str  # the DRA device name (mlx5-0)
    rdma_device: str  # mlx5_0
    healthy: bool
    reason: str | None = None  # why it is unhealthy


def device_health(
    snapshot: NodeSnapshot, port_states: PortStates, settings: SliceSettings | None = None
) -> tuple[DeviceHealth, ...]:
    """Every DRA device of `snapshot`'s slices under `settings` (default: exclusive), sorted
    by name. A device whose name cannot become a DRA name is not published in a slice
    either: left out."""
    copies = published_copies(settings) if settings is not None else None
    health: list[DeviceHealth] = []
    for device in snapshot.devices:
        try:
            if copies is None:
                names = [device_name(device.name)]
            else:
                names = [device_name(device.name, i) for i in range(copies)]
        except InvalidDeviceName:
            continue
        healthy, reason = adapter_health(device, port_states)
        health.extend(DeviceHealth(name, device.name, healthy, reason) for name in names)
    return tuple(sorted(health, key=lambda h: h.device))


def published_copies(settings: SliceSettings) -> int | None:
    """How many `<name>-s<i>` devices each RDMA device is published as; None: one device
    under its own name. The rule of proto.draslices.device_entries: copies with share > 1;
    consumable capacity shares one device."""
    if settings.sharing == "copies" and settings.share > 1:
        return settings.share
    return None


class HealthFeed:
    """The node's current device health and the streams that follow it (cf. the device
    plugin's ResourceFeed): a change is sent at once, and everything again every
    `resend_interval` so the kubelet's health timeout never marks a quiet device Unknown."""

    def __init__(self, *, resend_interval: float) -> None:
        self._health: tuple[DeviceHealth, ...] = ()
        self._version = 0
        self._resend = resend_interval
        self._wakes: set[asyncio.Event] = set()

    @property
    def health(self) -> tuple[DeviceHealth, ...]:
        return self._health

    @property
    def streams(self) -> int:
        return len(self._wakes)

    def publish(self, health: tuple[DeviceHealth, ...]) -> bool:
        """Replace the health list; wake the streams when it changed."""
        if health == self._health:
            return False
        self._health = health
        self._version += 1
        for wake in self._wakes:
            wake.set()
        return True

    async def watch(self) -> AsyncGenerator[tuple[DeviceHealth, ...], None]:
        """The health now, then after every change, and at least every resend interval."""
        wake = asyncio.Event()
        self._wakes.add(wake)
        try:
            while True:
                wake.clear()
                version = self._version
                yield self._health
                if self._version != version:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self._resend)
        finally:
            self._wakes.discard(wake)
