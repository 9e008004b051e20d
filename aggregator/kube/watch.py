"""Keeps the aggregator's picture of the cluster current: NicFleetPolicies and Nodes by
list+watch; pods requesting RDMA resources, NetworkAttachmentDefinitions and IP pools
(NV-IPAM, whereabouts), the chain's DaemonSets, FailedScheduling Events and the
NicClusterPolicy's status by periodic list; every driver's DRA ResourceClaims,
ResourceSlices and DeviceClasses by periodic list beside the pods (a cluster without
resource.k8s.io/v1, or an aggregator that may not read it, has `dra_present=False`); DRA
ResourceClaims by list+watch for the claim answerer (ClaimWatcher).

Owns the retry loops (a failed call never ends `run`; it is logged once and retried) and
announces every change through `changed` (an asyncio.Event the consumer clears) and an
optional callback. Reads only; the writers live on `aggregator.kube.client.KubeClient`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from aggregator.cluster import (
    ClusterNode,
    ClusterView,
    DaemonSetState,
    DraClaim,
    DraDevice,
    DraDeviceClass,
    HeldAddresses,
    IpPool,
    NetworkAttachment,
    OperatorStatus,
    PodRequest,
    SchedulingEvent,
)
from aggregator.dra.claims import ClaimIndex
from aggregator.errors import KubeError
from aggregator.kube.client import KubeClient
from aggregator.kube.objects import (
    Listing,
    PolicyObject,
    PolicyObjectError,
    WatchEvent,
    node_from_object,
    policy_from_object,
)
from proto.policy import Policy

log = logging.getLogger(__name__)

ChangeKind = Literal["policies", "nodes", "pods", "dra"]


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    pods_every_s: float = 30.0  # pods, NADs, IP pools, DRA: listed, not watched (the trace)
    retry_s: float = 1.0  # first retry after a failed call; doubles up to retry_max_s
    retry_max_s: float = 30.0


@dataclass(frozen=True)
class DraLists:
    """One round of the DRA lists; the default: resource.k8s.io/v1 not served or readable."""

    present: bool = False
    claims: tuple[DraClaim, ...] = ()
    devices: tuple[DraDevice, ...] = ()
    classes: tuple[DraDeviceClass, ...] = ()


NO_DRA = DraLists()


class ClusterWatcher:
    """The current ClusterView and policies, fed by `run(stop)`."""

    def __init__(
        self,
        kube: KubeClient,
        settings: WatchSettings = WatchSettings(),
        *,
        on_change: Callable[[ChangeKind], None] | None = None,
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._on_change = on_change
        self._policies: dict[str, PolicyObject] = {}
        self._nodes: dict[str, ClusterNode] = {}
        self._pods: tuple[PodRequest, ...] = ()
        self._attachments: tuple[NetworkAttachment, ...] = ()
        self._ip_pools: tuple[IpPool, ...] = ()
        self._held: tuple[HeldAddresses, ...] = ()
        self._daemonsets: tuple[DaemonSetState, ...] = ()
        self._events: tuple[SchedulingEvent, ...] = ()
        self._operator: OperatorStatus | None = None
        self._dra = NO_DRA
        self._view: ClusterView | None = None
        self.changed = asyncio.Event()  # set on every change; the consumer clears it
        self.policies_synced = asyncio.Event()  # the first policy list arrived
        self.nodes_synced = asyncio.Event()

    # --- what the reconciler reads ------------------------------------------------------

    def cluster_view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(
                present=True,
                nodes=dict(self._nodes),
                pods=self._pods,
                attachments=self._attachments,
                ip_pools=self._ip_pools,
                held_addresses=self._held,
                scheduling_events=self._events,
                daemonsets=self._daemonsets,
                nic_cluster_policy=self._operator,
                dra_present=self._dra.present,
                claims=self._dra.claims,
                dra_devices=self._dra.devices,
                device_classes=self._dra.classes,
            )
        return self._view

    def policies(self) -> tuple[Policy, ...]:
        """The valid policies, by name."""
        return tuple(
            obj.policy for _, obj in sorted(self._policies.items()) if obj.policy is not None
        )

    def policy_errors(self) -> tuple[PolicyObjectError, ...]:
        """One record per invalid policy object, naming the field."""
        return tuple(obj.error for _, obj in sorted(self._policies.items()) if obj.error)

    def policy_objects(self) -> Mapping[str, PolicyObject]:
        """Every policy object with its generation and uid (for status and Events)."""
        return MappingProxyType(dict(self._policies))

    # --- the loops ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(
                    self._sync(
                        stop,
                        "policies",
                        self._kube.list_policies,
                        self._kube.watch_policies,
                        self._replace_policies,
                        self._apply_policy,
                    )
                ),
                group.create_task(
                    self._sync(
                        stop,
                        "nodes",
                        self._kube.list_nodes,
                        self._kube.watch_nodes,
                        self._replace_nodes,
                        self._apply_node,
                    )
                ),
                group.create_task(self._poll_pods(stop)),
                group.create_task(self._poll_scheduling(stop)),
                group.create_task(self._poll_dra(stop)),
            ]
            await stop.wait()
            for task in tasks:
                task.cancel()

    async def _sync(
        self,
        stop: asyncio.Event,
        kind: ChangeKind,
        list_: Callable[[], Awaitable[Listing]],
        watch: Callable[[str | None], AsyncIterator[WatchEvent]],
        replace: Callable[[tuple[dict[str, Any], ...]], None],
        apply: Callable[[WatchEvent], bool],
    ) -> None:
        """List, then watch from the list's resourceVersion until the server ends the
        watch (or it fails); then list again, so nothing missed in between survives."""
        failures = 0
        while not stop.is_set():
            try:
                listing = await list_()
                replace(listing.items)
                async for event in watch(listing.resource_version):
                    failures = 0  # a watch that delivers is healthy
                    if apply(event):
                        self._announce(kind)
                failures = 0  # the server ended the watch normally: list again now
            except KubeError as exc:
                failures += 1
                if failures == 1:
                    log.warning("watching %s: %s; retrying", kind, exc)
                delay = min(
                    self._settings.retry_s * 2 ** (failures - 1), self._settings.retry_max_s
                )
                if await _wait_or_stop(stop, delay):
                    return

    async def _poll_pods(self, stop: asyncio.Event) -> None:
        failed = False
        while not stop.is_set():
            try:
                pods, daemonsets, held = await self._kube.list_pods_components_and_addresses()
                attachments = await self._kube.list_network_attachments()
                pools = await self._kube.list_ip_pools()
            except KubeError as exc:
                if not failed:
                    log.warning("pods, network attachments and IP pools: %s; retrying", exc)
                failed = True
            else:
                failed = False
                fresh = (pods, attachments, pools, daemonsets, held)
                if fresh != (
                    self._pods, self._attachments, self._ip_pools, self._daemonsets, self._held
                ):  # fmt: skip
                    (self._pods, self._attachments, self._ip_pools, self._daemonsets,
                     self._held) = fresh  # fmt: skip
                    self._announce("pods")
            if await _wait_or_stop(stop, self._settings.pods_every_s):
                return

    async def _poll_scheduling(self, stop: asyncio.Event) -> None:
        """FailedScheduling Events and the NicClusterPolicy's status, each on its own: the
        trace says "unknown" without them, and the pods' list must not wait on them."""
        failed: set[str] = set()  # warn once per outage of each
        while not stop.is_set():
            events, operator = self._events, self._operator
            try:
                events = await self._kube.list_scheduling_events()
                failed.discard("events")
            except KubeError as exc:
                _warn_once(failed, "events", f"FailedScheduling events: {exc}")
            try:
                operator = await self._kube.read_operator_status()
                failed.discard("operator")
            except KubeError as exc:
                _warn_once(failed, "operator", f"NicClusterPolicy status: {exc}")
            if (events, operator) != (self._events, self._operator):
                self._events, self._operator = events, operator
                self._announce("pods")
            if await _wait_or_stop(stop, self._settings.pods_every_s):
                return

    async def _poll_dra(self, stop: asyncio.Event) -> None:
        """Claims, slices and classes, each round all or nothing, on the pods' period; a
        loop of its own so a slow or absent resource.k8s.io never delays the pods."""
        failed: set[str] = set()  # warn once per outage
        while not stop.is_set():
            fresh = self._dra
            try:
                fresh = DraLists(
                    present=True,
                    claims=await self._kube.list_dra_claims(),
                    devices=await self._kube.list_dra_devices(),
                    classes=await self._kube.list_device_classes(),
                )
                failed.clear()
            except KubeError as exc:
                if exc.status in (403, 404):
                    # 404: no resource.k8s.io/v1 (before Kubernetes 1.34, or DRA off);
                    # 403: a ClusterRole without it. The trace then says "unknown".
                    fresh = NO_DRA
                    _warn_once(failed, "absent", f"DRA objects not readable ({exc})")
                else:  # unreachable or 5xx: keep the last lists, not a cluster without DRA
                    _warn_once(failed, "failed", f"DRA claims, slices and classes: {exc}")
            if fresh != self._dra:
                self._dra = fresh
                self._announce("dra")
            if await _wait_or_stop(stop, self._settings.pods_every_s):
                return

    # --- state updates ------------------------------------------------------------------

    def _replace_policies(self, items: tuple[dict[str, Any], ...]) -> None:
        fresh = {obj.name: obj for obj in map(policy_from_object, items) if obj.name}
        if fresh != self._policies or not self.policies_synced.is_set():
            self._policies = fresh
            self._announce("policies")
        self.policies_synced.set()

    def _apply_policy(self, event: WatchEvent) -> bool:
        obj = policy_from_object(event.object)
        if not obj.name:
            return False
        if event.type == "DELETED":
            return self._policies.pop(obj.name, None) is not None
        if self._policies.get(obj.name) == obj:
            return False  # a status write by us, or a re-list: nothing the user changed
        self._policies[obj.name] = obj
        return True

    def _replace_nodes(self, items: tuple[dict[str, Any], ...]) -> None:
        found = (node_from_object(item) for item in items)
        fresh = {node.name: node for node in found if node is not None}
        if fresh != self._nodes or not self.nodes_synced.is_set():
            self._nodes = fresh
            self._announce("nodes")
        self.nodes_synced.set()

    def _apply_node(self, event: WatchEvent) -> bool:
        node = node_from_object(event.object)
        if node is None:
            return False
        if event.type == "DELETED":
            return self._nodes.pop(node.name, None) is not None
        if self._nodes.get(node.name) == node:
            return False  # heartbeats change status.conditions, not what we keep
        self._nodes[node.name] = node
        return True

    def _announce(self, kind: ChangeKind) -> None:
        self._view = None
        self.changed.set()
        if self._on_change is not None:
            self._on_change(kind)


