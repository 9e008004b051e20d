"""DRA device health: the device plugin's rule per RDMA device (and per share copy of
it), and the feed's wake-ups."""

from __future__ import annotations

import asyncio

import pytest

from agent.deviceplugin.plan import PortStates
from agent.dra.health import DeviceHealth, HealthFeed, device_health
from proto import draslices
from proto.draslices import SliceSettings
from tests.support.builders import nic, snapshot


@pytest.mark.parametrize(
    ("poll", "expected"),
    [
        pytest.param({}, {"mlx5-0": True, "mlx5-bond-0": True}, id="no-poll-yet"),
        pytest.param(
            {("mlx5_0", 1): ("DOWN", "Disabled"), ("mlx5_bond_0", 1): ("ACTIVE", "LinkUp")},
            {"mlx5-0": False, "mlx5-bond-0": True},
            id="port-down",
        ),
        pytest.param(
            {("mlx5_bond_0", 1): ("ACTIVE", "LinkUp")},
            {"mlx5-0": False, "mlx5-bond-0": True},
            id="device-gone-from-poll",
        ),
    ],
)
def test_device_health_follows_the_port_poll(poll, expected) -> None:
    snap = snapshot(devices=(nic("mlx5_bond_0", index=1), nic("mlx5_0")))
    health = device_health(snap, poll)
    assert [h.device for h in health] == ["mlx5-0", "mlx5-bond-0"]  # sorted by DRA name
    assert {h.device: h.healthy for h in health} == expected
    assert all((h.reason is None) == h.healthy for h in health)


def test_a_device_without_uverbs_is_unhealthy_and_bad_names_are_left_out() -> None:
    snap = snapshot(
        devices=(nic("mlx5_0", char_devices=("/dev/infiniband/umad0",)), nic("odd-name", index=1))
    )
    assert device_health(snap, {}) == (
        DeviceHealth("mlx5-0", "mlx5_0", False, "no uverbs char device"),
    )


async def test_the_feed_wakes_streams_only_on_change() -> None:
    feed = HealthFeed(resend_interval=300)
    stream = feed.watch()
    assert await anext(stream) == ()
    healthy = (DeviceHealth("mlx5-0", "mlx5_0", True),)
    pending = asyncio.ensure_future(anext(stream))
    assert feed.publish(healthy)
    assert await asyncio.wait_for(pending, 5) == healthy
    assert not feed.publish(healthy)  # same list: nobody is woken
    assert feed.streams == 1
    await stream.aclose()
    assert feed.streams == 0


@pytest.mark.parametrize(
    ("slices", "names"),
    [
        pytest.param(
            SliceSettings(sharing="copies", share=3),
            ["mlx5-0-s0", "mlx5-0-s1", "mlx5-0-s2", "mlx5-1-s0", "mlx5-1-s1", "mlx5-1-s2"],
            id="copies",
        ),
        pytest.param(
            SliceSettings(sharing="copies", share=1), ["mlx5-0", "mlx5-1"], id="copies-of-one"
        ),
        pytest.param(
            SliceSettings(sharing="consumable", share=4), ["mlx5-0", "mlx5-1"], id="consumable"
        ),
        pytest.param(SliceSettings(), ["mlx5-0", "mlx5-1"], id="exclusive"),
    ],
)
def test_every_published_device_has_its_rdma_devices_health(slices, names) -> None:
    snap = snapshot(devices=(nic("mlx5_1", index=1), nic("mlx5_0")))
    poll: PortStates = {("mlx5_0", 1): ("ACTIVE", "LinkUp"), ("mlx5_1", 1): ("DOWN", "Disabled")}
    health = device_health(snap, poll, slices)
    assert [h.device for h in health] == names
    assert {h.device: h.healthy for h in health} == {n: n.startswith("mlx5-0") for n in names}
    # The same names as the node's slices: one definition of what is published.
    entries = draslices.device_entries(snap, {}, slices)
    assert sorted(e["name"] for e in entries) == names
