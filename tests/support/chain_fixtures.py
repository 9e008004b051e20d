"""A fleet with device-plugin status, policies and a cluster view for the trace/resources
API and CLI tests: gpu-001 healthy, gpu-002 with every rdma/ib port down."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from aggregator.api.app import ApiSettings, build_app
from aggregator.cluster import ClusterNode, ClusterView, NetworkAttachment, PodRequest
from aggregator.fleet.state import Fleet
from proto.http import ValidationRecord
from proto.inventory import Device, PortStateName
from proto.policy import Policy
from tests.support.api_fixtures import STALE_AFTER, FakeClock, Readiness
from tests.support.builders import (
    T0,
    modules,
    nic,
    plugin_status,
    rdma_policy,
    resource_status,
    snapshot,
)

RES = "rdma/ib"


def _adapters(state: PortStateName) -> tuple[Device, ...]:
    return tuple(
        msgspec.structs.replace(
            nic(f"mlx5_{i}", index=i, netdevs=(f"ib{i}",), state=state),
            fw_ver="28.39.1002",
        )
        for i in range(2)
    )


def chain_fleet() -> Fleet:
    fleet = Fleet()
    cases: tuple[tuple[str, PortStateName, int], ...] = (
        ("gpu-001", "ACTIVE", 2),
        ("gpu-002", "DOWN", 0),
    )
    for node, state, healthy in cases:
        snap = msgspec.structs.replace(snapshot(node, devices=_adapters(state)), modules=modules())
        fleet.apply_snapshot(snap, T0)
        unhealthy = {} if healthy else {"mlx5_0": "port 1 DOWN", "mlx5_1": "port 1 DOWN"}
        status = resource_status(
            RES, devices=("mlx5_0", "mlx5_1"), healthy=healthy, unhealthy=unhealthy
        )
        fleet.apply_status(plugin_status(node, status), T0)
    return fleet


def chain_cluster() -> ClusterView:
    return ClusterView(
        present=True,
        nodes={
            "gpu-001": ClusterNode(name="gpu-001", allocatable={RES: "2"}),
            "gpu-002": ClusterNode(name="gpu-002", allocatable={RES: "2"}),
        },
        pods=(
            PodRequest(
                namespace="ml", name="t-0", node="gpu-001", phase="Running", requests={RES: 1}
            ),
        ),
        attachments=(
            NetworkAttachment(namespace="ml", name="ib", resource_name=RES, master="ib0"),
        ),
    )


@dataclass
class ChainHarness:
    fleet: Fleet = field(default_factory=chain_fleet)
    cluster: ClusterView = field(default_factory=ClusterView)
    policies: tuple[Policy, ...] = (rdma_policy("ib", RES),)
    clock: FakeClock = field(default_factory=FakeClock)
    # node -> its newest finished validation of RES (the trace's last two links)
    validations: dict[str, ValidationRecord] = field(default_factory=dict)

    def app(self) -> web.Application:
        return build_app(
            fleet=self.fleet,
            settings=ApiSettings(stale_after=STALE_AFTER),
            readiness=Readiness(),
            clock=self.clock,
            cluster_source=lambda: self.cluster,
            policy_source=lambda: self.policies,
            latest_validation=lambda node, resource: self.validations.get(node),
        )
