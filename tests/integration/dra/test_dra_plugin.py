"""The DRA kubelet plugin against the lab kubelet: real gRPC over unix sockets.

Plugin-watcher registration, NodePrepare/Unprepare (idempotent, checkpointed across an
agent restart, per-claim errors, a hostile kubelet), the health stream following a lab
port fault (every share copy too), re-registration after a kubelet restart, and the
whole agent with `dra` on, publishing the plugin's status.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import nats
import nats.aio.msg
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.deviceplugin.registration import Backoff
from agent.dra.pluginrunner import DraPlugin, DraSettings
from agent.host.inventory import collect_port_states, collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab import faults, kubeletrun
from agent.lab.kubeletdra import DraKubeletEmulator, claim_object, write_claim
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import decode
from proto.dra import health_pb2, healthv1alpha1_pb2, healthv1alpha1_pb2_grpc
from proto.draslices import SliceSettings
from proto.inventory import NodeSnapshot
from proto.messages.status import DevicePluginStatus
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE = "dra-node-01"
DRIVER = "rdma.nicfleet.io"
UID_A = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_B = "1c5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_C = "2d5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
CLAIM_A = ("ml", UID_A, "nic-a")
CLAIM_B = ("ml", UID_B, "nic-b")
CLAIM_C = ("ml", UID_C, "nic-c")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def dra_settings(root: Path, **kw: Any) -> DraSettings:
    return DraSettings(
        plugins_dir=root / "plugins",
        plugins_registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        claims_dir=root / "claims",
        watch_interval=0.02,
        backoff=Backoff(initial=0.05, maximum=0.5),
        **kw,
    )


@asynccontextmanager
async def serving(plugin: DraPlugin) -> AsyncIterator[DraPlugin]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(plugin.run(stop))
        try:
            yield plugin
        finally:
            stop.set()


def lab_node(root: Path) -> Path:
    tree = root / "sys"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), tree)
    return tree


@dataclass(frozen=True)
class FedPlugin:
    """A plugin fed the lab node's snapshot and port states once, as the agent starts."""

    plugin: DraPlugin
    tree: Path
    snapshot: NodeSnapshot

    def port_poll(self) -> None:
        """The agent's port poll: port states read now beside the snapshot of the start,
        so only the port states can carry a fault."""
        self.plugin.update(self.snapshot, collect_port_states(Sysfs(self.tree)))


def fed(settings: DraSettings, tree: Path) -> FedPlugin:
    snapshot = collect_snapshot(Sysfs(tree), node=NODE, seq=1, now=0.0, agent_version="t")
    started = FedPlugin(DraPlugin(settings, node=NODE), tree, snapshot)
    started.port_poll()
    return started


def fed_plugin(settings: DraSettings, tree: Path) -> DraPlugin:
    return fed(settings, tree).plugin


def allocate(settings: DraSettings, claim: tuple[str, str, str], *devices: str) -> None:
    write_claim(
        settings.claims_dir,
        claim_object(claim, [(f"r{i}", DRIVER, NODE, d) for i, d in enumerate(devices)]),
    )


def health_of(response: health_pb2.NodeWatchResourcesResponse) -> dict[str, int]:
    return {d.device.device_name: d.health for d in response.devices}


async def test_register_prepare_unprepare_and_restart(short_dir: Path) -> None:
    settings = dra_settings(short_dir)
    tree = lab_node(short_dir)
    allocate(settings, CLAIM_A, "mlx5-0", "mlx5-1")
    async with DraKubeletEmulator(settings.plugins_registry_dir) as kubelet:
        async with serving(fed_plugin(settings, tree)) as plugin:
            conn = await kubelet.plugin(DRIVER)
            await wait_until(lambda: plugin.state == "registered", what="registration")
            info = kubelet.infos[-1]
            assert (info.type, info.name) == ("DRAPlugin", DRIVER)
            assert info.endpoint == str(settings.plugins_dir / DRIVER / "dra.sock")
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            # A kubelet before the v1 health API reads the same stream under v1alpha1.
            older = healthv1alpha1_pb2_grpc.DRAResourceHealthStub(conn.channel)
            stream = older.NodeWatchResources(healthv1alpha1_pb2.NodeWatchResourcesRequest())
            first_health = await asyncio.wait_for(stream.read(), timeout=10)
            stream.cancel()
            assert isinstance(first_health, healthv1alpha1_pb2.NodeWatchResourcesResponse)
            assert {d.device.pool_name for d in first_health.devices} == {NODE}
            assert {d.device.device_name for d in first_health.devices} >= {"mlx5-0", "mlx5-1"}
            assert settings.registration_socket.name == "rdma.nicfleet.io-reg.sock"

            first = await conn.prepare(CLAIM_A)
            entry = first.claims[UID_A]
            assert entry.error == ""
            assert [(d.pool_name, d.device_name) for d in entry.devices] == [
                (NODE, "mlx5-0"),
                (NODE, "mlx5-1"),
            ]
            assert list(entry.devices[0].cdi_device_ids) == [
                f"rdma.nicfleet.io/claim={UID_A}-mlx5-0"
            ]
            spec_file = settings.cdi_dir / f"rdma.nicfleet.io-claim_{UID_A}.json"
            spec = json.loads(spec_file.read_text())
            assert "NICFLEET_RDMA_DEVICES=mlx5_0,mlx5_1" in spec["containerEdits"]["env"]
            assert (await conn.prepare(CLAIM_A)) == first  # kubelet repeats itself

        # The agent restarts; the claim's object is gone (forwarding stopped): the
        # checkpoint still answers, and unprepare removes exactly the spec it wrote.
        (settings.claims_dir / f"{UID_A}.json").unlink()
        other = settings.cdi_dir / "someone-else.json"
        other.write_text("{}")
        async with serving(fed_plugin(settings, tree)):
            conn = await kubelet.plugin(DRIVER, after=conn)
            assert (await conn.prepare(CLAIM_A)) == first
            done = await conn.unprepare(CLAIM_A)
            assert done.claims[UID_A].error == ""
            assert sorted(p.name for p in settings.cdi_dir.iterdir()) == ["someone-else.json"]
            assert (await conn.unprepare(CLAIM_A)).claims[UID_A].error == ""


