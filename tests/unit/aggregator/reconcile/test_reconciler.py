"""The reconcile loop against a recording Kubernetes writer (the KubeWriter boundary) and
a cluster source double: status documents, Events, labels, invalid policies, leadership."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from aggregator.cluster import ClusterNode, ClusterView
from aggregator.errors import KubeError
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.reconcile.loop import Reconciler, ReconcileSettings
from aggregator.reconcile.policies import ClusterPolicies, FilePolicies
from proto.inventory import GpuNicRelation
from proto.policy import Policy
from tests.support.builders import T0, nic, plugin_status, rdma_policy, resource_status, snapshot


class RecordingKube:
    def __init__(self) -> None:
        self.statuses: dict[str, dict[str, Any]] = {}
        self.status_patches = 0
        self.events: list[tuple[str, str, str, str]] = []
        self.labels: dict[str, dict[str, str | None]] = {}
        self.fail = False

    async def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> None:
        if self.fail:
            raise KubeError("API server unavailable")
        self.status_patches += 1
        self.statuses[name] = dict(status)

    async def create_event(
        self,
        *,
        kind: Literal["Node", "NicFleetPolicy"],
        name: str,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",
        uid: str | None = None,
        instance: str = "",
    ) -> None:
        self.events.append((kind, name, reason, type))

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        self.labels.setdefault(name, {}).update(labels)


class Error(msgspec.Struct, frozen=True):
    name: str
    path: str

    def __str__(self) -> str:
        return f"NicFleetPolicy {self.name}: {self.path}: unknown field"


class Watcher:
    def __init__(self, policies: tuple[Policy, ...], nodes: dict[str, ClusterNode]) -> None:
        self._policies = policies
        self.errors: tuple[Error, ...] = ()
        self.nodes = nodes

    def policies(self) -> tuple[Policy, ...]:
        return self._policies

    def policy_errors(self) -> tuple[Error, ...]:
        return self.errors

    def cluster_view(self) -> ClusterView:
        return ClusterView(present=True, nodes=dict(self.nodes))


def fleet_with(*nodes: str, healthy: int = 64) -> Fleet:
    fleet = Fleet()
    for node in nodes:
        snap = msgspec.structs.replace(
            snapshot(node, devices=(nic("mlx5_0"),)),
            gpu_nic_topology=(GpuNicRelation(gpu="0000:18:00.0", nic="mlx5_0", relation="PIX"),),
        )
        fleet.apply_snapshot(snap, T0)
        status = plugin_status(node, resource_status("rdma/ib", advertised=64, healthy=healthy))
        fleet.apply_status(status, T0)
    return fleet


def reconciler(
    fleet: Fleet, watcher: Watcher, kube: RecordingKube, leader: list[bool] | None = None
) -> Reconciler:
    leading = leader if leader is not None else [True]
    return Reconciler(
        ReconcileSettings(stale_after=30.0),
        fleet=fleet,
        changes=ChangeFeed().subscribe(),
        policies=ClusterPolicies(watcher),
        store=None,
        kube=kube,
        cluster=watcher.cluster_view,
        is_leader=lambda: leading[0],
        observed_generation=lambda name: 3,
        clock=lambda: T0 + 1,
    )


POLICY = rdma_policy("ib", "rdma/ib", labels={"pool": "gpu"})
NODES = {
    "a": ClusterNode(name="a", labels={"pool": "gpu"}, allocatable={"rdma/ib": "64"}),
    "b": ClusterNode(name="b", labels={"pool": "gpu"}, allocatable={"rdma/ib": "0"}),
}


async def test_status_events_and_labels_are_written() -> None:
    kube = RecordingKube()
    watcher = Watcher((POLICY,), dict(NODES))
    rec = reconciler(fleet_with("a", "b"), watcher, kube)
    await rec.reconcile_once()
    doc = kube.statuses["ib"]
    assert doc["observedGeneration"] == 3
    assert doc["nodes"] == {"selected": 2, "configured": 2, "advertising": 1, "healthy": 2}
    conditions = {c["type"]: c for c in doc["conditions"]}
    advertised = conditions["ResourcesAdvertised"]
    assert (advertised["status"], advertised["reason"]) == ("False", "AllocatableZero")
    assert "b:" in advertised["message"] and "rdma/ib" in advertised["message"]
    assert conditions["Ready"]["status"] == "False"
    assert ("Node", "b", "AllocatableZero", "Warning") in kube.events
    assert ("NicFleetPolicy", "ib", "NodeReady", "Normal") in kube.events
    assert kube.labels["a"] == {
        "nicfleet.io/rdma": "true",
        "nicfleet.io/link-layer": "InfiniBand",
        "nicfleet.io/rdma-rate-gbps": "400",
        "nicfleet.io/gpu-nic-relation": "PIX",
    }

    # Nothing changed: no new patch, no new Event.
    patches, events = kube.status_patches, len(kube.events)
    await rec.reconcile_once()
    assert (kube.status_patches, len(kube.events)) == (patches, events)

    # The kubelet catches up: allocatable > 0 on b, Ready, one Normal Event per object.
    watcher.nodes["b"] = msgspec.structs.replace(NODES["b"], allocatable={"rdma/ib": "64"})
    await rec.reconcile_once()
    ready = {c["type"]: c["status"] for c in kube.statuses["ib"]["conditions"]}["Ready"]
    assert ready == "True"
    assert kube.events[events:] == [
        ("NicFleetPolicy", "ib", "NodeReady", "Normal"),
        ("Node", "b", "NodeReady", "Normal"),
    ]


async def test_invalid_cluster_policy_keeps_last_good_and_reports() -> None:
    kube = RecordingKube()
    watcher = Watcher((POLICY,), dict(NODES))
    rec = reconciler(fleet_with("a"), watcher, kube)
    await rec.reconcile_once()
    desired_before = rec.plan().desired
    watcher._policies = ()
    watcher.errors = (Error(name="ib", path="$.spec.expect.mtu"),)
    report = await rec.reconcile_once()
    assert rec.plan().desired == desired_before and rec.plan().actions == ()
    assert [p.metadata.name for p in report.policies] == ["ib"]
    assert any("$.spec.expect.mtu" in e for e in report.errors)
    degraded = next(c for c in kube.statuses["ib"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidPolicy" and "$.spec.expect.mtu" in degraded["message"]

    # A policy that was never valid still gets a status naming the field.
    watcher.errors = (*watcher.errors, Error(name="new", path="$.spec.nodeSelector"))
    await rec.reconcile_once()
    ready = next(c for c in kube.statuses["new"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidPolicy" and "$.spec.nodeSelector" in ready["message"]


async def test_follower_writes_nothing_and_failures_are_reported() -> None:
    kube = RecordingKube()
    leader = [False]
    rec = reconciler(fleet_with("a"), Watcher((POLICY,), dict(NODES)), kube, leader)
    report = await rec.reconcile_once()
    assert not report.leader and kube.statuses == {} and kube.events == []
    assert [n.node for n in report.nodes] == ["a", "b"]  # every replica serves reads
    leader[0] = True
    kube.fail = True
    report = await rec.reconcile_once()
    assert report.leader and any("API server unavailable" in e for e in report.errors)
    kube.fail = False
    await rec.reconcile_once()
    assert "ib" in kube.statuses


async def test_loop_replans_when_the_policy_file_changes(tmp_path: Any) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("")
    source = FilePolicies(path, interval=0.01)
    fleet = fleet_with("a")
    rec = Reconciler(
        ReconcileSettings(tick=60.0),
        fleet=fleet,
        changes=ChangeFeed().subscribe(),
        policies=source,
        store=None,
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(source.run(stop))
        tasks.create_task(rec.run(stop))
        await asyncio.wait_for(rec.updated.wait(), 5)
        path.write_text(
            "apiVersion: nicfleet.io/v1alpha1\nkind: NicFleetPolicy\nmetadata: {name: p}\n"
        )
        while not rec.latest().policies:
            rec.updated.clear()
            await asyncio.wait_for(rec.updated.wait(), 5)
        path.write_text("apiVersion: nicfleet.io/v1alpha1\nkind: Nope\n")
        while not rec.latest().errors:
            rec.updated.clear()
            await asyncio.wait_for(rec.updated.wait(), 5)
        stop.set()
    assert [p.metadata.name for p in rec.latest().policies] == ["p"]
    assert "$.kind" in rec.latest().errors[0]


async def test_loop_plans_a_node_that_joins_right_after_a_round() -> None:
    # The change arrives within `settle` of the round before: the round waits, then runs.
    fleet = fleet_with("a")
    feed = ChangeFeed()
    watcher = Watcher((POLICY,), {"a": NODES["a"]})
    rec = Reconciler(
        ReconcileSettings(tick=600.0, settle=0.2),
        fleet=fleet,
        changes=feed.subscribe(),
        policies=ClusterPolicies(watcher),
        store=None,
        cluster=watcher.cluster_view,
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(rec.run(stop))
        await asyncio.wait_for(rec.updated.wait(), 5)
        assert [n.node for n in rec.latest().nodes] == ["a"]
        watcher.nodes["b"] = NODES["b"]
        fleet.apply_snapshot(snapshot("b", devices=(nic("mlx5_0"),)), T0)
        feed.publish("b", "snapshot")
        while [n.node for n in rec.latest().nodes] != ["a", "b"]:
            rec.updated.clear()
            await asyncio.wait_for(rec.updated.wait(), 5)
        stop.set()
    assert rec.rounds == 2  # tick is 600 s: the change made the second round
