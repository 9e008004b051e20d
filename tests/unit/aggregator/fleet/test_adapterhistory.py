"""The adapter history (pure): what one agent process showed of a node's adapters and
advertised peaks, afresh for a new process or config generation; and the fleet keeps it on
the record for live messages only."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.fleet import adapterhistory
from aggregator.fleet.adapterhistory import lists_devices, observe_snapshot, observe_status
from aggregator.fleet.state import Fleet, NodeRecord
from proto.inventory import Device, NodeSnapshot, ReadError
from proto.messages.status import DevicePluginStatus
from tests.support.builders import T0, nic, plugin_status, resource_status, snapshot

A, B = nic("mlx5_0", index=0), nic("mlx5_1", index=1)


def snap(*devices: Device, errors: tuple[ReadError, ...] = ()) -> NodeSnapshot:
    return msgspec.structs.replace(snapshot(devices=tuple(devices), gpus=0), errors=errors)


def test_gone_adapters_are_kept_and_present_ones_refreshed() -> None:
    first = observe_snapshot(None, snap(A, B), epoch=1, received_at=T0)
    later = observe_snapshot(first, snap(A), epoch=1, received_at=T0 + 5)
    assert [(a.name, a.key, a.first_seen, a.last_seen) for a in later.adapters] == [
        ("mlx5_0", "0000:19:00.0", T0, T0 + 5),
        ("mlx5_1", "0000:1a:00.0", T0, T0),
    ]
    assert later.since == T0


def test_a_new_agent_process_starts_afresh() -> None:
    first = observe_snapshot(None, snap(A, B), epoch=1, received_at=T0)
    again = observe_snapshot(first, snap(A), epoch=2, received_at=T0 + 5)
    assert ([a.name for a in again.adapters], again.since) == (["mlx5_0"], T0 + 5)


@pytest.mark.parametrize(
    ("errors", "devices", "listed"),
    [
        pytest.param((), (A,), True, id="clean"),
        pytest.param((ReadError(path="/class/infiniband", error="EIO"),), (), False, id="eio"),
        pytest.param((ReadError(path="/class/infiniband/mlx5_0/x", error="ETIMEDOUT"),), (),
                     False, id="collection-timed-out"),
        pytest.param((ReadError(path="/bus/pci/devices", error="ETIMEDOUT"),), (A,), True,
                     id="other-read-timed-out"),
        pytest.param((ReadError(path="/bus/pci/devices", error="EACCES"),), (), True,
                     id="no-device-at-all"),
    ],
)  # fmt: skip
def test_lists_devices(
    errors: tuple[ReadError, ...], devices: tuple[Device, ...], listed: bool
) -> None:
    assert lists_devices(snap(*devices, errors=errors)) is listed


def test_an_unlisted_snapshot_changes_nothing() -> None:
    first = observe_snapshot(None, snap(A, B), epoch=1, received_at=T0)
    failed = snap(errors=(ReadError(path="/class/infiniband", error="EIO"),))
    assert observe_snapshot(first, failed, epoch=1, received_at=T0 + 5) is first


def test_peaks_rise_and_start_over_with_a_config_generation() -> None:
    def status(advertised: int, generation: int) -> DevicePluginStatus:
        served = resource_status("rdma/ib", devices=("mlx5_0", "mlx5_1"), advertised=advertised)
        return plugin_status("gpu-001", served, generation=generation)

    h = observe_status(None, status(8, 1), epoch=1, received_at=T0)
    h = observe_status(h, status(6, 1), epoch=1, received_at=T0 + 1)
    assert (h.peaks["rdma/ib"].advertised, h.peaks["rdma/ib"].at) == (8, T0)
    same = observe_status(h, status(8, 1), epoch=1, received_at=T0 + 2)
    assert same is h
    h = observe_status(h, status(6, 2), epoch=1, received_at=T0 + 3)
    assert (h.peaks["rdma/ib"].advertised, h.peaks["rdma/ib"].config_generation) == (6, 2)


def test_the_fleet_keeps_it_for_live_messages_only() -> None:
    loaded = NodeRecord(name="gpu-001", snapshot=snap(A, B), first_seen=T0, last_seen=T0)
    fleet = Fleet([loaded])
    assert loaded.adapters is None and fleet.get("gpu-001") is loaded
    fleet.apply_snapshot(msgspec.structs.replace(snap(A), seq=2, collected_at=T0 + 1), T0 + 1)
    record = fleet.get("gpu-001")
    assert record is not None and record.adapters is not None
    assert [a.name for a in record.adapters.adapters] == ["mlx5_0"]
    assert adapterhistory.TIMED_OUT == "ETIMEDOUT"