async def test_bad_claims_answer_per_claim_and_a_hostile_kubelet_is_bounded(
    short_dir: Path,
) -> None:
    settings = dra_settings(short_dir)
    tree = lab_node(short_dir)
    allocate(settings, CLAIM_A, "mlx5-2")
    allocate(settings, CLAIM_B, "mlx5-7")  # no such RDMA device
    write_claim(
        settings.claims_dir, claim_object(CLAIM_C, [("gpu", "gpu.nvidia.com", NODE, "gpu-0")])
    )
    garbage = ("ns", "\x00" * 5000, "x" * 5000)
    async with (
        DraKubeletEmulator(settings.plugins_registry_dir) as kubelet,
        serving(fed_plugin(settings, tree)),
    ):
        conn = await kubelet.plugin(DRIVER)
        response = await conn.prepare(
            CLAIM_A, CLAIM_B, CLAIM_C, ("ml", UID_A.replace("0", "9"), "unknown"), garbage
        )
        errors = {uid: c.error for uid, c in response.claims.items()}
        assert errors[UID_A] == ""
        assert "no RDMA device mlx5_7" in errors[UID_B]
        assert "no device of rdma.nicfleet.io" in errors[UID_C]
        assert "not a UID" in errors[garbage[1]]
        assert len(errors) == 5

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await conn.prepare(*[CLAIM_A] * 1000)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # ...and the plugin still serves.
        assert (await conn.prepare(CLAIM_A)).claims[UID_A].error == ""
        assert (await conn.unprepare(garbage)).claims[garbage[1]].error


async def test_health_stream_follows_a_lab_port_fault(short_dir: Path) -> None:
    settings = dra_settings(short_dir)
    tree = lab_node(short_dir)
    node = fed(settings, tree)
    plugin = node.plugin
    async with DraKubeletEmulator(settings.plugins_registry_dir) as kubelet, serving(plugin):
        conn = await kubelet.plugin(DRIVER)
        healthy = await conn.wait_health(lambda r: len(r.devices) == 4)
        assert set(health_of(healthy).values()) == {health_pb2.HEALTHY}
        assert {d.device.pool_name for d in healthy.devices} == {NODE}

        faults.port_down(tree, "mlx5_1", 1)
        node.port_poll()  # the agent's port poll
        down = await conn.wait_health(lambda r: health_of(r)["mlx5-1"] == health_pb2.UNHEALTHY)
        assert len(down.devices) == 4  # every message lists every device
        assert [d.message for d in down.devices if d.health == health_pb2.UNHEALTHY] == [
            "no port ACTIVE/LinkUp (1:DOWN/Disabled)"
        ]
        assert conn.unhealthy() == ("mlx5-1",)

        faults.port_up(tree, "mlx5_1", 1)
        node.port_poll()
        await conn.wait_health(lambda r: set(health_of(r).values()) == {health_pb2.HEALTHY})


async def test_a_kubelet_restart_re_registers(short_dir: Path) -> None:
    settings = dra_settings(short_dir)
    tree = lab_node(short_dir)
    async with (
        DraKubeletEmulator(settings.plugins_registry_dir, reject=1) as kubelet,
        serving(fed_plugin(settings, tree)) as plugin,
    ):
        await wait_until(lambda: plugin.state == "rejected", what="the emulated refusal")
        # A kubelet restart wipes the sockets; the plugin serves them again and registers.
        await kubelet.restart(wipe=[settings.registration_socket, settings.endpoint])
        conn = await kubelet.plugin(DRIVER, timeout=10)
        await wait_until(lambda: plugin.state == "registered", what="re-registration")
        await conn.wait_health(lambda r: len(r.devices) == 4)


