"""What one agent process has shown this aggregator process of a node's adapters: every RDMA
device it reported (with its PCI address and model) and, per resource, the highest count
its device plugin advertised — so that a device or capacity that goes away is a finding
(aggregator.rules.adapters) rather than a silent drop.

Kept in memory on the `NodeRecord`, never in KV: a record loaded on start has none, so
nothing is judged against state this process never observed. A new agent process starts
it afresh (restarting the agent accepts its hardware as it is now); so does a new device-
plugin config generation for the advertised peaks (a narrower selector is not a loss).
Pure: no I/O, no clock (callers pass `received_at`).
"""

from __future__ import annotations

from typing import Final

import msgspec

from proto.inventory import Device, NodeSnapshot
from proto.messages.status import DevicePluginStatus

# Host-level read errors that mean the snapshot could not list the RDMA devices: such a
# snapshot says nothing about which adapters are there. A collection past its time bound
# (agent.host.deadlines) is sent with no device and one ETIMEDOUT error.
LISTING_PATHS: Final = frozenset({"/class/infiniband", "/"})
TIMED_OUT: Final = "ETIMEDOUT"


class SeenAdapter(msgspec.Struct, frozen=True, kw_only=True):
    """An RDMA device as the agent last reported it while it was there."""

    name: str  # mlx5_1
    pci_address: str | None
    board_id: str | None  # the model as the PSID says it (MT_0000000838)
    hca_type: str | None  # MT4129
    device_id: str | None  # PCI device ID, 0x1021
    netdevs: tuple[str, ...]
    first_seen: float  # receive time of the first snapshot of this process that had it
    last_seen: float  # ... and of the last one

    @property
    def key(self) -> str:
        """The identity that survives a re-registration under another name."""
        return self.pci_address or self.name


class ResourcePeak(msgspec.Struct, frozen=True, kw_only=True):
    """The most a resource offered under one config generation: the highest advertised
    count and the most adapters behind it. Both, since a shared resource advertises
    rdmaHcaMax device IDs however many adapters serve them; an exclusive one, one each."""

    advertised: int
    devices: tuple[str, ...]  # the largest set of adapters the plugin selected
    config_generation: int
    at: float  # receive time of the status that last raised either


class AdapterHistory(msgspec.Struct, frozen=True, kw_only=True):
    epoch: int  # the agent process it is of (NodeRecord.instance)
    since: float  # when this process first heard that agent process's adapters
    adapters: tuple[SeenAdapter, ...] = ()  # by key, in first-seen order
    peaks: dict[str, ResourcePeak] = msgspec.field(default_factory=dict)


def adapter_key(device: Device) -> str:
    """SeenAdapter.key of a device as a snapshot lists it."""
    return device.pci_address or device.name


def lists_devices(snap: NodeSnapshot) -> bool:
    """Whether `snap` can say which RDMA devices are there (its listing did not fail)."""
    if any(e.path in LISTING_PATHS for e in snap.errors):
        return False
    return bool(snap.devices) or not any(e.error == TIMED_OUT for e in snap.errors)


def observe_snapshot(
    history: AdapterHistory | None, snap: NodeSnapshot, *, epoch: int, received_at: float
) -> AdapterHistory:
    """`history` with what `snap` (of agent process `epoch`) shows: new adapters added,
    present ones refreshed; gone ones kept, so their absence can be told."""
    base = _of(history, epoch, received_at)
    if not lists_devices(snap):
        return base
    seen = {a.key: a for a in base.adapters}
    for device in snap.devices:
        seen[adapter_key(device)] = _seen(device, seen.get(adapter_key(device)), received_at)
    adapters = tuple(seen.values())
    if adapters == base.adapters:
        return base
    return msgspec.structs.replace(base, adapters=adapters)


def observe_status(
    history: AdapterHistory | None, status: DevicePluginStatus, *, epoch: int, received_at: float
) -> AdapterHistory:
    """`history` with the device plugin's advertised counts: a resource's peak rises with
    it and starts over with a new config generation."""
    base = _of(history, epoch, received_at)
    peaks = dict(base.peaks)
    for r in status.resources:
        if r.config_error is not None:
            continue  # not served (resource-config-invalid says why)
        peak = peaks.get(r.name)
        generation = status.config_generation
        if peak is None or peak.config_generation != generation:
            peak = ResourcePeak(
                advertised=r.advertised, devices=r.devices, config_generation=generation,
                at=received_at,
            )  # fmt: skip
        elif r.advertised > peak.advertised or len(r.devices) > len(peak.devices):
            peak = ResourcePeak(
                advertised=max(r.advertised, peak.advertised),
                devices=r.devices if len(r.devices) > len(peak.devices) else peak.devices,
                config_generation=generation,
                at=received_at,
            )
        peaks[r.name] = peak
    if peaks == base.peaks:
        return base
    return msgspec.structs.replace(base, peaks=peaks)


def _of(history: AdapterHistory | None, epoch: int, received_at: float) -> AdapterHistory:
    if history is not None and history.epoch == epoch:
        return history
    return AdapterHistory(epoch=epoch, since=received_at)


def _seen(device: Device, old: SeenAdapter | None, received_at: float) -> SeenAdapter:
    return SeenAdapter(
        name=device.name,
        pci_address=device.pci_address,
        board_id=device.board_id,
        hca_type=device.hca_type,
        device_id=device.device_id,
        netdevs=device.netdevs,
        first_seen=received_at if old is None else old.first_seen,
        last_seen=received_at,
    )
