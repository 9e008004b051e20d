"""The device plugin against a kubelet emulator: real gRPC over unix sockets in a tmp dir.

Covers both registration modes, kubelet restarts, health pushed by port events (on Structs
and on a rendered lab tree), live config changes, Allocate/CDI/exclusive placement, bad
requests and a kubelet socket that never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import msgspec
import pytest

from agent.deviceplugin.advertised import AdvertisedResources, DevicePluginSettings
from agent.deviceplugin.registration import Backoff, RegistrationMode
from agent.host.inventory import collect_port_states, collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab import faults
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.deviceplugin import api_pb2
from proto.inventory import NodeSnapshot, PortStateName
from proto.messages.config import Selectors
from proto.messages.status import DevicePluginStatus, ResourceStatus
from tests.support.dpfakes import config, node, rdma_device, resource
from tests.support.kubelet import KubeletEmulator, PluginConnection, silent_socket
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

DOWN: tuple[PortStateName, str | None] = ("DOWN", "Disabled")
UP: tuple[PortStateName, str | None] = ("ACTIVE", "LinkUp")
SHARED = "rdma/hca_shared"


@dataclass(frozen=True)
class Dirs:
    plugins: Path
    registry: Path
    cdi: Path


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    # unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    try:
        yield Dirs(plugins=root / "device-plugins", registry=root / "reg", cdi=root / "cdi")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_manager(
    dirs: Dirs,
    *,
    mode: RegistrationMode = "legacy",
    statuses: list[DevicePluginStatus] | None = None,
    **overrides: object,
) -> AdvertisedResources:
    settings = DevicePluginSettings(
        device_plugin_dir=dirs.plugins,
        plugins_registry_dir=dirs.registry,
        registration_mode=mode,
        cdi_dir=dirs.cdi,
        watch_interval=0.02,
        call_timeout=1.0,
        backoff=Backoff(initial=0.05, maximum=0.5),
        watcher_grace=30.0,
    )
    settings = replace(settings, **overrides)  # type: ignore[arg-type]
    sink = statuses.append if statuses is not None else None
    return AdvertisedResources(settings, node="gpu-001", on_status=sink)


@contextlib.asynccontextmanager
async def running(manager: AdvertisedResources) -> AsyncIterator[AdvertisedResources]:
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield manager
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def two_adapters(**states: tuple[str, str]) -> object:
    return node(
        rdma_device("mlx5_0", 0, numa=0, ports=[states.get("mlx5_0", UP)]),  # type: ignore[list-item]
        rdma_device("mlx5_1", 1, numa=1, ports=[states.get("mlx5_1", UP)]),  # type: ignore[list-item]
    )


def health(response: api_pb2.ListAndWatchResponse) -> set[str]:
    return {d.health for d in response.devices}


def resource_status(manager: AdvertisedResources, name: str = SHARED) -> ResourceStatus:
    return next(r for r in manager.status() if r.name == name)


def registered(manager: AdvertisedResources, name: str = SHARED) -> bool:
    return any(r.name == name and r.registration == "registered" for r in manager.status())


async def test_legacy_registration_advertises_the_resource(dirs: Dirs) -> None:
    statuses: list[DevicePluginStatus] = []
    manager = make_manager(dirs, statuses=statuses)
    manager.apply_config(config(resource(hca_max=4)), generation=7)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin = await kubelet.plugin(SHARED)
        first = await plugin.next_list()
        await wait_until(lambda: registered(manager), what="registered status")
    request = kubelet.registrations[0]
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1",
        "nicfleet-rdma_hca_shared.sock",  # relative to the device-plugins dir
        SHARED,
    )
    assert not request.options.get_preferred_allocation_available
    assert [d.ID for d in first.devices] == ["0", "1", "2", "3"]
    assert health(first) == {"Healthy"}
    assert [n.ID for n in first.devices[0].topology.nodes] == [0, 1]
    last = next(s for s in reversed(statuses) if s.registered)
    assert last.config_generation == 7
    assert last.resources[0].devices == ("mlx5_0", "mlx5_1")
    assert last.resources[0].registration_mode == "legacy"
    assert not (dirs.plugins / request.endpoint).exists()  # removed on stop


async def test_watcher_registration_through_plugins_registry(dirs: Dirs) -> None:
    dirs.registry.mkdir(parents=True)
    manager = make_manager(dirs, mode="auto")
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with (
        KubeletEmulator(dirs.plugins, plugins_registry=dirs.registry) as kubelet,
        running(manager),
    ):
        plugin = await kubelet.plugin(SHARED)
        assert health(await plugin.next_list()) == {"Healthy"}
        await wait_until(lambda: registered(manager), what="watcher registration")
        status = resource_status(manager)
    info = kubelet.watcher_infos[0]
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DevicePlugin",
        SHARED,
        ["v1beta1"],
    )
    assert info.endpoint == str(dirs.plugins / "nicfleet-rdma_hca_shared.sock")
    assert kubelet.notifications == [(SHARED, True, "")]
    assert kubelet.registrations == []  # no legacy Register call
    assert status.registration_mode == "watcher"


async def test_watcher_refusal_is_retried_with_backoff_and_shown(dirs: Dirs) -> None:
    dirs.registry.mkdir(parents=True)
    statuses: list[DevicePluginStatus] = []
    manager = make_manager(dirs, mode="watcher", statuses=statuses)
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with (
        KubeletEmulator(dirs.plugins, plugins_registry=dirs.registry, reject_watcher=2) as kubelet,
        running(manager),
    ):
        await kubelet.plugin(SHARED)
        await wait_until(lambda: registered(manager), what="registration after refusals")
    assert [ok for _, ok, _ in kubelet.notifications] == [False, False, True]
    rejected = [s.resources[0] for s in statuses if s.resources[0].registration == "rejected"]
    assert rejected[0].registration_error == "emulated registration failure"
    assert max(r.registration_attempts for r in rejected) == 2


async def test_auto_mode_falls_back_to_legacy_when_no_watcher_calls(dirs: Dirs) -> None:
    dirs.registry.mkdir(parents=True)  # the dir exists, but nothing watches it
    manager = make_manager(dirs, mode="auto", watcher_grace=0.3)
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        await kubelet.plugin(SHARED)
        await wait_until(lambda: registered(manager), what="legacy fallback")
        assert resource_status(manager).registration_mode == "legacy"
        assert list(dirs.registry.iterdir()) == []  # the watcher socket is gone


@pytest.mark.parametrize("mode", ["legacy", "watcher"])
async def test_kubelet_restart_re_registers(dirs: Dirs, mode: RegistrationMode) -> None:
    dirs.registry.mkdir(parents=True)
    manager = make_manager(dirs, mode=mode)
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    registry = dirs.registry if mode == "watcher" else None
    async with (
        KubeletEmulator(dirs.plugins, plugins_registry=registry) as kubelet,
        running(manager),
    ):
        before = await kubelet.plugin(SHARED)
        await before.next_list()
        await kubelet.restart()  # every socket in the dir deleted, a new kubelet.sock
        after = await kubelet.plugin(SHARED)
        assert after is not before
        assert health(await after.next_list()) == {"Healthy"}
        await wait_until(lambda: registered(manager), what="registered again")
    assert not (dirs.plugins / "nicfleet-rdma_hca_shared.sock").exists()  # removed on stop


async def test_port_down_turns_the_stream_unhealthy_and_back(dirs: Dirs) -> None:
    snapshot = two_adapters()
    manager = make_manager(dirs)
    manager.apply_config(
        config(resource(), resource("ib_excl", exclusive=True, devices=["mlx5_0", "mlx5_1"])),
        generation=1,
    )
    manager.update(snapshot, {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        shared = await kubelet.plugin(SHARED)
        exclusive = await kubelet.plugin("rdma/ib_excl")
        assert health(await shared.next_list()) == {"Healthy"}
        await exclusive.next_list()
        one_down = {("mlx5_0", 1): DOWN, ("mlx5_1", 1): UP}
        manager.update(snapshot, one_down)  # type: ignore[arg-type]
        update = await exclusive.wait_list(lambda r: "Unhealthy" in health(r))
        assert {d.ID: d.health for d in update.devices} == {
            "0000:19:00.0": "Unhealthy",
            "0000:29:00.0": "Healthy",
        }
        manager.update(snapshot, {("mlx5_0", 1): DOWN, ("mlx5_1", 1): DOWN})  # type: ignore[arg-type]
        assert health(await shared.wait_list(lambda r: "Unhealthy" in health(r))) == {"Unhealthy"}
        status = resource_status(manager)
        assert (status.advertised, status.healthy) == (4, 0)
        assert status.unhealthy["mlx5_1"] == "no port ACTIVE/LinkUp (1:DOWN/Disabled)"
        manager.update(snapshot, {("mlx5_0", 1): UP, ("mlx5_1", 1): DOWN})  # type: ignore[arg-type]
        assert health(await shared.wait_list(lambda r: "Healthy" in health(r))) == {"Healthy"}


async def test_port_fault_on_a_lab_tree_reaches_the_stream(dirs: Dirs) -> None:
    root = dirs.cdi.parent / "sys"
    render(load_builtin("h100-ib-12nic"), root)
    sysfs = Sysfs(root)
    snapshot = collect_snapshot(sysfs, node="gpu-001", seq=1, now=0.0, agent_version="t")
    rails = [f"mlx5_{i}" for i in (0, 3)]
    manager = make_manager(dirs)
    manager.apply_config(config(resource("rail", exclusive=True, devices=rails)), generation=1)
    manager.update(snapshot, collect_port_states(sysfs))
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin = await kubelet.plugin("rdma/rail")
        first = await plugin.next_list()
        assert health(first) == {"Healthy"}
        assert [n.ID for d in first.devices for n in d.topology.nodes] == [0, 0]
        faults.port_down(root, "mlx5_0", 1)
        manager.update(snapshot, collect_port_states(sysfs))  # the agent's state poll
        down = await plugin.wait_list(lambda r: "Unhealthy" in health(r))
        assert {d.ID: d.health for d in down.devices} == {
            "0000:19:00.0": "Unhealthy",
            "0000:3b:00.0": "Healthy",
        }
        faults.port_up(root, "mlx5_0", 1)
        manager.update(snapshot, collect_port_states(sysfs))
        await plugin.wait_list(lambda r: health(r) == {"Healthy"})


async def test_config_changes_apply_live(dirs: Dirs) -> None:
    snapshot = two_adapters()
    manager = make_manager(dirs)
    manager.apply_config(config(resource(hca_max=2)), generation=1)
    manager.update(snapshot, {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        shared = await kubelet.plugin(SHARED)
        assert len((await shared.next_list()).devices) == 2
        excl = resource("excl", exclusive=True, devices=["mlx5_0"])
        manager.apply_config(config(resource(hca_max=2), excl), generation=2)  # add
        added = await kubelet.plugin("rdma/excl")
        assert added.options is not None and added.options.get_preferred_allocation_available
        assert [d.ID for d in (await added.next_list()).devices] == ["0000:19:00.0"]
        wider = msgspec.structs.replace(
            excl, selectors=Selectors(rdma_devices=("mlx5_0", "mlx5_1"))
        )
        manager.apply_config(config(resource(hca_max=8), wider), generation=3)  # change
        grown = await added.wait_list(lambda r: len(r.devices) == 2)
        assert [d.ID for d in grown.devices] == ["0000:19:00.0", "0000:29:00.0"]
        assert len((await shared.wait_list(lambda r: len(r.devices) == 8)).devices) == 8
        manager.apply_config(config(wider), generation=4)  # remove the shared one
        assert (await shared.wait_list(lambda r: not r.devices)).devices == []
        await asyncio.wait_for(shared.stream_ended.wait(), 5)
        await wait_until(lambda: not (dirs.plugins / "nicfleet-rdma_hca_shared.sock").exists())
        assert [r.name for r in manager.status()] == ["rdma/excl"]
        assert manager.plugin_status().config_generation == 4
        assert kubelet.plugins["rdma/excl"] is added  # never restarted


async def test_allocate_device_specs_and_envs(dirs: Dirs) -> None:
    manager = make_manager(dirs)
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin = await kubelet.plugin(SHARED)
        response = await plugin.allocate(["0"], ["1", "2"])
    assert len(response.container_responses) == 2
    first = response.container_responses[0]
    assert [(d.host_path, d.container_path, d.permissions) for d in first.devices] == [
        (p, p, "rw")
        for p in [
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/umad0",
            "/dev/infiniband/issm0",
            "/dev/infiniband/uverbs1",
            "/dev/infiniband/umad1",
            "/dev/infiniband/issm1",
            "/dev/infiniband/rdma_cm",
        ]
    ]
    assert dict(first.envs) == {
        "NICFLEET_RDMA_DEVICES": "mlx5_0,mlx5_1",
        "NICFLEET_PCI_ADDRESSES": "0000:19:00.0,0000:29:00.0",
        "NICFLEET_NETDEVS": "ib0,ib1",
    }
    assert list(first.cdi_devices) == []


async def test_allocate_with_cdi_names_cdi_devices_from_the_written_spec(dirs: Dirs) -> None:
    manager = make_manager(dirs, cdi=True)
    manager.apply_config(config(resource(), resource("one", devices=["mlx5_1"])), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    spec = json.loads((dirs.cdi / "nicfleet.io-rdma.json").read_text())
    assert [d["name"] for d in spec["devices"]] == ["mlx5_0", "mlx5_1"]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin = await kubelet.plugin("rdma/one")
        response = (await plugin.allocate(["3"])).container_responses[0]
    assert resource_status(manager, "rdma/one").unmatched == {
        "mlx5_0": "rdmaDevices: RDMA device mlx5_0 not in [mlx5_1]"
    }
    assert [c.name for c in response.cdi_devices] == ["nicfleet.io/rdma=mlx5_1"]
    assert list(response.devices) == []
    assert dict(response.envs) == {  # CDI edits carry no env: Allocate still sends it
        "NICFLEET_RDMA_DEVICES": "mlx5_1",
        "NICFLEET_PCI_ADDRESSES": "0000:29:00.0",
        "NICFLEET_NETDEVS": "ib1",
    }
    assert all("env" not in d["containerEdits"] for d in spec["devices"])


async def test_exclusive_preferred_allocation_over_grpc(dirs: Dirs) -> None:
    switch = ("pci0000:80", "0000:80:01.0", "0000:81:00.0")
    snapshot = node(
        rdma_device("mlx5_0", 0, numa=0),
        rdma_device("mlx5_1", 1, numa=0, chain=(*switch, "0000:82:01.0")),
        rdma_device("mlx5_2", 2, numa=1),
        rdma_device("mlx5_3", 3, numa=0, chain=(*switch, "0000:82:02.0")),
    )
    manager = make_manager(dirs)
    manager.apply_config(config(resource("excl", exclusive=True)), generation=1)
    manager.update(snapshot, {})
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin = await kubelet.plugin("rdma/excl")
        ids = [d.ID for d in (await plugin.next_list()).devices]
        preferred = await plugin.preferred(ids, [], 2)
        allocated = await plugin.allocate(list(preferred))
    assert preferred == ("0000:29:00.0", "0000:49:00.0")  # mlx5_1 and mlx5_3 share a switch
    envs = allocated.container_responses[0].envs
    assert envs["NICFLEET_RDMA_DEVICES"] == "mlx5_1,mlx5_3"
    assert envs["NICFLEET_PCI_ADDRESSES"] == "0000:29:00.0,0000:49:00.0"


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value


async def test_bad_requests_get_an_error_status_and_the_server_keeps_serving(dirs: Dirs) -> None:
    manager = make_manager(dirs)
    manager.apply_config(config(resource(hca_max=4)), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin = await kubelet.plugin(SHARED)
        stub = plugin.stub
        cases = [
            (plugin.allocate(["0", "no-such-id"]), "unknown device ID 'no-such-id'"),
            (plugin.allocate(), "Allocate: no container requests"),
            (plugin.allocate([]), "Allocate: no device IDs"),
            (plugin.allocate(["0"] * 10**6), "1000000 device IDs requested"),
            (plugin.preferred(["0", "1"], [], 5), "allocation_size 5 exceeds"),
            (
                stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["9"])),
                "unknown device ID '9'",
            ),
        ]
        for call, message in cases:
            error = await _refused(call)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in (error.details() or "")
        # Past the 4 MB message limit gRPC itself refuses, before the plugin sees it.
        huge = await _refused(plugin.allocate([f"id-{i}" for i in range(10**6)]))
        assert huge.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        ok = await plugin.allocate(["0"])
        assert len(ok.container_responses) == 1
        assert not plugin.stream_ended.is_set()


async def test_unanswering_kubelet_is_retried_with_bounded_backoff(dirs: Dirs) -> None:
    statuses: list[DevicePluginStatus] = []
    manager = make_manager(dirs, statuses=statuses, call_timeout=0.2)
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    kubelet_sock = dirs.plugins / "kubelet.sock"
    async with running(manager):
        with silent_socket(kubelet_sock):
            await wait_until(
                lambda: resource_status(manager).registration_attempts >= 3,
                what="three failed attempts",
            )
            status = resource_status(manager)
            assert status.registration == "retrying"
            assert "DEADLINE_EXCEEDED" in (status.registration_error or "")
            assert not manager.plugin_status().registered
        async with KubeletEmulator(dirs.plugins) as kubelet:  # a kubelet that answers
            await kubelet.plugin(SHARED)
            await wait_until(lambda: registered(manager), what="registered once kubelet answers")
    assert any(
        "DEADLINE_EXCEEDED" in (r.registration_error or "") for s in statuses for r in s.resources
    )
    assert resource_status(manager).registration_attempts == 0


async def test_full_list_is_re_sent_periodically(dirs: Dirs) -> None:
    manager = make_manager(dirs, resend_interval=0.1)
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        plugin: PluginConnection = await kubelet.plugin(SHARED)
        first = await plugin.next_list()
        again = await plugin.next_list(timeout=5)
    assert msgspec.json.encode(str(again)) == msgspec.json.encode(str(first))


async def test_a_failing_selector_or_status_sink_never_breaks_updates(dirs: Dirs) -> None:
    calls: list[str] = []

    def flaky_select(snapshot: object, rc: object) -> object:
        calls.append("select")
        raise RuntimeError("selector bug")

    def broken_sink(status: DevicePluginStatus) -> None:
        raise RuntimeError("queue full")

    manager = AdvertisedResources(
        make_manager(dirs).settings,
        node="gpu-001",
        select=flaky_select,  # type: ignore[arg-type]
        on_status=broken_sink,
    )
    manager.apply_config(config(resource()), generation=1)
    manager.update(two_adapters(), {})  # type: ignore[arg-type]
    manager.update(two_adapters(), {("mlx5_0", 1): DOWN})  # type: ignore[arg-type]
    assert calls  # it was asked, failed, and nothing was raised to the agent
    assert resource_status(manager).advertised == 0


async def test_exclusive_netns_mode_turns_shared_resources_unhealthy(dirs: Dirs) -> None:
    # The mode is read from ib_core's netns_mode parameter on a rendered lab tree, as the
    # agent reads it; `rdma system set netns exclusive` flips that very file.
    root = dirs.cdi.parent / "sys"
    render(load_builtin("h100-ib-12nic"), root)
    sysfs = Sysfs(root)
    parameter = root / "module/ib_core/parameters/netns_mode"
    assert parameter.read_text().strip() == "Y"

    def snapshot(seq: int) -> NodeSnapshot:
        return collect_snapshot(sysfs, node="gpu-001", seq=seq, now=0.0, agent_version="t")

    statuses: list[DevicePluginStatus] = []
    manager = make_manager(dirs, statuses=statuses)
    rails = ["mlx5_0", "mlx5_3"]
    manager.apply_config(
        config(resource("rail", devices=rails), resource("excl", exclusive=True, devices=rails)),
        generation=1,
    )
    manager.update(snapshot(1), collect_port_states(sysfs))
    async with KubeletEmulator(dirs.plugins) as kubelet, running(manager):
        shared = await kubelet.plugin("rdma/rail")
        exclusive = await kubelet.plugin("rdma/excl")
        assert health(await shared.next_list()) == {"Healthy"}
        assert health(await exclusive.next_list()) == {"Healthy"}
        parameter.write_text("N\n")
        manager.update(snapshot(2), collect_port_states(sysfs))
        blocked = await shared.wait_list(lambda r: health(r) == {"Unhealthy"})
        assert len(blocked.devices) == 4  # still advertised: capacity 4, allocatable 0
        status = resource_status(manager, "rdma/rail")
        assert (status.advertised, status.healthy, status.unhealthy) == (4, 0, {})
        assert status.unhealthy_reason is not None
        assert status.unhealthy_reason.startswith("netns-exclusive: ")
        excl = resource_status(manager, "rdma/excl")
        assert (excl.healthy, excl.unhealthy_reason) == (2, None)
        # What the agent publishes (the aggregator's trace and `nicfleetctl resources`).
        sent = {r.name: r.unhealthy_reason for r in statuses[-1].resources}
        assert sent == {"rdma/rail": status.unhealthy_reason, "rdma/excl": None}
        parameter.write_text("Y\n")
        manager.update(snapshot(3), collect_port_states(sysfs))
        await shared.wait_list(lambda r: health(r) == {"Healthy"})
        assert resource_status(manager, "rdma/rail").unhealthy_reason is None