class ClaimWatcher:
    """DRA ResourceClaims by list+watch into a `ClaimIndex` (aggregator.dra.claims), for
    the DRA plugins' claim requests; apart from ClusterWatcher because reconcile reads no
    claims and a cluster without resource.k8s.io/v1 must not disturb it."""

    def __init__(
        self, kube: KubeClient, index: ClaimIndex, settings: WatchSettings = WatchSettings()
    ) -> None:
        self._kube = kube
        self._settings = settings
        self.index = index
        self.synced = asyncio.Event()  # the first list arrived

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            task = group.create_task(self._sync(stop))
            await stop.wait()  # a watch blocks until the server ends it: cancel it
            task.cancel()

    async def _sync(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                listing = await self._kube.list_resource_claims()
                self.index.replace(listing.items)
                self.synced.set()
                async for event in self._kube.watch_resource_claims(listing.resource_version):
                    failures = 0
                    self.index.apply(event.type, event.object)
                failures = 0
            except KubeError as exc:
                failures += 1
                if failures == 1:
                    log.warning("watching ResourceClaims: %s; retrying", exc)
                delay = min(
                    self._settings.retry_s * 2 ** (failures - 1), self._settings.retry_max_s
                )
                if await _wait_or_stop(stop, delay):
                    return


def _warn_once(failed: set[str], key: str, message: str) -> None:
    if key not in failed:
        log.warning("%s; retrying", message)
    failed.add(key)


async def _wait_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` unless `stop` is set first; True when stopping."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
