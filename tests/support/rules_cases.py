"""Small explicit builders for rule table tests: adapters, nodes, fleets and scenarios,
and `hits()` — the (node, subject) pairs one rule reports for a scenario."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.state import Fleet, NodeRecord
from aggregator.rules.engine.registry import evaluate
from aggregator.rules.finding import Finding
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS, Thresholds
from proto.inventory import (
    Device,
    Gid,
    Gpu,
    GpuNicRelation,
    Interface,
    LinkLayer,
    ModuleInfo,
    NodeSnapshot,
    Pcie,
    Platform,
    Port,
    PortStateName,
    Relation,
    Sriov,
)
from proto.messages.counters import CounterBatch, PortCounters
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.policy import Policy, load_policies

T0 = 1_800_000_000.0


def adapter(
    name: str = "mlx5_0",
    pci: str = "0000:19:00.0",
    *,
    device_id: str = "0x1021",
    fw: str | None = "28.41.1000",
    layer: LinkLayer = "InfiniBand",
    state: PortStateName = "ACTIVE",
    phys: str | None = None,
    rate: float | None = 400.0,
    mtu: int | None = 4092,
    netdev: str | None = None,
    numa: int | None = 0,
    gid: str | None = "fe80:0000:0000:0000:58a2:e103:001b:2576",
    pcie: Pcie | None = None,
    physfn: str | None = None,
    counters: dict[str, int] | None = None,
) -> Device:
    ifname = netdev or ("ib" if layer == "InfiniBand" else "eth") + name.rsplit("_", 1)[-1]
    return Device(
        name=name,
        pci_address=pci,
        vendor_id="0x15b3",
        device_id=device_id,
        driver="mlx5_core",
        fw_ver=fw,
        numa_node=numa,
        netdevs=(ifname,),
        interfaces=(
            Interface(name=ifname, port=1, mtu=mtu, type=32 if layer == "InfiniBand" else 1),
        ),
        pcie=pcie,
        sriov=Sriov(physfn=physfn) if physfn else None,
        ports=(
            Port(
                port=1,
                state=state,
                phys_state=phys or ("LinkUp" if state == "ACTIVE" else "Disabled"),
                link_layer=layer,
                rate_gbps=rate,
                gids=(Gid(index=0, gid=gid),) if gid else (),
                counters=counters or {},
            ),
        ),
    )


def roce(name: str, pci: str, ip: str, *, mtu: int = 9000, **kw: Any) -> Device:
    """A RoCE adapter whose GID table holds the IPv4-mapped GID of `ip`."""
    a, b, c, d = (int(x) for x in ip.split("."))
    gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    kw.setdefault("device_id", "0x101d")
    kw.setdefault("fw", "22.39.1002")
    kw.setdefault("rate", 100.0)
    return adapter(name, pci, layer="Ethernet", mtu=mtu, gid=gid, **kw)


def gpu(pci: str, numa: int | None = 0) -> Gpu:
    return Gpu(pci_address=pci, numa_node=numa, driver="nvidia")


def node(
    name: str = "n1",
    *devices: Device,
    gpus: tuple[Gpu, ...] = (),
    topo: tuple[tuple[str, str, Relation], ...] = (),
    platform: Platform | None = None,
    modules: Mapping[str, str | None] | None = None,
    collected_at: float = T0,
    seq: int = 1,
) -> NodeSnapshot:
    return NodeSnapshot(
        node=name,
        agent_version="t",
        seq=seq,
        collected_at=collected_at,
        devices=devices or (adapter(),),
        gpus=gpus,
        gpu_nic_topology=tuple(GpuNicRelation(gpu=g, nic=n, relation=r) for g, n, r in topo),
        platform=platform or Platform(peermem=True),
        modules={m: ModuleInfo(version=v) for m, v in (modules or {}).items()},
    )


def port_counters(
    device: str = "mlx5_0",
    port: int = 1,
    *,
    rates: dict[str, float] | None = None,
    saturated: tuple[str, ...] = (),
    resets: tuple[str, ...] = (),
    counters: dict[str, int] | None = None,
) -> PortCounters:
    return PortCounters(
        device=device,
        port=port,
        rates=rates or {},
        saturated=saturated,
        resets=resets,
        counters=counters or {},
    )


def batch(node_name: str = "n1", *ports: PortCounters, at: float = T0) -> CounterBatch:
    return CounterBatch(node=node_name, seq=2, collected_at=at, interval_s=1.0, ports=ports)


def status(node_name: str = "n1", *resources: ResourceStatus, at: float = T0) -> DevicePluginStatus:
    return DevicePluginStatus(node=node_name, registered=True, resources=resources, observed_at=at)


def policy(text: str) -> tuple[Policy, ...]:
    return load_policies(text, source="test.yaml")


def policy_doc(name: str = "p", **spec: Any) -> tuple[Policy, ...]:
    document = {
        "apiVersion": "nicfleet.io/v1alpha1",
        "kind": "NicFleetPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
    return policy(msgspec.json.encode(document).decode())


@dataclass(frozen=True)
class Scenario:
    snapshots: tuple[NodeSnapshot, ...] = ()
    counters: tuple[CounterBatch, ...] = ()
    statuses: tuple[DevicePluginStatus, ...] = ()
    policies: tuple[Policy, ...] = ()
    cluster: ClusterView = NO_CLUSTER
    now: float = T0
    thresholds: Thresholds = field(default=DEFAULT_THRESHOLDS)

    def fleet(self) -> Mapping[str, NodeRecord]:
        fleet = Fleet()
        for snap in self.snapshots:
            fleet.apply_snapshot(snap, received_at=snap.collected_at)
        for b in self.counters:
            fleet.apply_counters(b, received_at=b.collected_at)
        for s in self.statuses:
            fleet.apply_status(s, received_at=s.observed_at)
        return fleet.view()

    def findings(self) -> list[Finding]:
        return evaluate(
            self.fleet(), self.policies, self.cluster, self.now, thresholds=self.thresholds
        )


def fleet_of(*snaps: NodeSnapshot, **kw: Any) -> Scenario:
    return Scenario(snapshots=snaps, **kw)


def hits(rule: str, scenario: Scenario) -> set[tuple[str | None, str]]:
    return {(f.node, f.subject) for f in scenario.findings() if f.rule == rule}