async def test_share_copies_carry_their_devices_health(short_dir: Path) -> None:
    settings = dra_settings(short_dir, slices=SliceSettings(sharing="copies", share=2))
    tree = lab_node(short_dir)
    node = fed(settings, tree)
    plugin = node.plugin
    async with DraKubeletEmulator(settings.plugins_registry_dir) as kubelet, serving(plugin):
        conn = await kubelet.plugin(DRIVER)
        healthy = await conn.wait_health(lambda r: len(r.devices) == 8)
        assert sorted(health_of(healthy)) == [f"mlx5-{i}-s{c}" for i in range(4) for c in (0, 1)]
        faults.port_down(tree, "mlx5_1", 1)
        node.port_poll()
        await conn.wait_health(lambda r: health_of(r)["mlx5-1-s1"] == health_pb2.UNHEALTHY)
        assert conn.unhealthy() == ("mlx5-1-s0", "mlx5-1-s1")


async def test_the_agent_with_dra_on(nats_server: NatsServer, short_dir: Path) -> None:
    tree = lab_node(short_dir)
    dra = dra_settings(short_dir, slices=SliceSettings(sharing="consumable", share=4))
    settings = AgentSettings(
        node_name=NODE,
        sysfs_root=tree,
        nats_url=nats_server.url,
        netlink=False,
        state_poll_interval=0.05,
        dra=dra,
    )
    allocate(dra, CLAIM_A, "mlx5-0")
    statuses: asyncio.Queue[DevicePluginStatus] = asyncio.Queue()

    async def on_status(msg: nats.aio.msg.Msg) -> None:
        await statuses.put(decode(msg.data, DevicePluginStatus))

    async def status_where(check: Any) -> DevicePluginStatus:
        while True:
            status = await statuses.get()
            if status.dra is not None and check(status.dra):
                return status

    nc = await nats.connect(nats_server.url)
    await nc.subscribe(subjects.node_subject(NODE, subjects.STATUS), cb=on_status)
    service = AgentService(settings)
    stop = asyncio.Event()
    try:
        async with (
            DraKubeletEmulator(dra.plugins_registry_dir) as kubelet,
            asyncio.TaskGroup() as tg,
        ):
            tg.create_task(service.run(stop))
            try:
                conn = await kubelet.plugin(DRIVER, timeout=15)
                await conn.wait_health(lambda r: len(r.devices) == 4, timeout=15)
                # The lab's fault command, seen by the agent's own port-state poll.
                fault = ["lab", "fault", "port-down", "--root", str(tree), "--device", "mlx5_0"]
                assert CliRunner().invoke(main, fault).exit_code == 0
                await conn.wait_health(
                    lambda r: health_of(r).get("mlx5-0") == health_pb2.UNHEALTHY, timeout=10
                )
                prepared = await conn.prepare(CLAIM_A)
                assert prepared.claims[UID_A].devices[0].device_name == "mlx5-0"
                assert (await conn.prepare(CLAIM_B)).claims[UID_B].error  # not allocated

                # Published by the agent although its device plugin is off.
                status = await asyncio.wait_for(
                    status_where(lambda d: d.state == "registered" and d.prepared and d.failed),
                    timeout=10,
                )
                assert (status.node, status.resources, status.registered) == (NODE, (), False)
                assert status.dra is not None
                assert status.dra.endpoint == str(dra.endpoint)
                assert (status.dra.slices.sharing, status.dra.slices.share) == ("consumable", 4)
                (claim,) = status.dra.prepared
                assert (claim.uid, claim.devices) == (UID_A, ("mlx5-0",))
                assert claim.cdi_ids == (f"{DRIVER}/claim={UID_A}-mlx5-0",)
                assert claim.at > 0
                assert [(f.uid, f.name) for f in status.dra.failed] == [(UID_B, "nic-b")]
                assert status.dra.unhealthy.keys() == {"mlx5-0"}

                allocate(dra, CLAIM_B, "mlx5-1")  # forwarded at last: prepared, not failed
                assert (await conn.prepare(CLAIM_B)).claims[UID_B].error == ""
                await asyncio.wait_for(
                    status_where(lambda d: len(d.prepared) == 2 and not d.failed), timeout=10
                )
            finally:
                stop.set()
    finally:
        await nc.close()


async def test_the_lab_kubelet_runner_writes_what_its_dra_side_sees(short_dir: Path) -> None:
    settings = dra_settings(short_dir)
    tree = lab_node(short_dir)
    state_file = settings.plugins_registry_dir / kubeletrun.DRA_STATE_FILE
    node = fed(settings, tree)
    plugin = node.plugin

    def state() -> dict[str, Any]:
        if not state_file.exists():
            return {}
        drivers: dict[str, Any] = json.loads(state_file.read_text())["drivers"]
        return drivers

    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg, serving(plugin):
        tg.create_task(kubeletrun.serve([], stop, dra_registries=[settings.plugins_registry_dir]))
        try:
            await wait_until(lambda: len(state().get(DRIVER, {}).get("devices", [])) == 4)
            faults.port_down(tree, "mlx5_3", 1)
            node.port_poll()
            await wait_until(lambda: state()[DRIVER]["unhealthy"] == ["mlx5-3"])
        finally:
            stop.set()
    assert not state_file.exists()
