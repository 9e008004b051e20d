"""Reconcile end to end without a cluster: `--policy` file → aggregator plans → KV
nicfleet-config → lab agents' device plugins (kubelet emulator) apply → their status comes
back → policy Ready. Live edits, an invalid edit and a conflict, on real NATS and gRPC."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import kmock
import nats
import pytest
import yaml

from agent.bus.desired import DesiredSettings
from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClusterWatcher
from aggregator.reconcile.loop import Reconciler, ReconcileSettings
from aggregator.reconcile.policies import ClusterPolicies
from aggregator.reconcile.status import PolicyStatus
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import decode
from proto.messages.config import DesiredConfig
from proto.policy import load_policies
from tests.support.builders import T0, nic, plugin_status, resource_status, snapshot
from tests.support.kubelet import KubeletEmulator, PluginConnection
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
NODES = ("rc-01", "rc-02")


def policy_doc(name: str, hca_max: int, resource: str = "roce") -> dict[str, object]:
    return {
        "apiVersion": "nicfleet.io/v1alpha1",
        "kind": "NicFleetPolicy",
        "metadata": {"name": name},
        "spec": {
            "rdmaSharedDevicePlugin": {
                "configList": [
                    {"resourceName": resource, "rdmaHcaMax": hca_max,
                     "selectors": {"linkTypes": ["ether"]}}
                ]
            },
            "expect": {"linkLayer": "Ethernet", "maxGpuNicRelation": "SYS"},
        },
    }  # fmt: skip


def write_policies(path: Path, *docs: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump_all(docs))
    tmp.replace(path)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="rcn", dir="/tmp"))  # unix socket path limit
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def running(owner: AggregatorService | AgentService) -> AsyncIterator[None]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(owner.run(stop))
        try:
            yield
        finally:
            stop.set()


def agent_settings(url: str, node: str, root: Path, plugins: Path) -> AgentSettings:
    return AgentSettings(
        node_name=node,
        sysfs_root=root,
        nats_url=url,
        netlink=False,
        device_plugin_enabled=True,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins,
            plugins_registry_dir=plugins.parent / "no-registry",
            registration_mode="legacy",
            watch_interval=0.02,
            backoff=Backoff(initial=0.05, maximum=0.5),
        ),
        desired=DesiredSettings(retry_initial=0.05, retry_max=0.2),
    )


def status_of(reconciler: Reconciler, policy: str) -> PolicyStatus | None:
    return next((s for s in reconciler.latest().statuses if s.policy == policy), None)


def condition(status: PolicyStatus | None, type_: str) -> str | None:
    if status is None:
        return None
    return next(c.status for c in status.conditions if c.type == type_)


async def stored_generation(url: str, node: str) -> int:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.KV_CONFIG)
        entry = await kv.get(subjects.node_token(node))
        assert entry.value is not None
        return decode(entry.value, DesiredConfig).generation
    finally:
        await nc.close()


async def test_policy_file_drives_agents_live(  # own server: no nodes of other tests
    own_nats: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.yaml"
    write_policies(policy_file, policy_doc("roce", 4))
    settings = AggregatorSettings(
        nats_url=own_nats.url,
        listen_port=0,
        policies=load_policies(policy_file.read_text(), source=str(policy_file)),
        policy_file=policy_file,
        policy_watch_interval=0.05,
        reconcile_tick=0.5,
    )
    aggregator = AggregatorService(settings)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running(aggregator))
        await asyncio.wait_for(aggregator.ready.wait(), timeout=15)
        reconciler = aggregator.reconciler
        assert reconciler is not None
        plugins: dict[str, PluginConnection] = {}
        for node in NODES:
            root = tmp_path / node
            render(with_node_name(load_builtin("roce-cx6dx"), node), root)
            kubelet_dir = short_dir / node / "device-plugins"
            kubelet = await stack.enter_async_context(KubeletEmulator(kubelet_dir))
            agent = AgentService(agent_settings(own_nats.url, node, root, kubelet_dir))
            await stack.enter_async_context(running(agent))
            plugins[node] = await kubelet.plugin("rdma/roce", timeout=20)

        async def every_node_lists(count: int) -> None:
            for plugin in plugins.values():
                await plugin.wait_list(lambda r: len(r.devices) == count, timeout=20)

        def ready() -> bool:
            status = status_of(reconciler, "roce")
            return condition(status, "Ready") == "True" and status is not None and (
                status.summary.selected == len(NODES)
            )  # fmt: skip

        await every_node_lists(4)
        await wait_until(ready, timeout=20, what="policy Ready on both nodes")
        status = status_of(reconciler, "roce")
        assert status is not None
        assert {c.type: c.status for c in status.conditions} == {
            "Ready": "True", "Degraded": "False", "ConfigApplied": "True",
            "ResourcesAdvertised": "True", "TopologyOK": "True",
        }  # fmt: skip
        assert {n.node: n.resources for n in status.nodes} == {n: {"rdma/roce": 4} for n in NODES}
        assert [await stored_generation(own_nats.url, n) for n in NODES] == [1, 1]

        # A live edit reaches every agent's kubelet, and the status follows.
        write_policies(policy_file, policy_doc("roce", 8))
        await every_node_lists(8)

        def applied(generation: int) -> bool:
            status = status_of(reconciler, "roce")
            return ready() and status is not None and all(
                n.applied_generation == generation for n in status.nodes
            )  # fmt: skip

        await wait_until(lambda: applied(2), timeout=20, what="generation 2 applied")

        # An invalid edit: reported with the field, the last good config stays everywhere.
        bad = policy_doc("roce", 2)
        bad["spec"]["rdmaSharedDevicePlugin"]["configList"][0]["rdmaHcaMx"] = 3  # type: ignore[index]
        write_policies(policy_file, bad)
        await wait_until(lambda: bool(reconciler.latest().errors), what="error reported")
        (error,) = reconciler.latest().errors
        assert "configList[0]" in error and "rdmaHcaMx" in error
        status = status_of(reconciler, "roce")
        assert condition(status, "Degraded") == "True"
        assert [await stored_generation(own_nats.url, n) for n in NODES] == [2, 2]
        for plugin in plugins.values():
            assert len((await plugin.allocate(["0"])).container_responses) == 1
        assert all(n.applied_generation == 2 for n in status.nodes) if status else False

        # Two policies selecting the same nodes: a conflict, and nobody's config changes.
        write_policies(policy_file, policy_doc("roce", 8), policy_doc("roce-b", 16, "roce2"))
        await wait_until(
            lambda: len(reconciler.latest().conflicts) == len(NODES), what="conflicts reported"
        )
        report = reconciler.latest()
        assert report.errors == ()
        assert {c.node: c.policies for c in report.conflicts} == dict.fromkeys(
            NODES, ("roce", "roce-b")
        )
        assert condition(status_of(reconciler, "roce"), "Ready") == "False"
        assert [await stored_generation(own_nats.url, n) for n in NODES] == [2, 2]
        rounds = reconciler.rounds
        await wait_until(lambda: reconciler.rounds > rounds + 1, what="two more reconciles")
        assert [await stored_generation(own_nats.url, n) for n in NODES] == [2, 2]
        for plugin in plugins.values():
            assert len((await plugin.allocate(["7"])).container_responses) == 1


# --- with a cluster: kmock's KubernetesEmulator behind the real client ------------------

POLICIES = "nicfleet.io/v1alpha1/nicfleetpolicies"
KUBE_NODES = "v1/nodes"
EVENTS = "v1/events"


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    emu.resources[POLICIES] = kmock.ResourceInfo(
        kind="NicFleetPolicy", namespaced=False, subresources={"status"}
    )
    emu.resources[KUBE_NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
    emu.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    emu.resources[EVENTS] = kmock.ResourceInfo(kind="Event", namespaced=True)
    async with emu:
        yield emu


async def test_allocatable_zero_while_agent_advertises_is_reported_in_the_cluster(
    emulator: kmock.KubernetesEmulator,
) -> None:
    policy = policy_doc("ib", 8, "ib")
    policy["metadata"] = {"name": "ib", "generation": 2, "uid": "u-ib"}
    policy["spec"]["nodeSelector"] = {"matchLabels": {"pool": "gpu"}}  # type: ignore[index]
    emulator.objects[POLICIES, None, "ib"] = policy
    emulator.objects[KUBE_NODES, None, "gpu-1"] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-1", "labels": {"pool": "gpu"}},
        "status": {"allocatable": {"rdma/ib": "0"}, "capacity": {"rdma/ib": "0"}},
    }
    fleet = Fleet()
    fleet.apply_snapshot(snapshot("gpu-1", devices=(nic("mlx5_0", link_layer="Ethernet"),)), T0)
    fleet.apply_status(
        plugin_status("gpu-1", resource_status("rdma/ib", advertised=8), generation=1), T0
    )
    async with kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            watcher = ClusterWatcher(client)
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(watcher.run(stop))
                await asyncio.wait_for(watcher.policies_synced.wait(), 10)
                await asyncio.wait_for(watcher.nodes_synced.wait(), 10)
                objects = watcher.policy_objects()
                reconciler = Reconciler(
                    ReconcileSettings(),
                    fleet=fleet,
                    changes=ChangeFeed().subscribe(),
                    policies=ClusterPolicies(watcher),
                    store=None,
                    kube=client,
                    cluster=watcher.cluster_view,
                    observed_generation=lambda name: objects[name].generation,
                    clock=lambda: T0 + 1,
                )
                report = await reconciler.reconcile_once()
                stop.set()
    assert report.errors == ()
    status = emulator.objects[POLICIES, None, "ib"]["status"]
    assert status["observedGeneration"] == 2
    assert status["nodes"] == {"selected": 1, "configured": 1, "advertising": 0, "healthy": 1}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    advertised = conditions["ResourcesAdvertised"]
    assert (advertised["status"], advertised["reason"]) == ("False", "AllocatableZero")
    assert "gpu-1: rdma/ib allocatable 0 while the agent advertises 8" in advertised["message"]
    events = [obj for (res, _, _), obj in emulator.objects.items() if res == EVENTS]
    assert {(e["involvedObject"]["kind"], e["reason"], e["type"]) for e in events} == {
        ("Node", "AllocatableZero", "Warning"),
        ("NicFleetPolicy", "AllocatableZero", "Warning"),
    }
    labels = emulator.objects[KUBE_NODES, None, "gpu-1"]["metadata"]["labels"]
    assert labels["nicfleet.io/rdma"] == "true"
    assert labels["nicfleet.io/link-layer"] == "Ethernet"
    assert labels["pool"] == "gpu"
