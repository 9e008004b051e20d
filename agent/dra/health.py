"""DRA device health: pure, from the snapshot and the port-state poll, by the device
plugin's rule (`agent.deviceplugin.plan.adapter_health`, never a second definition), plus
`HealthFeed`, which wakes every open NodeWatchResources stream the moment health changes.

`device_health` does no I/O and reads no clock; the feed's clock is passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from agent.deviceplugin.plan import PortStates, adapter_health
from proto.dranames import InvalidDeviceName, device_name
from proto.inventory import NodeSnapshot


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    device: str  # the DRA device name (mlx5-0)
    rdma_device: str  # mlx5_0
    healthy: bool
    reason: str | None = None  # why it is unhealthy


def device_health(snapshot: NodeSnapshot, port_states: PortStates) -> tuple[DeviceHealth, ...]:
    """Every RDMA device of `snapshot` that has a DRA name, sorted by that name. A device
    whose name cannot become a DRA name is not published in a slice either: left out."""
    health: list[DeviceHealth] = []
    for device in snapshot.devices:
        try:
            name = device_name(device.name)
        except InvalidDeviceName:
            continue
        healthy, reason = adapter_health(device, port_states)
        health.append(DeviceHealth(name, device.name, healthy, reason))
    return tuple(sorted(health, key=lambda h: h.device))


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
